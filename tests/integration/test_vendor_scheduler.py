"""Where users run it: a vendor's scheduler in the sandbox, the suite's deploy files, the suite as its
ServiceAccount.

One sandbox, brought up the way a scheduler vendor would (``gpuconf sandbox up`` with two
``--scheduler-command`` values and ``--manifests``), runs a scheduler that is not the reference one:
``tests/data/schedulers/toy_scheduler.py``, a small polling scheduler in another process that
knows the cluster only through the API, started twice (``gpuconf-toy``, and ``gpuconf-toy-greedy``
with its one flaw, overcommit). It refuses to start without its ToyQueue, a custom resource of a
CRD that ``--manifests`` applies, so its starting at all shows the order. Then:

- the workload controllers run: a Job runs to completion, a Deployment and a StatefulSet get their
  Pods Ready, each Pod placed by the toy through its owner;
- ``gpuconf run --scheduler-name gpuconf-toy`` (the sandbox path, reusing the running sandbox)
  judges the toy like any scheduler: it passes a subset of the scheduler profile, and the greedy
  one fails memory-fit;
- every manifest of ``conformance/deploy`` and ``enforcement/deploy`` passes a server-side dry run
  against the real API server, and the Sonobuoy plugin's container passes one as a Pod;
- the suite runs as the ``gpuconf-suite`` ServiceAccount with nothing but its ClusterRole (and
  the simulated-node one, since these GPU nodes are simulated): nothing is forbidden, it judges,
  and it leaves nothing behind; ``--dry-run`` with the same identity reads only;
- ``gpuconf sandbox down`` stops the commands with the rest.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from sandbox_args import RETRY

from fixtures.sandbox import processes
from fixtures.sandbox.controlplane import Ports, Sandbox, SandboxConfig
from fixtures.suite.waiting import wait_until

pytestmark = pytest.mark.sandbox

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "tests" / "data" / "schedulers" / "toy_scheduler.py"
STACK = ROOT / "tests" / "data" / "vendor-stack"
COMMANDS = (
    f"{sys.executable} {TOY} --kubeconfig {{kubeconfig}} --name gpuconf-toy --queue toy-system/default",
    f"{sys.executable} {TOY} --kubeconfig {{kubeconfig}} --name gpuconf-toy-greedy --greedy",
)
RUN_TIMEOUT_S = 600


def gpuconf(*argv: str, timeout: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    # The toy schedulers poll every 0.2 s: a run through --kubeconfig is told so (sandbox_args.py).
    told = [RETRY] if argv[:1] == ("run",) and "--kubeconfig" in argv else []
    return subprocess.run(
        [sys.executable, "-m", "conformance.cli", *argv, *told],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        cwd=ROOT,
    )


def sandbox_options(box: Sandbox) -> list[str]:
    p = box.config.ports
    out = ["--dir", str(box.dir), "--api-port", str(p.api), "--etcd-port", str(p.etcd)]
    out += ["--etcd-peer-port", str(p.etcd_peer), "--controller-manager-port", str(p.controller_manager)]
    out += ["--manifests", str(STACK)]
    for command in COMMANDS:
        out += ["--scheduler-command", command]
    return out


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    sandbox = Sandbox(
        SandboxConfig(
            state_dir=tmp_path_factory.mktemp("vendor") / "sb",
            ports=Ports.free(),
            node_runtime=True,
            scheduler_commands=COMMANDS,
            manifests=(str(STACK),),
        )
    )
    up = gpuconf("sandbox", "up", *sandbox_options(sandbox), timeout=300)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        yield sandbox
    finally:
        sandbox.down()


@pytest.fixture
def namespace(box: Sandbox) -> Iterator[str]:
    """A fresh namespace in this module's sandbox, deleted afterwards."""
    import uuid

    name = f"t-{uuid.uuid4().hex[:10]}"
    box.core_v1().create_namespace({"metadata": {"name": name}})
    yield name
    box.core_v1().delete_namespace(name)


def records(box: Sandbox) -> dict[str, processes.ProcessRecord]:
    state = json.loads(box.state_file.read_text())
    return {n: processes.ProcessRecord.from_json(r) for n, r in state["processes"].items()}


def outcomes(out: Path) -> dict[str, str]:
    run = out / "run.json"
    return {r["key"]: r["outcome"] for r in json.loads(run.read_text())["results"]} if run.exists() else {}


# ------------------------------------------------------------------------------- the vendor's path


def test_each_command_runs_as_a_component_with_its_own_kubeconfig(box: Sandbox) -> None:
    found = records(box)
    for n in (1, 2):
        rec = found[f"scheduler/command-{n}"]
        assert rec.alive()
        assert str(box.dir / f"scheduler-command-{n}.kubeconfig") in rec.argv, "the placeholder was filled"
        assert Path(rec.log) == box.dir / "logs" / f"scheduler_command-{n}.log"
    assert "serving schedulerName gpuconf-toy" in Path(found["scheduler/command-1"].log).read_text()
    status = gpuconf("sandbox", "status", *sandbox_options(box))
    assert status.returncode == 0 and "scheduler/command-2: running" in status.stdout, status.stdout


def test_manifests_were_applied_before_the_scheduler_started(box: Sandbox) -> None:
    from kubernetes import client

    api = box.api_client()
    crd = client.ApiextensionsV1Api(api).read_custom_resource_definition("toyqueues.toy.gpuconf.io")
    assert any(c.type == "Established" and c.status == "True" for c in crd.status.conditions)
    queue = client.CustomObjectsApi(api).get_namespaced_custom_object(
        "toy.gpuconf.io", "v1", "toy-system", "toyqueues", "default"
    )
    assert queue["spec"] == {"weight": 1}
    # The toy with --queue exits at once without its queue; it runs, so the queue came first.
    assert records(box)["scheduler/command-1"].alive()


def test_a_job_runs_to_completion_through_the_vendor_scheduler(box: Sandbox, namespace: str) -> None:
    from kubernetes import client

    batch = client.BatchV1Api(box.api_client())
    container = {"name": "main", "image": "gpuconf/workload:test", "command": ["python", "-c", "print('ok')"]}
    template = {"spec": {"schedulerName": "gpuconf-toy", "restartPolicy": "Never", "containers": [container]}}
    batch.create_namespaced_job(namespace, {"metadata": {"name": "once"}, "spec": {"template": template}})

    def succeeded() -> Any:
        job = batch.read_namespaced_job("once", namespace)
        return job if (job.status.succeeded or 0) >= 1 else None

    wait_until(succeeded, "the Job to succeed", 120)
    (pod,) = box.core_v1().list_namespaced_pod(namespace, label_selector="job-name=once").items
    assert pod.status.phase == "Succeeded"
    assert [o.kind for o in pod.metadata.owner_references] == ["Job"]
    assert pod.spec.scheduler_name == "gpuconf-toy" and pod.spec.node_name


def test_deployments_and_statefulsets_get_their_pods(box: Sandbox, namespace: str) -> None:
    from kubernetes import client

    apps = client.AppsV1Api(box.api_client())
    labels = {"app": "held"}
    pod_spec = {
        "schedulerName": "gpuconf-toy",
        "containers": [{"name": "main", "image": "gpuconf/workload:test", "command": ["sleep", "600"]}],
    }
    spec = {
        "selector": {"matchLabels": labels},
        "template": {"metadata": {"labels": labels}, "spec": pod_spec},
    }
    apps.create_namespaced_deployment(
        namespace, {"metadata": {"name": "web"}, "spec": {**spec, "replicas": 2}}
    )
    apps.create_namespaced_stateful_set(
        namespace,
        {
            "metadata": {"name": "db"},
            "spec": {
                "replicas": 1,
                "serviceName": "db",
                "selector": {"matchLabels": {"app": "db"}},
                "template": {"metadata": {"labels": {"app": "db"}}, "spec": pod_spec},
            },
        },
    )
    wait_until(
        lambda: (apps.read_namespaced_deployment("web", namespace).status.ready_replicas or 0) == 2,
        "the Deployment's 2 replicas to be Ready",
        120,
    )
    wait_until(
        lambda: (apps.read_namespaced_stateful_set("db", namespace).status.ready_replicas or 0) == 1,
        "the StatefulSet's replica to be Ready",
        120,
    )
    owners = {
        p.metadata.name: p.metadata.owner_references[0].kind
        for p in box.core_v1().list_namespaced_pod(namespace).items
    }
    assert sorted(owners.values()) == ["ReplicaSet", "ReplicaSet", "StatefulSet"], owners


TOY_CHECKS = (
    "annotations-at-bind",
    "limit-and-mode-at-bind",
    "portion-conversion",
    "memory-fit",
    "release-on-completion",
    "node-readiness",
)


def test_the_suite_judges_the_vendor_scheduler_like_any_other(box: Sandbox, tmp_path: Path) -> None:
    # The vendor's path: gpuconf run with the same sandbox options reuses the running sandbox.
    checks = [arg for check in TOY_CHECKS for arg in ("--check", check)]
    done = gpuconf(
        "run", *sandbox_options(box), "--scheduler-name", "gpuconf-toy", "--profile", "scheduler",
        "--report-dir", str(tmp_path), *checks,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert "sandbox reused" in output, output
    seen = outcomes(tmp_path)
    assert done.returncode == 0, output
    assert seen == {
        "scheduler/annotations-at-bind[gpu-memory]": "passed",
        "scheduler/annotations-at-bind[gpu-fraction]": "passed",
        "scheduler/annotations-at-bind[nvidia]": "passed",
        "scheduler/limit-and-mode-at-bind": "passed",
        "scheduler/portion-conversion": "passed",
        "scheduler/memory-fit": "passed",
        "scheduler/release-on-completion": "passed",
        "scheduler/node-readiness": "passed",
    }, output
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["options"]["schedulerName"] == "gpuconf-toy"
    assert records(box)["scheduler/command-1"].alive(), "the run restarted nothing"


def test_the_suite_catches_the_flawed_vendor_scheduler(box: Sandbox, tmp_path: Path) -> None:
    done = gpuconf(
        "run", "--kubeconfig", str(box.kubeconfig), "--scheduler-name", "gpuconf-toy-greedy",
        "--profile", "scheduler", "--report-dir", str(tmp_path), "--check", "memory-fit",
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert outcomes(tmp_path) == {"scheduler/memory-fit": "failed"}, output
    (result,) = json.loads((tmp_path / "run.json").read_text())["results"]
    assert result["party"] == "scheduler" and result["reason"], result


# ------------------------------------------------------------------------------- the deploy files


def manifests(folder: Path) -> list[dict[str, Any]]:
    docs: list[dict[str, Any]] = []
    for path in sorted(folder.glob("*.yaml")):
        if path.name in ("kustomization.yaml", "sonobuoy-plugin.yaml"):
            continue
        docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def server_side_dry_run(box: Sandbox, docs: list[dict[str, Any]]) -> list[str]:
    """Create each object with dryRun=All; the namespaces they live in are created for real first
    (a dry-run Namespace does not exist for the objects after it)."""
    from kubernetes.dynamic import DynamicClient
    from kubernetes.dynamic.exceptions import ConflictError

    dynamic = DynamicClient(box.api_client())
    core = box.core_v1()
    for doc in docs:
        namespace = (doc.get("metadata") or {}).get("namespace")
        if namespace and namespace not in {n.metadata.name for n in core.list_namespace().items}:
            core.create_namespace({"metadata": {"name": namespace}})
    accepted = []
    for doc in docs:
        resource = dynamic.resources.get(api_version=doc["apiVersion"], kind=doc["kind"])
        try:
            dynamic.create(resource, body=doc, namespace=doc["metadata"].get("namespace"), dry_run="All")
        except ConflictError:
            pass  # exists already (the namespace made above): the server validated it all the same
        accepted.append(f"{doc['kind']}/{doc['metadata']['name']}")
    return accepted


def test_every_deploy_manifest_passes_a_server_side_dry_run(box: Sandbox) -> None:
    suite = server_side_dry_run(box, manifests(ROOT / "conformance" / "deploy"))
    assert set(suite) == {
        "Namespace/gpuconf",
        "ServiceAccount/gpuconf-suite",
        "ClusterRole/gpuconf-suite",
        "ClusterRole/gpuconf-suite-simulated-nodes",
        "ClusterRoleBinding/gpuconf-suite",
        "Job/gpuconf-run",
    }
    agent = server_side_dry_run(box, manifests(ROOT / "enforcement" / "deploy"))
    assert "DaemonSet/gpuconf-node-agent" in agent
    # The Sonobuoy plugin's container, as the Pod Sonobuoy makes of it (with its results volume).
    plugin = yaml.safe_load((ROOT / "conformance" / "deploy" / "sonobuoy-plugin.yaml").read_text())
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "sonobuoy-gpuconf", "namespace": "gpuconf"},
        "spec": {
            "restartPolicy": "Never",
            "containers": [plugin["spec"]],
            "volumes": [{"name": "results", "emptyDir": {}}],
        },
    }
    assert server_side_dry_run(box, [pod]) == ["Pod/sonobuoy-gpuconf"]
    from kubernetes import client

    assert not client.BatchV1Api(box.api_client()).list_namespaced_job("gpuconf").items, (
        "a dry run creates nothing"
    )


def service_account_kubeconfig(box: Sandbox, path: Path) -> Path:
    """Apply the suite's ServiceAccount, ClusterRoles and binding for real; a kubeconfig with its token."""
    from kubernetes import client

    from enforcement import clusterrbac

    deploy = ROOT / "conformance" / "deploy"
    core, rbac = box.core_v1(), client.RbacAuthorizationV1Api(box.api_client())
    for name in ("namespace.yaml", "serviceaccount.yaml"):
        doc = yaml.safe_load((deploy / name).read_text())
        try:
            if doc["kind"] == "Namespace":
                core.create_namespace(doc)
            else:
                core.create_namespaced_service_account(doc["metadata"]["namespace"], doc)
        except client.ApiException as exc:
            if exc.status != 409:
                raise
    roles = [d for d in yaml.safe_load_all((deploy / "clusterrole.yaml").read_text()) if d]
    bindings = [yaml.safe_load((deploy / "clusterrolebinding.yaml").read_text())]
    # These GPU nodes are simulated: bind the simulated-node role too, as the README says to.
    simulated = json.loads(json.dumps(bindings[0]))
    simulated["metadata"]["name"] = simulated["roleRef"]["name"] = "gpuconf-suite-simulated-nodes"
    clusterrbac.apply(rbac, [*roles, *bindings, simulated])
    token = core.create_namespaced_service_account_token(
        "gpuconf-suite", "gpuconf", {"spec": {"expirationSeconds": 3600}}
    ).status.token
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "sb", "cluster": {"server": box.server, "certificate-authority": str(box.ca_file)}}
        ],
        "users": [{"name": "gpuconf-suite", "user": {"token": token}}],
        "contexts": [{"name": "sb", "context": {"cluster": "sb", "user": "gpuconf-suite"}}],
        "current-context": "sb",
    }
    path.write_text(yaml.safe_dump(config))
    return path


def test_the_suite_needs_no_more_than_its_clusterrole(box: Sandbox, tmp_path: Path) -> None:
    kubeconfig = service_account_kubeconfig(box, tmp_path / "suite.kubeconfig")
    report = tmp_path / "report"
    checks = ["--check", "annotations-at-bind", "--check", "memory-fit", "--check", "node-readiness"]
    done = gpuconf(
        "run", "--kubeconfig", str(kubeconfig), "--scheduler-name", "gpuconf-toy", "--profile", "scheduler",
        "--report-dir", str(report), *checks,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert "Forbidden" not in output and "forbidden" not in output, output
    assert done.returncode == 0, output
    assert set(outcomes(report).values()) == {"passed"} and len(outcomes(report)) == 5, output
    run_id = json.loads((report / "run.json").read_text())["runId"]
    left = box.core_v1().list_namespace(label_selector=f"gpuconf.io/run={run_id}").items
    assert not left, [n.metadata.name for n in left]
    from kubernetes import client

    def world() -> tuple[set[str], set[str], set[str]]:
        leases = client.CoordinationV1Api(box.api_client()).list_lease_for_all_namespaces().items
        return (
            {n.metadata.name for n in box.core_v1().list_namespace().items},
            {
                f"{p.metadata.namespace}/{p.metadata.name}"
                for p in box.core_v1().list_pod_for_all_namespaces().items
            },
            {
                f"{x.metadata.namespace}/{x.metadata.name}"
                for x in leases
                if x.metadata.namespace == "gpuconf-leases"
            },
        )

    before = world()
    dry = gpuconf("run", "--dry-run=json", "--kubeconfig", str(kubeconfig), "--scheduler-name", "gpuconf-toy")
    assert dry.returncode == 0, dry.stderr
    assert world() == before, "a dry run against a cluster only reads"
    plan = json.loads(dry.stdout)
    assert {n["name"] for n in plan["gpuNodes"]} >= {"gpu-a-0", "gpu-a-1"}
    assert plan["target"]["kind"] == "cluster"


# ------------------------------------------------------------------------------- shared clusters


def mig_node(name: str) -> dict[str, Any]:
    """A GPU node a fraction could go to, were its GPUs not MIG-partitioned."""
    from datetime import UTC, datetime

    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    labels = {
        "kubernetes.io/hostname": name,
        "nvidia.com/gpu.count": "4",
        "nvidia.com/gpu.memory": "143771",
        "nvidia.com/gpu.product": "NVIDIA-H200",
        "nvidia.com/mig.config": "all-1g.18gb",
        "gpuconf.io/simulated": "true",
    }
    status = {
        "capacity": {"cpu": "8", "memory": "64Gi", "pods": "110", "nvidia.com/mig-1g.18gb": "28"},
        "conditions": [
            {
                "type": t,
                "status": "True",
                "reason": "Test",
                "lastHeartbeatTime": now,
                "lastTransitionTime": now,
            }
            for t in ("Ready", "gpu-fractioning.nvidia.com/Ready")
        ],
    }
    return {"metadata": {"name": name, "labels": labels}, "status": status}


def test_mig_nodes_and_gpus_held_whole_are_left_out_and_said(box: Sandbox, tmp_path: Path) -> None:
    core = box.core_v1()
    core.create_node({"metadata": mig_node("gpu-mig-0")["metadata"]})
    core.patch_node("gpu-mig-0", {"spec": {"taints": []}})
    core.patch_node_status("gpu-mig-0", {"status": mig_node("gpu-mig-0")["status"]})
    core.create_namespace({"metadata": {"name": "training"}})
    whole = {
        "name": "main",
        "image": "gpuconf/workload:test",
        "command": ["sleep", "600"],
        "resources": {"limits": {"nvidia.com/gpu": "1"}},
    }
    core.create_namespaced_pod(
        "training", {"metadata": {"name": "trainer"}, "spec": {"nodeName": "gpu-a-0", "containers": [whole]}}
    )
    try:
        done = gpuconf(
            "run", "--kubeconfig", str(box.kubeconfig), "--scheduler-name", "gpuconf-toy",
            "--profile", "scheduler", "--report-dir", str(tmp_path),
            "--check", "memory-fit", "--check", "annotations-at-bind",
        )  # fmt: skip
        output = done.stdout + done.stderr
        assert done.returncode == 0, output
        run = json.loads((tmp_path / "run.json").read_text())
        left = {e["node"]: e for e in run["preflight"]["leftOut"]}
        assert left["gpu-mig-0"]["excluded"] == "all" and "MIG-partitioned" in left["gpu-mig-0"]["reason"]
        assert left["gpu-a-0"]["excluded"] == "idle" and "training/trainer (1)" in left["gpu-a-0"]["reason"]
        for result in run["results"]:
            leased = json.dumps(result["evidence"]["facts"]["nodes"])
            assert "gpu-a-1" in leased and "gpu-a-0" not in leased and "gpu-mig" not in leased, result
        html = (tmp_path / "report.html").read_text()
        assert "Node gpu-mig-0" in html and "left out of checks needing idle GPUs" in html
        assert "gpu-mig-0 left out: MIG-partitioned" in output, "preflight says it as it runs"
    finally:
        core.delete_namespace("training", grace_period_seconds=0)
        core.delete_node("gpu-mig-0")


# ------------------------------------------------------------------------------- down


def test_down_stops_the_commands_with_the_rest(box: Sandbox) -> None:
    commands = [rec for name, rec in records(box).items() if name.startswith("scheduler/command-")]
    assert len(commands) == 2
    done = gpuconf("sandbox", "down", *sandbox_options(box), timeout=120)
    assert done.returncode == 0, done.stderr
    assert "scheduler/command-1" in done.stdout
    assert not any(rec.alive() for rec in commands)
    assert not box.dir.exists(), "down leaves nothing of the sandbox, the commands' folders included"


def test_a_command_that_exits_at_once_fails_up_with_its_log(tmp_path: Path) -> None:
    from fixtures.sandbox.errors import SandboxError

    failing = f"{sys.executable} -c \"import sys; print('unknown flag --frobnicate'); sys.exit(3)\""
    box = Sandbox(SandboxConfig(state_dir=tmp_path / "sb", ports=Ports.free(), scheduler_commands=(failing,)))
    try:
        with pytest.raises(SandboxError, match="scheduler/command-1 exited") as caught:
            box.up(log=print)
        assert "unknown flag --frobnicate" in str(caught.value), "the error shows the end of its log"
        assert not any(rec.alive() for rec in records(box).values()), "a failed up leaves nothing running"
    finally:
        box.down()

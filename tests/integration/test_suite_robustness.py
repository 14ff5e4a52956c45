"""Robustness: the suite, the node agent, the scheduler and the simulated kubelet when things go wrong.

One sandbox of this module's own (free ports; the reference scheduler; per node the simulated
device, the reference agent and the simulated kubelet). ``gpuconf run --kubeconfig`` is started
against it as a user would start it, with a few quick checks (``--check``), and then:

- **kube-apiserver killed** (SIGKILL) and started again while a check is in flight: the checks in
  flight end as *errors* saying the API server did not answer (never failures, never a hang past
  their timeouts), the next checks wait for the API server and pass, and the scheduler, the
  agents and the kubelets are back: a fractional Pod through the scheduler on each node runs and
  its limit holds;
- **the node agents and the scheduler killed** and started again mid-run: the run passes, and
  workloads that were running all along keep their limits (an allocation past the limit, made
  after the restarts, fails with out-of-memory);
- **SIGINT** mid-run, serially and with two workers: exit 130, no Pod, namespace or Lease of the
  run is left (counted through the API), and ``run.json`` is written and says ``interrupted``;
- **hostile Pods** beside a run (malformed annotations, self-assigned devices, a container that
  ignores SIGTERM and never exits, containers flooding stdout, hundreds of Pods at once): the
  agents, the kubelets and the suite neither stall nor crash (same pids, the run passes), a log
  stays capped, and resident memory stays within a generous bound (figures printed);
- **RBAC**: the node and stack checks run as a user holding nothing but the suite's ClusterRoles
  (``conformance/deploy/clusterrole.yaml``), with a client certificate from the sandbox's CA:
  nothing is forbidden and nothing is left. ``test_vendor_scheduler.py`` runs the scheduler profile
  the same way as the ``gpuconf-suite`` ServiceAccount; this covers the rest.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml
from sandbox_args import RETRY, interruptible

from enforcement.contract import SM_SHARING, TIME_SLICING, Mode
from fixtures.sandbox import processes
from fixtures.sandbox.controlplane import Ports, Sandbox, SandboxConfig
from fixtures.sandbox.noderuntime.containers import LOG_MAX_BYTES, container_processes
from fixtures.suite import manifests
from fixtures.suite.cluster import Cluster
from fixtures.suite.manifests import placement_annotations
from fixtures.suite.waiting import wait_until

pytestmark = pytest.mark.sandbox

ROOT = Path(__file__).resolve().parents[2]
SCHEDULER = "gpuconf-reference"
NODES = ("gpu-a-0", "gpu-a-1")
RUN_TIMEOUT_S = 300
MIB = 1 << 20
MANY = 200
"""Hostile Pods created at once (half through the scheduler, half placed), beside the odd ones."""
RSS_GROWTH_BOUND_MIB = 150.0
"""How much an agent's or a kubelet's resident memory may grow under the hostile Pods (it holds one
worker thread and a little state per Pod; measured growth is printed)."""


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    sandbox = Sandbox(
        SandboxConfig(
            state_dir=tmp_path_factory.mktemp("robust") / "sb",
            ports=Ports.free(),
            schedulers=("reference",),
            node_runtime=True,
        )
    )
    sandbox.up(log=print)
    try:
        yield sandbox
    finally:
        sandbox.down()


@pytest.fixture(scope="module")
def cluster(box: Sandbox) -> Cluster:
    return Cluster(box.kubeconfig)


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    name = f"robust-{uuid.uuid4().hex[:6]}"
    cluster.core.create_namespace({"metadata": {"name": name}})
    yield name
    cluster.core.delete_namespace(name, grace_period_seconds=0)


# ------------------------------------------------------------------------------- helpers


def start_run(
    kubeconfig: Path, out: Path, run_id: str, *args: str, new_session: bool = False
) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "conformance.cli", "run", "--kubeconfig", str(kubeconfig), RETRY]
    argv += ["--scheduler-name", SCHEDULER, "--report-dir", str(out), *args, "--", "--run-id", run_id]
    return subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        start_new_session=new_session,
        preexec_fn=interruptible,  # noqa: PLW1509 - one signal call, nothing else runs there
    )


def finish(proc: subprocess.Popen[str], timeout: float = RUN_TIMEOUT_S) -> tuple[int, str]:
    try:
        output, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, output


def new_run_id(what: str) -> str:
    return f"{what}-{uuid.uuid4().hex[:6]}"


def poll_during_run(proc: subprocess.Popen[str], done: Callable[[], bool], what: str) -> None:
    """Until ``done()``, looking every 50 ms (what the check does next is timed from here); an
    error when the run ends first or there is still no ``what`` after 120 s."""
    deadline = time.monotonic() + 120
    while not done():
        if proc.poll() is not None:
            raise AssertionError(f"the run ended early ({proc.returncode}): {proc.communicate()[0]}")
        assert time.monotonic() < deadline, f"no {what} in 120 s"
        time.sleep(0.05)


def wait_for_check_pods(cluster: Cluster, run_id: str, proc: subprocess.Popen[str]) -> None:
    """Until a check of the run has Pods (it is in the middle of its work)."""
    selector = f"gpuconf.io/run={run_id},gpuconf.io/check"
    poll_during_run(
        proc, lambda: bool(cluster.pods(label_selector=selector)), f"Pods of a check of run {run_id}"
    )


def wait_for_first_pods_placed(cluster: Cluster, run_id: str, proc: subprocess.Popen[str]) -> None:
    """Until release-on-completion has all its first Pods (one per GPU of its node) bound and one
    of them still Running. From then on the check only reads those Pods through the API until the
    kubelet reports them ended, which it cannot do while the API server is away: an outage now is
    met by a read. One Pod Running is not enough: the check may still be waiting on its watch for a
    later Pod's binding, and a watch rides out the outage (the check then rightly passes)."""
    selector = f"gpuconf.io/run={run_id},gpuconf.io/check=release-on-completion"
    gpus = {n.name: n.gpu_count for n in cluster.gpu_nodes()}

    def placed() -> bool:
        pods = cluster.pods(label_selector=selector)
        nodes = {p["spec"].get("nodeName") for p in pods}
        if len(nodes) != 1:
            return False
        (node,) = nodes
        return (
            node is not None
            and len(pods) == gpus.get(node)
            and any(p["status"].get("phase") == "Running" for p in pods)
        )

    poll_during_run(proc, placed, f"placement of release-on-completion's first Pods (run {run_id})")


def results(out: Path) -> dict[str, dict[str, Any]]:
    run = out / "run.json"
    return {r["key"]: r for r in json.loads(run.read_text())["results"]} if run.exists() else {}


def left_by(box: Sandbox, run_id: str) -> dict[str, list[str]]:
    """What of run ``run_id`` is still there, counted through the API."""
    from kubernetes import client

    selector = f"gpuconf.io/run={run_id}"
    core = box.core_v1()
    leases = client.CoordinationV1Api(box.api_client()).list_lease_for_all_namespaces(label_selector=selector)
    return {
        "namespaces": [n.metadata.name for n in core.list_namespace(label_selector=selector).items],
        "pods": [p.metadata.name for p in core.list_pod_for_all_namespaces(label_selector=selector).items],
        "leases": [lease.metadata.name for lease in leases.items],
    }


def records(box: Sandbox) -> dict[str, processes.ProcessRecord]:
    state = json.loads(box.state_file.read_text())
    return {n: processes.ProcessRecord.from_json(r) for n, r in state["processes"].items()}


def rss_mib(pid: int) -> float:
    """The process's resident memory; ProcessLookupError once it has ended (an exited process not yet
    reaped keeps its status file, without a VmRSS line: a run sampled as it exits looked like that)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise ProcessLookupError(f"pid {pid} has ended (no VmRSS in its status)")


def node_memory_mib(cluster: Cluster, node: str) -> int:
    found = {n.name: n for n in cluster.gpu_nodes()}
    return found[node].memory_mib


def fenced_plan(request: int, limit: int, signal_name: str = "SIGUSR1") -> dict[str, Any]:
    """Hold ``request`` MiB until ``signal_name``; then an allocation past ``limit`` must fail with
    out-of-memory and the room below it must be there (exit 10, status expected-oom)."""
    return {
        "name": "fenced",
        "steps": [
            {"op": "alloc", "bytes": request * MIB},
            {"op": "ready"},
            {"op": "heartbeat", "interval": 0.2, "until_signal": signal_name},
            {"op": "alloc", "bytes": (limit - request + 1) * MIB, "expect": "oom"},
            {"op": "alloc", "bytes": (limit - request) * MIB},
        ],
    }


def workload_result(pod: dict[str, Any]) -> dict[str, Any]:
    from fixtures.suite.frame import termination_result

    return termination_result(pod, "main") or {}


def finished(cluster: Cluster, namespace: str, name: str, timeout: float = 90) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        pod = cluster.read_pod(namespace, name)
        return pod if pod and pod["status"].get("phase") in ("Succeeded", "Failed") else None

    return wait_until(done, f"{namespace}/{name} to finish", timeout)


def signal_container(box: Sandbox, cluster: Cluster, namespace: str, name: str, sig: int) -> None:
    """Signal the (simulated) container of a running Pod: its process, found by its container id."""
    pod = cluster.read_pod(namespace, name) or {}
    statuses = pod.get("status", {}).get("containerStatuses") or []
    cid = str(statuses[0].get("containerID", "")).split("://", 1)[-1] if statuses else ""
    pids = [pid for pid, found in container_processes([cid], under=box.dir).items() if found == cid]
    assert pids, f"no process for container {cid!r} of {namespace}/{name}"
    for pid in pids:
        os.kill(pid, sig)


# ------------------------------------------------------------------------------- kube-apiserver


def test_api_server_killed_mid_run_errors_in_flight_and_later_checks_pass(
    box: Sandbox, cluster: Cluster, tmp_path: Path
) -> None:
    run_id = new_run_id("apikill")
    checks = ["release-on-completion", "soft-limit-eviction", "hard-limit-oom", "burst-borrowing"]
    started = time.monotonic()
    proc = start_run(box.kubeconfig, tmp_path, run_id, *[a for c in checks for a in ("--check", c)])
    try:
        # release-on-completion's first Pods run half a second and the check reads them until they
        # end: the API server goes away while it does, so the check's next read finds it gone (the
        # kubelet cannot report the end meanwhile). Any check's Pods would not do: a check waiting on
        # its watch alone (a hold, an unbound window) rides out a short outage and rightly passes.
        wait_for_first_pods_placed(cluster, run_id, proc)
        before = box.recorded_argv("kube-apiserver")
        box.restart_component("kube-apiserver", log=print, kill=True, down_s=3.0)
        assert box.recorded_argv("kube-apiserver") == before, "it came back as it was"
    finally:
        rc, output = finish(proc)
    took = time.monotonic() - started
    found = results(tmp_path)
    assert found, f"no run.json after the restart:\n{output}"
    errors = {k: r for k, r in found.items() if r["outcome"] == "error"}
    assert not [k for k, r in found.items() if r["outcome"] not in ("passed", "error")], output
    assert errors, f"no check was in flight when the API server went away:\n{output}"
    for key, result in errors.items():
        # Clear: the reason says the API server did not answer (not urllib3's pool and retry count).
        assert "the API server" in result["reason"] and "did not answer" in result["reason"], (key, result)
        assert "MaxRetryError" not in result["reason"] and "HTTPSConnectionPool" not in result["reason"]
        assert result["duration_s"] < 30, f"{key} waited past the outage: {result['duration_s']} s"
    later = [k for k, r in found.items() if r["outcome"] == "passed"]
    assert len(later) >= 4, f"the checks after the restart must pass:\n{output}"
    assert rc == 3, f"a MUST check not judged, none failed: exit 3\n{output}"
    assert took < 180, f"the run took {took:.0f} s: something waited far past the outage"
    assert left_by(box, run_id) == {"namespaces": [], "pods": [], "leases": []}, output

    # The scheduler, the agents and the kubelets came back: a fractional Pod through the scheduler
    # runs on each node and its limit holds.
    namespace = f"robust-after-{uuid.uuid4().hex[:4]}"
    cluster.core.create_namespace({"metadata": {"name": namespace}})
    try:
        for node in NODES:
            memory = node_memory_mib(cluster, node)
            request, limit = memory // 8, memory // 5
            plan = {
                "name": "after",
                "steps": [
                    {"op": "alloc", "bytes": request * MIB},
                    {"op": "alloc", "bytes": (limit - request + 1) * MIB, "expect": "oom"},
                ],
            }
            body = manifests.pod(
                f"after-{node}",
                [manifests.container("main", plan=plan)],
                annotations={"gpu-memory": str(request), "gpu-memory.limit": f"{limit}Mi"},
                scheduler=SCHEDULER,
                node_selector={manifests.HOSTNAME_LABEL: node},
            )
            cluster.create_pod(namespace, body)
        for node in NODES:
            pod = finished(cluster, namespace, f"after-{node}")
            assert pod["spec"]["nodeName"] == node
            assert workload_result(pod).get("status") == "expected-oom", pod["status"]
    finally:
        cluster.core.delete_namespace(namespace, grace_period_seconds=0)


# ------------------------------------------------------------------------------- agent and scheduler


def test_agents_and_scheduler_restarted_mid_run_keep_every_fence(
    box: Sandbox, cluster: Cluster, namespace: str, tmp_path: Path
) -> None:
    # Workloads running all along on gpu-a-1 (the run judges gpu-a-0), one per compute mode.
    memory = node_memory_mib(cluster, "gpu-a-1")
    request, limit = memory // 4, memory * 35 // 100
    fenced = {}
    modes: tuple[tuple[str, Mode], ...] = (("0", TIME_SLICING), ("1", SM_SHARING))
    for gpu, mode in modes:
        name = f"fenced-{gpu}"
        body = manifests.pod(
            name,
            [manifests.container("main", plan=fenced_plan(request, limit))],
            annotations=placement_annotations("main", request, limit, (gpu,), mode=mode),
            node_name="gpu-a-1",
        )
        cluster.create_pod(namespace, body)
        fenced[name] = mode
    for name in fenced:
        wait_until(
            lambda n=name: (cluster.read_pod(namespace, n) or {}).get("status", {}).get("phase") == "Running",
            f"{name} to run",
            60,
        )
    before = {n: r.pid for n, r in records(box).items()}

    run_id = new_run_id("restarts")
    checks = ["soft-limit-eviction", "hard-limit-oom", "guarantee-kept", "memory-fit"]
    args = [a for c in checks for a in ("--check", c)]
    proc = start_run(
        box.kubeconfig, tmp_path, run_id, *args, "--gpu-node-selector", "kubernetes.io/hostname=gpu-a-0"
    )
    try:
        wait_for_check_pods(cluster, run_id, proc)
        for component in ("agent/gpu-a-0", f"scheduler/{SCHEDULER}", "agent/gpu-a-1"):
            box.restart_component(component, log=print, kill=True)
            time.sleep(1.0)
    finally:
        rc, output = finish(proc)
    after = {n: r.pid for n, r in records(box).items()}
    for component in ("agent/gpu-a-0", f"scheduler/{SCHEDULER}", "agent/gpu-a-1"):
        assert after[component] != before[component], f"{component} was not restarted"
    found = results(tmp_path)
    assert rc == 0 and found and {r["outcome"] for r in found.values()} == {"passed"}, output

    # The running workloads kept their limits through both agents' restarts.
    for name in fenced:
        signal_container(box, cluster, namespace, name, signal.SIGUSR1)
    for name, mode in fenced.items():
        pod = finished(cluster, namespace, name)
        result = workload_result(pod)
        assert result.get("status") == "expected-oom", (
            f"{name} ({mode}) could allocate past its limit of {limit} MiB after the restarts: {result}"
        )


# ------------------------------------------------------------------------------- SIGINT


@pytest.mark.parametrize("workers", [1, 2], ids=["serial", "two-workers"])
def test_sigint_mid_run_leaves_nothing_and_writes_an_interrupted_report(
    box: Sandbox, cluster: Cluster, tmp_path: Path, workers: int
) -> None:
    run_id = new_run_id("sigint")
    checks = ["hard-limit-oom", "soft-limit-eviction", "agent-restart", "memory-fit"]
    args = [a for c in checks for a in ("--check", c)] + ["-n", str(workers)]
    proc = start_run(box.kubeconfig, tmp_path, run_id, *args)
    try:
        wait_for_check_pods(cluster, run_id, proc)
        proc.send_signal(signal.SIGINT)  # to the run alone: its workers learn it from the run
        rc, output = finish(proc, timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == 130, output
    assert left_by(box, run_id) == {"namespaces": [], "pods": [], "leases": []}, output
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["interrupted"] is True and run["runId"] == run_id, output
    assert (tmp_path / "junit.xml").exists()
    assert all(r["outcome"] in ("passed", "error") for r in run["results"]), run["results"]
    interrupted = [r for r in run["results"] if r["reason"] == "the run was interrupted while this check ran"]
    assert interrupted, "the check in flight when the run stopped is listed, as an error"


# ------------------------------------------------------------------------------- hostile Pods


MALFORMED: list[dict[str, str]] = [
    {"nvidia.com/container.main.gpu-memory.request": "lots"},
    {
        "nvidia.com/container.main.gpu-memory.request": "-5Mi",
        "nvidia.com/container.main.gpu-memory.limit": "1Mi",
    },
    {
        "nvidia.com/container.main.gpu-memory.request": "1Gi",
        "nvidia.com/container.main.gpu-compute.mode": "warp",
    },
    {
        "nvidia.com/container.main.gpu-memory.request": "1Gi",
        "nvidia.com/container.main.gpus.devices": "zzz,,,",
    },
    {"nvidia.com/container.main.gpu-memory.request": "9" * 300 + "Mi"},
]
"""Annotations a correct scheduler never writes (each with devices ``0`` unless it names its own)."""


def hostile_pods(memory: int) -> list[dict[str, Any]]:
    """Pods nobody should write, for gpu-a-1: each must be refused or run without harm."""
    key = "nvidia.com/container.main."
    ghost = "nvidia.com/container.ghost."
    on: dict[str, Any] = {"node_name": "gpu-a-1"}
    out = [
        manifests.pod(f"malformed-{i}", annotations={key + "gpus.devices": "0", **annotations}, **on)
        for i, annotations in enumerate(MALFORMED)
    ]
    # Annotations for a container the Pod does not have, and a huge annotation beside valid ones:
    # nothing to refuse, they run.
    out.append(
        manifests.pod(
            "ghost", annotations={ghost + "gpu-memory.request": "1Gi", ghost + "gpus.devices": "0"}, **on
        )
    )
    huge = {key + "gpu-memory.request": "1000Mi", key + "gpus.devices": "0", "filler": "x" * 200_000}
    out.append(manifests.pod("huge-annotation", annotations=huge, **on))
    # Devices the Pod's author assigned itself: through the scheduler (which must decide them), and
    # placed directly with GPUs the node does not have.
    out.append(
        manifests.pod(
            "self-assigned",
            annotations={"gpu-memory": "1000", key + "gpus.devices": "0,1,2,3"},
            scheduler=SCHEDULER,
            node_selector={manifests.HOSTNAME_LABEL: "gpu-a-1"},
        )
    )
    out.append(
        manifests.pod(
            "not-on-node",
            annotations={key + "gpu-memory.request": "1000Mi", key + "gpus.devices": "7,99"},
            **on,
        )
    )
    sh = lambda name, script: manifests.container(name, command=("sh", "-c", script))  # noqa: E731
    out.append(
        manifests.pod(
            "immortal", [sh("main", "trap '' TERM; while :; do sleep 1; done")], grace_seconds=1, **on
        )
    )
    burst = sh("main", "head -c 50000000 /dev/zero | tr '\\0' x; exit 1")
    burst["terminationMessagePolicy"] = "FallbackToLogsOnError"
    out.append(manifests.pod("flood-burst", [burst], **on))
    flood = "while :; do head -c 1000000 /dev/zero | tr '\\0' y; echo; sleep 0.05; done"
    out.append(manifests.pod("flood", [sh("main", flood)], grace_seconds=1, **on))
    # Hundreds at once: fractions through the scheduler, and plain Pods placed directly.
    for i in range(MANY):
        if i % 2:
            out.append(
                manifests.pod(
                    f"many-{i}",
                    annotations={"gpu-memory": str(memory // 400)},
                    scheduler=SCHEDULER,
                    node_selector={manifests.HOSTNAME_LABEL: "gpu-a-1"},
                    grace_seconds=1,
                )
            )
        else:
            out.append(manifests.pod(f"many-{i}", grace_seconds=1, **on))
    return out


def namespace_gone(cluster: Cluster, name: str) -> bool:
    from kubernetes.client.rest import ApiException

    try:
        cluster.core.read_namespace(name)
    except ApiException as exc:
        if exc.status == 404:
            return True
        raise
    return False


def waiting_reason(pod: dict[str, Any]) -> tuple[str, str]:
    for cs in pod.get("status", {}).get("containerStatuses") or []:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting:
            return str(waiting.get("reason", "")), str(waiting.get("message", ""))
    return "", ""


def test_hostile_pods_beside_a_run_neither_stall_nor_crash_anything(
    box: Sandbox, cluster: Cluster, tmp_path: Path
) -> None:
    watched = [f"{kind}/{node}" for node in NODES for kind in ("agent", "runtime")] + [
        f"scheduler/{SCHEDULER}"
    ]
    pids = {name: records(box)[name].pid for name in watched}
    before = {name: rss_mib(pid) for name, pid in pids.items()}
    peak = dict(before)
    sampling = threading.Event()

    def sample() -> None:
        while not sampling.wait(0.5):
            for name, pid in pids.items():
                try:
                    peak[name] = max(peak[name], rss_mib(pid))
                except OSError:
                    pass

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    namespace = f"hostile-{uuid.uuid4().hex[:4]}"
    cluster.core.create_namespace({"metadata": {"name": namespace}})
    deleted = False
    try:
        memory = node_memory_mib(cluster, "gpu-a-1")
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda body: cluster.create_pod(namespace, body), hostile_pods(memory)))

        # A run beside them, on the other node (theirs is not idle): it must pass.
        run_id = new_run_id("beside")
        checks = ["hard-limit-oom", "soft-limit-eviction", "memory-fit"]
        args = [a for c in checks for a in ("--check", c)]
        proc = start_run(
            box.kubeconfig, tmp_path, run_id, *args, "--gpu-node-selector", "kubernetes.io/hostname=gpu-a-0"
        )
        suite_peak = 0.0
        while proc.poll() is None:
            try:
                suite_peak = max(suite_peak, rss_mib(proc.pid))
            except OSError:
                break
            time.sleep(0.5)
        rc, output = finish(proc)
        assert rc == 0 and {r["outcome"] for r in results(tmp_path).values()} == {"passed"}, output

        pods = {p["metadata"]["name"]: p for p in cluster.pods(namespace)}
        for i in range(len(MALFORMED)):  # each refused by the agent, saying why, never started
            reason, message = waiting_reason(pods[f"malformed-{i}"])
            assert reason == "CreateContainerConfigError" and "malformed" in message, pods[f"malformed-{i}"]
        assert waiting_reason(pods["not-on-node"])[0] == "CreateContainerConfigError"
        for name in ("ghost", "huge-annotation", "self-assigned", "immortal", "flood"):
            assert pods[name]["status"].get("phase") == "Running", pods[name]["status"]
        assert pods["flood-burst"]["status"]["phase"] == "Failed"
        running = sum(1 for p in pods.values() if p["status"].get("phase") == "Running")
        assert running >= MANY, f"only {running} Pods run"
        flood_log = Path(
            pods["flood"]["metadata"]["annotations"]["sandbox.gpuconf.io/log-dir"], "main", "0.log"
        )
        # Cut back once past LOG_MAX_BYTES, checked every second: it may overshoot by a second's flood.
        flood_size = flood_log.stat().st_size
        kubelet_log = Path(records(box)["runtime/gpu-a-1"].log).read_text(errors="replace")
        assert f"cut back the log {flood_log}" in kubelet_log
        assert flood_size < 4 * LOG_MAX_BYTES, f"the flooding container's log holds {flood_size} bytes"

        started = time.monotonic()
        cluster.core.delete_namespace(namespace, grace_period_seconds=0)
        deleted = True
        wait_until(lambda: namespace_gone(cluster, namespace), f"namespace {namespace} to go", 120)
        gone_s = time.monotonic() - started
    finally:
        sampling.set()
        sampler.join()
        if not deleted:
            cluster.core.delete_namespace(namespace, grace_period_seconds=0)
    time.sleep(3)
    after = {name: rss_mib(pid) for name, pid in pids.items()}
    assert {name: records(box)[name].pid for name in watched} == pids, "nothing crashed or restarted"
    figures = {
        name: {"before": round(before[name], 1), "peak": round(peak[name], 1), "after": round(after[name], 1)}
        for name in watched
    }
    print(
        json.dumps(
            {"rss_mib": figures, "suite_peak_rss_mib": round(suite_peak, 1), "cleanup_s": round(gone_s, 1)}
        )
    )
    for name in watched:
        assert peak[name] - before[name] < RSS_GROWTH_BOUND_MIB, (name, figures[name])
    assert suite_peak < 500, f"the run's own process grew to {suite_peak:.0f} MiB"


# ------------------------------------------------------------------------------- RBAC


def bind_suite_roles(box: Sandbox, user: str) -> None:
    """The suite's ClusterRoles from conformance/deploy, bound to ``user`` (and nothing else)."""
    from kubernetes import client

    from enforcement import clusterrbac

    roles = [d for d in yaml.safe_load_all((ROOT / "conformance/deploy/clusterrole.yaml").read_text()) if d]
    bindings = [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": f"{role['metadata']['name']}-{user}"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": role["metadata"]["name"],
            },
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        }
        for role in roles
    ]
    clusterrbac.apply(client.RbacAuthorizationV1Api(box.api_client()), [*roles, *bindings])


def test_node_and_stack_checks_need_no_more_than_the_suite_clusterrole(
    box: Sandbox, cluster: Cluster, tmp_path: Path
) -> None:
    user = f"gpuconf-suite-{uuid.uuid4().hex[:4]}"
    bind_suite_roles(box, user)
    kubeconfig = box.issue_kubeconfig(user, user)  # a client certificate, in no group
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    with pytest.raises(ApiException) as refused:  # not an admin: it may not even read Secrets
        client.CoreV1Api(Cluster(kubeconfig).api).list_secret_for_all_namespaces()
    assert refused.value.status == 403
    run_id = new_run_id("rbac")
    checks = ["hard-limit-oom", "soft-limit-eviction", "agent-restart", "node-readiness", "memory-fit"]
    proc = start_run(kubeconfig, tmp_path, run_id, *[a for c in checks for a in ("--check", c)])
    rc, output = finish(proc)
    assert "forbidden" not in output.lower(), output
    found = results(tmp_path)
    assert rc == 0 and {r["outcome"] for r in found.values()} == {"passed"}, output
    assert {r["profile"] for r in found.values()} == {"node", "stack", "scheduler"}
    assert left_by(box, run_id) == {"namespaces": [], "pods": [], "leases": []}, output

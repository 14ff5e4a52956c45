"""The simulated kubelet on a real API server: Pods bound to ``gpu-a-0`` run, stop and report honestly.

The runtime runs as its own process (``python -m fixtures.sandbox.noderuntime``) with its own RBAC-limited
identity, against the shared session sandbox, which runs no runtime of its own. The node agent is
a FAKE served by this test process (``enforcement.hook.HookServer``): it allows, refuses, injects
environment or attaches the container to a real simulated device server, as each Pod's
``test.gpuconf.io/*`` annotations ask, and it records every hook call. So these tests depend on
the hook's contract, not on the reference agent.

The fake agent refuses any Pod without the ``test.gpuconf.io/noderuntime`` label, so a Pod left
bound to ``gpu-a-0`` by another test module never runs a command here.
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
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from enforcement.hook import REASON_CONFIG_ERROR, Adjustment, ContainerRef, HookServer, RunningContainer
from enforcement.sim import SIM_SOCKET_ENV, SIM_TOKEN_ENV, SMI_BIN_DIR
from enforcement.sim.admin import AdminClient, client_spec
from enforcement.sim.process import ServerProcess
from enforcement.sim.testing import short_tempdir
from fixtures.sandbox.controlplane import Sandbox
from fixtures.sandbox.noderuntime import ANNOTATION_LOG_DIR, CONTAINER_ID_SCHEME, rbac
from fixtures.sandbox.noderuntime.containers import container_processes
from fixtures.sandbox.noderuntime.layout import ready_file
from fixtures.sandbox.topology import gpu_uuid
from fixtures.suite import manifests
from fixtures.suite.waiting import wait_until
from workloads.report import ExitCode

pytestmark = pytest.mark.sandbox

NODE = "gpu-a-0"
TEST_LABEL = "test.gpuconf.io/noderuntime"
A_MODE = "test.gpuconf.io/agent"  # allow (default) | refuse
A_MESSAGE = "test.gpuconf.io/message"
A_ENV = "test.gpuconf.io/env"  # JSON object: the agent's Adjustment.env
A_GPU_LIMIT = "test.gpuconf.io/gpu-limit-mib"  # attach to the simulated GPU 0 with this hard limit
TIMEOUT_S = 90.0  # generous: a loaded 2-core runner starts Python processes slowly
PY = sys.executable


# ---- helpers -------------------------------------------------------------------------------------


def read_pod(core: Any, namespace: str, name: str) -> dict[str, Any] | None:
    try:
        return json.loads(core.read_namespaced_pod(name, namespace, _preload_content=False).data)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def pod_in_phase(core: Any, namespace: str, name: str, *phases: str) -> dict[str, Any]:
    def probe() -> dict[str, Any] | None:
        pod = read_pod(core, namespace, name)
        return pod if pod and pod.get("status", {}).get("phase") in phases else None

    def status() -> str:
        return f"status: {json.dumps((read_pod(core, namespace, name) or {}).get('status'))}"

    return wait_until(probe, f"{namespace}/{name} to reach {'/'.join(phases)}", TIMEOUT_S, describe=status)


def container_status(pod: Mapping[str, Any], name: str = "main") -> dict[str, Any]:
    return next(c for c in pod["status"]["containerStatuses"] if c["name"] == name)


def waiting_reason(core: Any, namespace: str, name: str, container: str = "main") -> tuple[str, str] | None:
    pod = read_pod(core, namespace, name)
    for cs in (pod or {}).get("status", {}).get("containerStatuses") or ():
        if cs["name"] == container and "waiting" in cs["state"]:
            return cs["state"]["waiting"].get("reason", ""), cs["state"]["waiting"].get("message", "")
    return None


def gone(core: Any, namespace: str, name: str) -> bool:
    return read_pod(core, namespace, name) is None


def make_pod(
    name: str,
    command: list[str],
    *,
    annotations: Mapping[str, str] | None = None,
    restart: str = "Never",
    env: list[dict[str, Any]] | None = None,
    container: Mapping[str, Any] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    main = manifests.container("main", image="gpuconf/sim-test:1", command=command)
    if env:
        main["env"] = env  # as written, valueFrom included
    main.update(container or {})
    return manifests.pod(
        name,
        [main],
        annotations=annotations,
        labels={TEST_LABEL: "true"},
        node_name=NODE,
        restart_policy=restart,
        spec=spec,
    )


def events_for(core: Any, namespace: str, pod: str) -> list[dict[str, Any]]:
    data = json.loads(core.list_namespaced_event(namespace, _preload_content=False).data)
    return [e for e in data["items"] if e["involvedObject"].get("name") == pod]


# ---- the fake agent ------------------------------------------------------------------------------


class FakeAgent:
    """A hook handler steered by Pod annotations; records every call."""

    def __init__(self, socket_path: Path, device: ServerProcess) -> None:
        self.socket_path = socket_path
        self.device = device
        self.calls: list[tuple[str, Any]] = []
        self._lock = threading.Lock()
        self._admin: AdminClient | None = None
        self._attached: dict[ContainerRef, str] = {}
        self._server: HookServer | None = None

    def up(self) -> None:
        self._server = HookServer(self.socket_path, self).start()

    def down(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    def close(self) -> None:
        self.down()
        if self._admin is not None:
            self._admin.close()

    def _record(self, op: str, detail: Any) -> None:
        with self._lock:
            self.calls.append((op, detail))

    def count(self, op: str, key: str | None = None) -> int:
        with self._lock:
            return sum(1 for o, d in self.calls if o == op and (key is None or str(d).startswith(key)))

    def ops(self) -> list[str]:
        with self._lock:
            return [o for o, _ in self.calls]

    def create_container(self, pod: Mapping[str, Any], container: str) -> Adjustment:
        meta = pod["metadata"]
        key = f"{meta['namespace']}/{meta['name']}/{container}"
        self._record("create", key)
        if (meta.get("labels") or {}).get(TEST_LABEL) != "true":
            return Adjustment(
                False, reason=REASON_CONFIG_ERROR, message="fake agent: not a node runtime test Pod"
            )
        annotations = meta.get("annotations") or {}
        if annotations.get(A_MODE) == "refuse":
            return Adjustment(
                False,
                reason=REASON_CONFIG_ERROR,
                message=annotations.get(A_MESSAGE, "refused by the fake agent"),
            )
        env = dict(json.loads(annotations.get(A_ENV, "{}")))
        if A_GPU_LIMIT in annotations:
            limit = int(annotations[A_GPU_LIMIT])
            name = f"{key}#{uuid.uuid4().hex[:6]}"
            with self._lock:
                if self._admin is None:
                    self._admin = self.device.admin()
                reply = self._admin.attach(client_spec(name, ["0"], limit, limit))
                self._attached[ContainerRef(meta["namespace"], meta["name"], meta["uid"], container)] = (
                    reply.client
                )
            env[SIM_SOCKET_ENV] = self.device.client_socket
            env[SIM_TOKEN_ENV] = reply.token
        return Adjustment(True, env=env)

    def stop_container(self, ref: ContainerRef, exit_code: int | None) -> None:
        self._record("stop", (f"{ref.namespace}/{ref.pod}/{ref.container}", exit_code))
        with self._lock:
            client_name = self._attached.pop(ref, None)
            if client_name is not None and self._admin is not None:
                self._admin.detach(client_name)

    def synchronize(self, running: list[RunningContainer]) -> None:
        self._record("sync", [str(r.ref) for r in running])


# ---- fixtures ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def device(sandbox: Sandbox) -> Iterator[ServerProcess]:
    gpus = {
        "node": NODE,
        "gpus": [{"memory_mib": 4096, "product": "NVIDIA-H200", "uuid": gpu_uuid(NODE, i)} for i in range(2)],
    }
    with short_tempdir("gnrt-") as directory:
        topology = directory / "gpus.json"
        topology.write_text(json.dumps(gpus))
        server = ServerProcess.start(directory / "sim", topology=topology)
        try:
            yield server
        finally:
            server.stop()


@pytest.fixture(scope="module")
def agent(device: ServerProcess) -> Iterator[FakeAgent]:
    with short_tempdir("gnrh-") as directory:
        fake = FakeAgent(directory / "hook.sock", device)
        fake.up()
        try:
            yield fake
        finally:
            fake.close()


class RuntimeProcess:
    def __init__(self, proc: subprocess.Popen[bytes], work_dir: Path, log: Path) -> None:
        self.proc = proc
        self.work_dir = work_dir
        self.log = log

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@pytest.fixture(scope="module")
def runtime(
    sandbox: Sandbox, agent: FakeAgent, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RuntimeProcess]:
    rbac.ensure(client.RbacAuthorizationV1Api(sandbox.api_client()))
    kubeconfig = sandbox.issue_kubeconfig(
        f"runtime-{NODE}-test", rbac.runtime_user(NODE), (rbac.RUNTIME_GROUP,)
    )
    work_dir = tmp_path_factory.mktemp("noderuntime")
    log = work_dir.parent / f"{work_dir.name}.log"
    argv = [
        PY,
        "-m",
        "fixtures.sandbox.noderuntime",
        "--node",
        NODE,
        "--kubeconfig",
        str(kubeconfig),
        "--hook-socket",
        str(agent.socket_path),
        "--work-dir",
        str(work_dir),
        "--resync-seconds",
        "10",
    ]
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    rt = RuntimeProcess(proc, work_dir, log)
    try:
        wait_until(
            lambda: ready_file(work_dir).exists() or proc.poll() is not None,
            "the runtime to be ready",
            timeout=TIMEOUT_S,
        )
        assert proc.poll() is None, f"runtime exited:\n{rt.log_text()}"
        yield rt
    finally:
        code = rt.stop()
        survivors = container_processes(under=work_dir)
        print(f"--- node runtime log ({log}):\n{rt.log_text()[-20000:]}")
        assert code == 0, f"runtime exited {code}"
        assert not survivors, f"container processes survived the runtime: {survivors}"


@pytest.fixture
def core(sandbox: Sandbox) -> Any:
    return sandbox.core_v1()


@pytest.fixture
def ns(namespace: str, runtime: RuntimeProcess) -> str:
    return namespace


# ---- tests ---------------------------------------------------------------------------------------


def test_pod_with_node_name_runs_to_succeeded(core: Any, ns: str, agent: FakeAgent) -> None:
    core.create_namespaced_pod(ns, make_pod("hello", [PY, "-c", "print('hello from a simulated container')"]))
    pod = pod_in_phase(core, ns, "hello", "Succeeded", "Failed")
    assert pod["status"]["phase"] == "Succeeded"
    cs = container_status(pod)
    term = cs["state"]["terminated"]
    assert (term["exitCode"], term["reason"]) == (0, "Completed")
    assert term["startedAt"] and term["finishedAt"]
    assert cs["containerID"].startswith(CONTAINER_ID_SCHEME)
    assert cs["restartCount"] == 0 and cs["image"] == "gpuconf/sim-test:1" and not cs["ready"]
    status = pod["status"]
    assert status["hostIP"] == status["podIP"] == "127.0.0.1" and status["startTime"]
    conditions = {c["type"]: c for c in status["conditions"]}
    assert conditions["PodScheduled"]["status"] == "True"
    assert conditions["Initialized"]["status"] == "True"
    assert (conditions["Ready"]["status"], conditions["Ready"]["reason"]) == ("False", "PodCompleted")
    log_dir = Path(pod["metadata"]["annotations"][ANNOTATION_LOG_DIR])
    assert "hello from a simulated container" in (log_dir / "main" / "0.log").read_text()
    assert pod["metadata"]["annotations"]["sandbox.gpuconf.io/runtime"] == "simulated"
    key = f"{ns}/hello/main"
    wait_until(
        lambda: agent.count("stop", f"('{key}', 0)"), "StopContainer to reach the agent", timeout=TIMEOUT_S
    )
    assert agent.count("create", key) == 1
    started = [e for e in events_for(core, ns, "hello") if e["reason"] == "Started"]
    assert started and "simulated" in started[0]["message"]


def test_failing_container_reports_error_with_its_log_tail(core: Any, ns: str) -> None:
    script = (
        "import sys\nfor i in range(200): print(f'line {i}')\n"
        "sys.stdout.flush()\nprint('boom: it broke', file=sys.stderr)\nsys.exit(3)"
    )
    body = make_pod(
        "fails", [PY, "-c", script], container={"terminationMessagePolicy": "FallbackToLogsOnError"}
    )
    core.create_namespaced_pod(ns, body)
    pod = pod_in_phase(core, ns, "fails", "Failed", "Succeeded")
    assert pod["status"]["phase"] == "Failed"
    term = container_status(pod)["state"]["terminated"]
    assert (term["exitCode"], term["reason"]) == (3, "Error")
    message = term["message"]
    assert message.rstrip().endswith("boom: it broke")
    assert "line 199" in message and "line 100" not in message  # at most 80 lines
    assert len(message.encode()) <= 2048


def test_termination_message_file_is_honoured_and_capped(core: Any, ns: str) -> None:
    write = "import os\nopen(os.environ['GPUCONF_TERMINATION_PATH'], 'w').write({!r})"
    body = make_pod("messages", [PY, "-c", write.format("x" * 5000)])
    body["spec"]["containers"].append(
        {"name": "short", "image": "gpuconf/sim-test:1", "command": [PY, "-c", write.format("all done")]}
    )
    core.create_namespaced_pod(ns, body)
    pod = pod_in_phase(core, ns, "messages", "Succeeded", "Failed")
    assert pod["status"]["phase"] == "Succeeded"
    assert container_status(pod)["state"]["terminated"]["message"] == "x" * 4096
    assert container_status(pod, "short")["state"]["terminated"]["message"] == "all done"


def test_agent_env_overrides_the_container_env(core: Any, ns: str) -> None:
    dump = (
        "import json, os\n"
        "open(os.environ['GPUCONF_TERMINATION_PATH'], 'w').write(json.dumps(dict(os.environ)))"
    )
    env = [
        {"name": "FOO", "value": "from-container"},
        {"name": "BAR", "value": "kept"},
        {"name": "BAZ", "value": "$(BAR)-expanded"},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "POD_UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
    ]
    annotations = {A_ENV: json.dumps({"FOO": "from-agent", "NVIDIA_GPU_MEMORY_LIMIT": "4096"})}
    created = core.create_namespaced_pod(
        ns, make_pod("envs", [PY, "-c", dump], env=env, annotations=annotations)
    )
    pod = pod_in_phase(core, ns, "envs", "Succeeded", "Failed")
    seen = json.loads(container_status(pod)["state"]["terminated"]["message"])
    assert seen["FOO"] == "from-agent" and seen["NVIDIA_GPU_MEMORY_LIMIT"] == "4096"
    assert (seen["BAR"], seen["BAZ"]) == ("kept", "kept-expanded")
    assert (seen["POD_NAME"], seen["POD_NS"], seen["NODE_NAME"]) == ("envs", ns, NODE)
    assert seen["POD_UID"] == created.metadata.uid
    path = seen["PATH"].split(os.pathsep)
    assert path[0] == str(SMI_BIN_DIR) and path[1] == os.path.dirname(PY)
    assert "GPUCONF_SIM_ADMIN_TOKEN" not in seen and "KUBECONFIG" not in seen  # the runtime's env stays out


def test_refused_container_waits_and_never_runs(core: Any, ns: str, agent: FakeAgent, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    annotations = {
        A_MODE: "refuse",
        A_MESSAGE: "nvidia.com/container.main.gpu-memory.request: not a quantity",
    }
    core.create_namespaced_pod(ns, make_pod("refused", ["touch", str(marker)], annotations=annotations))
    reason = wait_until(
        lambda: (w := waiting_reason(core, ns, "refused")) and w[0] == REASON_CONFIG_ERROR and w,
        "the refusal to show as the waiting state",
        timeout=TIMEOUT_S,
    )
    assert reason == (REASON_CONFIG_ERROR, annotations[A_MESSAGE])
    wait_until(
        lambda: agent.count("create", f"{ns}/refused/main") >= 2,
        "the runtime to ask the agent again",
        timeout=TIMEOUT_S,
    )
    pod = read_pod(core, ns, "refused")
    assert pod is not None and pod["status"]["phase"] == "Pending"
    assert not marker.exists(), "a refused container ran"
    # The agent owns the refusal's Event; the runtime must not add its own.
    assert not [
        e for e in events_for(core, ns, "refused") if e["source"].get("component") == "gpuconf-sim-kubelet"
    ]


def test_unreachable_agent_means_not_started_until_it_is_back(
    core: Any, ns: str, agent: FakeAgent, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    agent.down()
    try:
        core.create_namespaced_pod(ns, make_pod("no-agent", ["touch", str(marker)]))
        wait_until(
            lambda: (waiting_reason(core, ns, "no-agent") or ("",))[0] == "CreateContainerError",
            "CreateContainerError while the agent is away",
            timeout=TIMEOUT_S,
        )
        assert not marker.exists(), "a container started without the agent (unfenced)"
        failed = [e for e in events_for(core, ns, "no-agent") if e["reason"] == "Failed"]
        assert failed and "fail closed" in failed[0]["message"]
        mark = len(agent.calls)
    finally:
        agent.up()
    pod = pod_in_phase(core, ns, "no-agent", "Succeeded", "Failed")
    assert pod["status"]["phase"] == "Succeeded" and marker.exists()
    # Back: Synchronize first, then the CreateContainer that finally started it (NRI's order).
    since = [(op, str(detail)) for op, detail in agent.calls[mark:]]
    first_sync = next(i for i, (op, _) in enumerate(since) if op == "sync")
    first_create = next(
        i for i, (op, d) in enumerate(since) if op == "create" and d.startswith(f"{ns}/no-agent")
    )
    assert first_sync < first_create


def test_restarted_agent_is_synchronized_with_running_containers(
    core: Any, ns: str, agent: FakeAgent
) -> None:
    core.create_namespaced_pod(ns, make_pod("long", ["sleep", "300"], restart="Always"))
    pod_in_phase(core, ns, "long", "Running")
    mark = len(agent.calls)
    agent.down()
    agent.up()  # a new agent process would bind a new socket the same way
    wanted = f"{ns}/long[main]"
    wait_until(
        lambda: any(op == "sync" and wanted in detail for op, detail in agent.calls[mark:]),
        "a Synchronize that lists the running container",
        timeout=TIMEOUT_S,
    )


def test_deletion_sends_sigterm_and_removes_the_pod(
    core: Any, ns: str, agent: FakeAgent, tmp_path: Path
) -> None:
    marker = tmp_path / "term"
    script = (
        "import signal, sys, time\n"
        f"def bye(*_):\n    open({str(marker)!r}, 'w').write('SIGTERM')\n    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, bye)\nprint('ready', flush=True)\ntime.sleep(300)"
    )
    core.create_namespaced_pod(ns, make_pod("deleted", [PY, "-c", script], restart="Always"))
    pod = pod_in_phase(core, ns, "deleted", "Running")
    pids = wait_until(
        lambda: container_processes([container_status(pod)["containerID"].split("://")[1]]),
        "the container's process",
        timeout=TIMEOUT_S,
    )
    wait_until(
        lambda: (
            "ready"
            in (Path(pod["metadata"]["annotations"][ANNOTATION_LOG_DIR]) / "main" / "0.log").read_text()
        ),
        "the container to install its SIGTERM handler",
        timeout=TIMEOUT_S,
    )
    core.delete_namespaced_pod("deleted", ns)  # default grace period: 30 s
    wait_until(lambda: gone(core, ns, "deleted"), "the Pod to be removed", timeout=TIMEOUT_S)
    assert marker.read_text() == "SIGTERM"
    assert not container_processes(list(pids.values()))
    wait_until(lambda: agent.count("stop", f"('{ns}/deleted/main'"), "StopContainer", timeout=TIMEOUT_S)


def test_grace_period_ends_with_sigkill(core: Any, ns: str) -> None:
    script = "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(300)"
    core.create_namespaced_pod(ns, make_pod("stubborn", [PY, "-c", script], terminationGracePeriodSeconds=1))
    pod = pod_in_phase(core, ns, "stubborn", "Running")
    cid = container_status(pod)["containerID"].split("://")[1]
    wait_until(lambda: container_processes([cid]), "the container's process", timeout=TIMEOUT_S)
    started = time.monotonic()
    core.delete_namespaced_pod("stubborn", ns)
    wait_until(lambda: gone(core, ns, "stubborn"), "the Pod to be removed", timeout=TIMEOUT_S)
    assert time.monotonic() - started >= 0.9  # the grace period was given
    assert not container_processes([cid])


def test_eviction_stops_the_container_and_removes_the_pod(core: Any, ns: str) -> None:
    core.create_namespaced_pod(ns, make_pod("evicted", ["sleep", "300"], restart="Always"))
    pod = pod_in_phase(core, ns, "evicted", "Running")
    cid = container_status(pod)["containerID"].split("://")[1]
    wait_until(lambda: container_processes([cid]), "the container's process", timeout=TIMEOUT_S)
    eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name="evicted", namespace=ns))
    core.create_namespaced_pod_eviction("evicted", ns, eviction)
    wait_until(lambda: gone(core, ns, "evicted"), "the evicted Pod to be removed", timeout=TIMEOUT_S)
    assert not container_processes([cid])


def test_on_failure_restarts_with_a_restart_count(core: Any, ns: str, tmp_path: Path) -> None:
    counter = tmp_path / "runs"
    script = (
        f"import pathlib, sys\np = pathlib.Path({str(counter)!r})\n"
        "n = int(p.read_text()) if p.exists() else 0\n"
        "p.write_text(str(n + 1))\nsys.exit(0 if n >= 1 else 7)"
    )
    core.create_namespaced_pod(ns, make_pod("flaky", [PY, "-c", script], restart="OnFailure"))
    pod = pod_in_phase(core, ns, "flaky", "Succeeded", "Failed")
    assert pod["status"]["phase"] == "Succeeded"
    cs = container_status(pod)
    assert cs["restartCount"] == 1
    assert cs["lastState"]["terminated"]["exitCode"] == 7
    assert cs["state"]["terminated"]["reason"] == "Completed"
    assert counter.read_text() == "2"
    log_dir = Path(pod["metadata"]["annotations"][ANNOTATION_LOG_DIR]) / "main"
    assert (log_dir / "0.log").exists() and (log_dir / "1.log").exists()
    assert any(e["reason"] == "BackOff" for e in events_for(core, ns, "flaky"))


def test_crash_loop_shows_crash_loop_back_off(core: Any, ns: str) -> None:
    core.create_namespaced_pod(ns, make_pod("crashy", ["false"], restart="Always"))
    wait_until(
        lambda: (waiting_reason(core, ns, "crashy") or ("",))[0] == "CrashLoopBackOff",
        "CrashLoopBackOff",
        timeout=TIMEOUT_S,
    )
    pod = wait_until(
        lambda: (p := read_pod(core, ns, "crashy")) and container_status(p)["restartCount"] >= 2 and p,
        "two restarts",
        timeout=TIMEOUT_S,
    )
    assert pod["status"]["phase"] == "Running"  # Always: between restarts the Pod stays Running
    assert container_status(pod)["lastState"]["terminated"]["exitCode"] == 1


def test_container_without_command_is_a_run_container_error(core: Any, ns: str) -> None:
    body = make_pod("no-command", [])
    del body["spec"]["containers"][0]["command"]
    core.create_namespaced_pod(ns, body)
    reason, message = wait_until(
        lambda: waiting_reason(core, ns, "no-command"), "the waiting state", timeout=TIMEOUT_S
    )
    if reason != "RunContainerError":
        reason, message = wait_until(
            lambda: (w := waiting_reason(core, ns, "no-command")) and w[0] == "RunContainerError" and w,
            "RunContainerError",
            timeout=TIMEOUT_S,
        )
    assert "needs an explicit command" in message
    assert read_pod(core, ns, "no-command")["status"]["phase"] == "Pending"


def test_readiness_waits_for_the_ready_file(core: Any, ns: str, tmp_path: Path) -> None:
    go = tmp_path / "go"
    script = (
        f"import os, pathlib, time\nwhile not pathlib.Path({str(go)!r}).exists(): time.sleep(0.05)\n"
        "pathlib.Path(os.environ['GPUCONF_READY_PATH']).touch()\ntime.sleep(300)"
    )
    probe = {"exec": {"command": ["true"]}, "periodSeconds": 1}
    core.create_namespaced_pod(
        ns, make_pod("readiness", [PY, "-c", script], restart="Always", container={"readinessProbe": probe})
    )
    pod = pod_in_phase(core, ns, "readiness", "Running")
    assert not container_status(pod)["ready"]
    ready = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
    assert ready["Ready"] == "False" and ready["ContainersReady"] == "False"
    go.touch()
    pod = wait_until(
        lambda: (p := read_pod(core, ns, "readiness")) and container_status(p)["ready"] and p,
        "readiness",
        timeout=TIMEOUT_S,
    )
    assert {c["type"]: c["status"] for c in pod["status"]["conditions"]}["Ready"] == "True"


def test_init_containers_run_first_in_order(core: Any, ns: str, tmp_path: Path) -> None:
    trail = tmp_path / "trail"
    step = (
        "import pathlib\np = pathlib.Path({path!r})\n"
        "p.write_text((p.read_text() if p.exists() else '') + {word!r})"
    )
    body = make_pod("inits", [PY, "-c", step.format(path=str(trail), word="main")])
    body["spec"]["initContainers"] = [
        {
            "name": f"init-{i}",
            "image": "gpuconf/sim-test:1",
            "command": [PY, "-c", step.format(path=str(trail), word=f"{i},")],
        }
        for i in (1, 2)
    ]
    core.create_namespaced_pod(ns, body)
    pod = pod_in_phase(core, ns, "inits", "Succeeded", "Failed")
    assert pod["status"]["phase"] == "Succeeded"
    assert trail.read_text() == "1,2,main"
    assert [c["state"]["terminated"]["reason"] for c in pod["status"]["initContainerStatuses"]] == [
        "Completed"
    ] * 2


def test_workload_runs_on_the_simulated_gpu_and_sees_the_simulated_smi(core: Any, ns: str) -> None:
    plan = {"name": "smi", "steps": [{"op": "alloc", "bytes": "64Mi"}, {"op": "smi"}]}
    body = make_pod(
        "workload",
        ["python", "-m", "workloads.allocate", "--plan", json.dumps(plan)],
        annotations={A_GPU_LIMIT: "512"},
    )
    core.create_namespaced_pod(ns, body)
    pod = pod_in_phase(core, ns, "workload", "Succeeded", "Failed")
    term = container_status(pod)["state"]["terminated"]
    assert pod["status"]["phase"] == "Succeeded", term
    result = json.loads(term["message"])
    assert result["simulated"] is True and result["exit_code"] == 0
    smi = next(s for s in result["steps"] if s["op"] == "smi")
    assert smi["gpus"][0]["total_mib"] == 512 and smi["gpus"][0]["uuid"] == gpu_uuid(NODE, 0)
    assert smi["gpus"][0]["used_mib"] == 64


def test_workload_out_of_memory_is_oomkilled(core: Any, ns: str) -> None:
    plan = {"name": "oom", "steps": [{"op": "alloc", "bytes": "512Mi"}]}
    body = make_pod(
        "oom",
        ["python", "-m", "workloads.allocate", "--plan", json.dumps(plan)],
        annotations={A_GPU_LIMIT: "256"},
    )
    core.create_namespaced_pod(ns, body)
    pod = pod_in_phase(core, ns, "oom", "Failed", "Succeeded")
    term = container_status(pod)["state"]["terminated"]
    assert (term["exitCode"], term["reason"]) == (int(ExitCode.UNEXPECTED_OOM), "OOMKilled")
    assert json.loads(term["message"])["status"] == ExitCode.UNEXPECTED_OOM.status


def test_namespace_deletion_with_a_running_pod_completes(core: Any, runtime: RuntimeProcess) -> None:
    name = f"t-{uuid.uuid4().hex[:10]}"
    core.create_namespace({"metadata": {"name": name, "labels": {"gpuconf.io/test": "true"}}})
    try:
        core.create_namespaced_pod(name, make_pod("sleeper", ["sleep", "300"], restart="Always"))
        pod = pod_in_phase(core, name, "sleeper", "Running")
        cid = container_status(pod)["containerID"].split("://")[1]
    finally:
        core.delete_namespace(name)

    def namespace_gone() -> bool:
        try:
            core.read_namespace(name)
            return False
        except ApiException as exc:
            return exc.status == 404

    wait_until(namespace_gone, f"namespace {name} to finish terminating", timeout=120)
    assert not container_processes([cid])

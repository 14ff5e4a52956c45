"""The reference agent fences real containers: containerd 2.x and runc, through gpuconf's NRI plugin.

Real parts: containerd (built from its Go module, ``fixtures.sandbox.runtime``), Debian's runc,
crictl, the Go NRI plugin of ``enforcement/nri``, the agent as ``python -m enforcement.agent``, and
the sandbox's kube-apiserver (the Pods, the Node whose condition the agent keeps, the Events).
Simulated: the GPU (``enforcement.sim``'s device server; its socket is bound into the containers
like the MPS pipe directory). The image is busybox from Debian's busybox-static, imported with
``ctr``; nothing is pulled.

What the kubelet does is done here with crictl: for a Pod created in the API (bound to this test's
own Node object), a pod sandbox with the Pod's name, namespace, uid and annotations (host network:
no CNI), then ``create`` and ``start`` of its container. containerd runs under a short folder of its
own (root, state, sockets, shim sockets, runc's state), never the machine's.

The only skip: a machine where containers cannot run at all (no root, no cgroups), with the reason.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kubernetes.client.rest import ApiException

from conformance.test_visibility import DECOYS, Placed, env_problems
from enforcement.agent import rbac
from enforcement.agent.agent import NRI_PLUGIN_READINESS_PERIOD_S
from enforcement.agent.environment import CONTRACT_ENV, enforcement_env
from enforcement.agent.handler import REASON_PLUGIN_MISSING
from enforcement.agent.kube import CONDITION_TYPE, REASON_REJECTED
from enforcement.agent.testing import AgentProcess
from enforcement.contract import (
    NODE_GPU_UUIDS,
    SUFFIX_LIMIT,
    Fraction,
    Mode,
    nvidia_key,
    render_placement,
)
from enforcement.sim import ADMIN_TOKEN_ENV, CLIENT_SOCKET_NAME, SIM_SOCKET_ENV, SIM_TOKEN_ENV
from enforcement.sim.process import ServerProcess
from enforcement.sim.testing import short_tempdir
from fixtures.sandbox import runtime
from fixtures.sandbox.controlplane import Sandbox
from workloads.simclient import DeviceClient

pytestmark = pytest.mark.sandbox

MIB = 1 << 20
GPU_MIB = 16384
WAIT_S = 60.0
T = TypeVar("T")


def wait_for(what: str, probe: Callable[[], T | None], timeout_s: float = WAIT_S, every: float = 0.2) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(every)


@dataclass
class Node:
    sandbox: Sandbox
    name: str
    dir: Path
    uuids: tuple[str, ...]
    server: ServerProcess
    agent: AgentProcess
    containerd: runtime.Containerd
    binaries: runtime.RuntimeBinaries
    plugin: subprocess.Popen[bytes] | None = None
    pods: list[str] = field(default_factory=list)

    @property
    def sim_dir(self) -> Path:
        return self.dir / "sim"

    @property
    def plugin_log(self) -> Path:
        return self.dir / "plugin.log"

    def start_plugin(self) -> None:
        with open(self.plugin_log, "ab") as log:
            self.plugin = subprocess.Popen(
                [
                    str(self.binaries.plugin),
                    "--nri-socket",
                    str(self.containerd.nri_socket),
                    "--agent-socket",
                    str(self.dir / "agent.sock"),
                ],
                stdout=log,
                stderr=log,
            )

    def kill_plugin(self) -> None:
        if self.plugin is not None and self.plugin.poll() is None:
            self.plugin.send_signal(signal.SIGKILL)
            self.plugin.wait()
        self.plugin = None

    def restart_agent(self) -> None:
        self.agent.kill()
        self.agent = AgentProcess(self.agent.argv, self.agent.env, self.agent.log_path).start()

    def read_node(self) -> dict[str, Any]:
        return json.loads(self.sandbox.core_v1().read_node(self.name, _preload_content=False).data)

    def condition(self) -> dict[str, Any] | None:
        raw = self.read_node()
        return next((c for c in raw["status"].get("conditions") or () if c["type"] == CONDITION_TYPE), None)

    def clients(self) -> dict[str, Any]:
        """What the agent holds on the (simulated) device, by client name."""
        with self.server.admin() as admin:
            return {c.name: c for c in admin.snapshot().clients}

    # ---- the kubelet's part, through CRI

    def api_pod(self, namespace: str, name: str, annotations: dict[str, str]) -> dict[str, Any]:
        core = self.sandbox.core_v1()
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "annotations": annotations},
            "spec": {
                "nodeName": self.name,
                "containers": [{"name": "main", "image": runtime.IMAGE}],
                "tolerations": [{"operator": "Exists"}],
            },
        }
        core.create_namespaced_pod(namespace, body)
        return json.loads(core.read_namespaced_pod(name, namespace, _preload_content=False).data)

    def run_pod(self, pod: dict[str, Any]) -> str:
        """``crictl runp``: the pod sandbox, as the kubelet makes it (annotations copied, host network)."""
        meta = pod["metadata"]
        logs = self.dir / "logs" / meta["uid"]
        logs.mkdir(parents=True, exist_ok=True)
        config = {
            "metadata": {
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta["uid"],
                "attempt": 0,
            },
            "annotations": meta.get("annotations") or {},
            "labels": {"io.kubernetes.pod.name": meta["name"]},
            "log_directory": str(logs),
            "linux": {
                "cgroup_parent": self.containerd.cgroup_parent,
                "security_context": {"namespace_options": {"network": 2}},
            },
        }
        path = logs / "pod.json"
        path.write_text(json.dumps(config))
        sandbox_id = self.containerd.crictl("runp", str(path)).stdout.strip()
        self.pods.append(sandbox_id)
        return sandbox_id

    def create(
        self, pod: dict[str, Any], sandbox_id: str, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """``crictl create`` of container ``main``: it prints its environment and mounts, then sleeps."""
        logs = self.dir / "logs" / pod["metadata"]["uid"]
        script = "env; echo MOUNTS; cat /proc/self/mountinfo; echo READY; exec sleep 100000"
        config = {
            "metadata": {"name": "main", "attempt": 0},
            "image": {"image": runtime.IMAGE},
            "command": ["/bin/sh", "-c", script],
            "envs": [{"key": k, "value": v} for k, v in (env or {}).items()],
            "log_path": "main.log",
            "linux": {},
        }
        path = logs / "main.json"
        path.write_text(json.dumps(config))
        return self.containerd.crictl(
            "create", "--no-pull", sandbox_id, str(path), str(logs / "pod.json"), check=False
        )

    def start(
        self, pod: dict[str, Any], env: dict[str, str] | None = None
    ) -> tuple[str, dict[str, str], str]:
        """Sandbox, create, start; returns the container id, the environment it saw and its mountinfo."""
        sandbox_id = self.run_pod(pod)
        created = self.create(pod, sandbox_id, env)
        assert created.returncode == 0, f"crictl create failed: {created.stderr}"
        container = created.stdout.strip()
        self.containerd.crictl("start", container)
        log = self.dir / "logs" / pod["metadata"]["uid"] / "main.log"

        def lines() -> list[str] | None:
            try:
                # CRI log lines: "<time> <stream> <tag> <content>"
                out = [line.split(" ", 3)[3] for line in log.read_text().splitlines() if line.count(" ") >= 3]
            except OSError:
                return None
            return out if "READY" in out else None

        out = wait_for(f"container {container} to print its environment", lines)
        cut = out.index("MOUNTS")
        seen = dict(line.split("=", 1) for line in out[:cut] if "=" in line)
        return container, seen, "\n".join(out[cut + 1 : out.index("READY")])

    def events(self, pod: dict[str, Any], reason: str) -> list[dict[str, Any]]:
        meta = pod["metadata"]
        resp = self.sandbox.core_v1().list_namespaced_event(
            meta["namespace"], field_selector=f"involvedObject.uid={meta['uid']}", _preload_content=False
        )
        return [e for e in json.loads(resp.data)["items"] if e.get("reason") == reason]

    def state(self, container: str) -> str:
        raw = json.loads(self.containerd.crictl("inspect", container).stdout)
        return str(raw["status"]["state"])

    def containers_of(self, sandbox_id: str) -> list[str]:
        return self.containerd.crictl("ps", "-a", "-q", "--pod", sandbox_id).stdout.split()


def placed(devices: tuple[str, ...], request: int, limit: int, mode: Mode = "time-slicing") -> dict[str, str]:
    return render_placement("main", Fraction("main", request, limit, mode, devices))


def expected_env(node: Node, request: int, limit: int, gpus: tuple[str, ...], mode: Mode) -> dict[str, str]:
    """The environment table the agent computes (``enforcement_env``), for the contract's keys."""
    fraction = Fraction("main", request, limit, mode, gpus)
    return enforcement_env(fraction, gpus, str(node.sim_dir / "mps" / mode))


@pytest.fixture(scope="module")
def node(sandbox: Sandbox) -> Iterator[Node]:
    reason = runtime.cannot_run_containers()
    if reason is not None:
        pytest.skip(f"containerd and runc cannot run containers on this machine: {reason}")
    binaries = runtime.ensure_runtime(log=lambda m: print(m, flush=True))
    from kubernetes import client

    name = f"nri-{uuid.uuid4().hex[:6]}"
    uuids = tuple(f"GPU-{uuid.uuid4()}" for _ in range(2))
    core = sandbox.core_v1()
    core.create_node(
        {
            "metadata": {
                "name": name,
                "annotations": {NODE_GPU_UUIDS: ",".join(uuids)},
                "labels": {"gpuconf.io/test": "nri"},
            }
        }
    )
    user = f"gpuconf:nri-test:{name}"
    rbac.ensure_rbac(client.RbacAuthorizationV1Api(sandbox.api_client()), user)
    kubeconfig = sandbox.issue_kubeconfig(f"nri-test-{name}", user)
    with short_tempdir("gnri-") as directory:
        (directory / "gpus.json").write_text(
            json.dumps({"node": name, "gpus": [{"memory_mib": GPU_MIB, "uuid": u} for u in uuids]})
        )
        token = uuid.uuid4().hex
        server = ServerProcess.start(directory / "sim", topology=directory / "gpus.json", admin_token=token)
        argv = [
            "--node", name,
            "--kubeconfig", str(kubeconfig),
            "--backend", "sim",
            "--sim-dir", str(directory / "sim"),
            "--hook-socket", str(directory / "agent.sock"),
            "--require-nri-plugin",
        ]  # fmt: skip
        agent = AgentProcess(argv, {**os.environ, ADMIN_TOKEN_ENV: token}, directory / "agent.log").start()
        containerd = runtime.Containerd(binaries, directory / "ctd")
        state = Node(sandbox, name, directory, uuids, server, agent, containerd, binaries)
        try:
            containerd.start()
            containerd.import_image(runtime.busybox_oci_archive(directory / "busybox.tar"))
            state.start_plugin()
            wait_for(
                "the agent's condition to be True (the plugin registered)",
                lambda: (c := state.condition()) is not None and c["status"] == "True",
            )
            yield state
        finally:
            state.kill_plugin()
            containerd.stop()
            state.agent.stop()
            server.stop()
            for label, path in (
                ("agent", directory / "agent.log"),
                ("plugin", state.plugin_log),
                ("containerd", containerd.log_path),
            ):
                text = path.read_text(errors="replace") if path.exists() else ""
                print(f"--- {label} log (tail) ---\n{text[-4000:]}")
            core.delete_node(name)
            agent_log = (directory / "agent.log").read_text(errors="replace")
            assert "Traceback" not in agent_log, "the agent logged a traceback"


@pytest.fixture(autouse=True)
def remove_pods(node: Node) -> Iterator[None]:
    """As the kubelet does for deleted Pods: each test's pod sandboxes (and containers) go at its end."""
    yield
    for sandbox_id in node.pods:
        node.containerd.crictl("stopp", sandbox_id, check=False)
        node.containerd.crictl("rmp", "-f", sandbox_id, check=False)
    node.pods.clear()
    # No kubelet confirms these API Pods' deletion (the test plays its part through CRI), so they
    # are removed at once: left Terminating and bound, their fractions would hold the shared
    # sandbox's accounting for the tests after this module.
    core = node.sandbox.core_v1()
    for pod in core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={node.name}").items:
        try:
            core.delete_namespaced_pod(pod.metadata.name, pod.metadata.namespace, grace_period_seconds=0)
        except ApiException as exc:
            if exc.status != 404:
                raise


def test_a_fractional_container_sees_the_agents_environment_and_mounts(node: Node, namespace: str) -> None:
    pod = node.api_pod(namespace, "fenced", placed(("0",), 512, 1024))
    # The container sets the conformance check's decoys itself (env-injection): all must be replaced.
    container, seen, mounts = node.start(pod, {**DECOYS, "APP": "kept"})
    expected = expected_env(node, 512, 1024, node.uuids[:1], "time-slicing")
    # Exactly the agent's table for the contract's keys (the container's own values replaced) ...
    assert {k: seen[k] for k in CONTRACT_ENV if k in seen} == expected
    # ... which the sandbox's env-injection check accepts, as it would judge a Pod on a real node.
    placement = Placed(
        name="fenced",
        node=node.name,
        gpus=node.uuids[:1],
        devices="0",
        request_mib=512,
        limit_mib=1024,
        mode="time-slicing",
        portion=None,
        written_request_mib=512,
        written_limit_mib=1024,
    )
    assert env_problems(placement, seen, node.read_node()) == []
    assert seen["APP"] == "kept"
    # Nothing else: the image's and the shell's own variables, the container's, and the agent's.
    shell = {"PATH", "HOSTNAME", "HOME", "SHLVL", "PWD"}
    assert set(seen) - shell == set(expected) | {SIM_SOCKET_ENV, SIM_TOKEN_ENV, "APP"}
    # ... plus the simulated device's socket and a token that opens this container's client there.
    assert seen[SIM_SOCKET_ENV] == str(node.sim_dir / CLIENT_SOCKET_NAME)
    device = DeviceClient.from_env(seen)
    try:
        assert device.hello.client == f"{namespace}/fenced/main"
        assert [d.total_bytes for d in device.hello.devices] == [1024 * MIB]
    finally:
        device.close()
    # The pipe directory and the device socket are bound into the container.
    mount_points = {line.split()[4] for line in mounts.splitlines() if len(line.split()) > 4}
    assert expected["CUDA_MPS_PIPE_DIRECTORY"] in mount_points
    assert seen[SIM_SOCKET_ENV] in mount_points
    assert SIM_TOKEN_ENV in seen and node.state(container) == "CONTAINER_RUNNING"
    assert f"{namespace}/fenced/main" in node.clients()


def test_a_malformed_placement_is_refused_with_the_agents_message_and_nothing_runs(
    node: Node, namespace: str
) -> None:
    annotations = placed(("0",), 512, 1024)
    annotations[nvidia_key("main", SUFFIX_LIMIT)] = "lots"
    pod = node.api_pod(namespace, "malformed", annotations)
    sandbox_id = node.run_pod(pod)
    created = node.create(pod, sandbox_id)
    assert created.returncode != 0
    assert nvidia_key("main", SUFFIX_LIMIT) in created.stderr
    assert re.search(r"\[[a-z-]+\]", created.stderr), created.stderr  # the rule, as the agent names it
    assert "fails closed" in created.stderr
    assert node.containers_of(sandbox_id) == []
    assert f"{namespace}/malformed/main" not in node.clients()
    # The same refusal on the API's Pod (the sandbox carried its uid): the agent's Event.
    rejected = wait_for(
        "the agent's GPUFractionRejected Event", lambda: node.events(pod, REASON_REJECTED), 20
    )
    assert nvidia_key("main", SUFFIX_LIMIT) in rejected[0]["message"]


def test_a_container_without_fraction_annotations_is_untouched(node: Node, namespace: str) -> None:
    pod = node.api_pod(namespace, "plain", {})
    _, seen, mounts = node.start(pod, {"NVIDIA_VISIBLE_DEVICES": "all"})
    assert seen["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert not any(k in seen for k in CONTRACT_ENV if k != "NVIDIA_VISIBLE_DEVICES")
    assert SIM_SOCKET_ENV not in seen and SIM_TOKEN_ENV not in seen
    assert str(node.sim_dir) not in mounts


def test_stop_and_removal_release_what_the_agent_held(node: Node, namespace: str) -> None:
    pod = node.api_pod(namespace, "released", placed(("1",), 256, 512))
    container, _, _ = node.start(pod)
    name = f"{namespace}/released/main"
    assert name in node.clients()
    node.containerd.crictl("stop", "--timeout", "1", container)
    wait_for("the stop to release the client", lambda: name not in node.clients(), 20)
    # Started again and removed without a stop: the removal releases it too.
    pod2 = node.api_pod(namespace, "removed", placed(("1",), 256, 512))
    container2, _, _ = node.start(pod2)
    assert f"{namespace}/removed/main" in node.clients()
    node.containerd.crictl("rm", "-f", container2)
    wait_for(
        "the removal to release the client", lambda: f"{namespace}/removed/main" not in node.clients(), 20
    )


def test_a_restarted_agent_re_adopts_running_containers_and_still_refuses_a_mode_conflict(
    node: Node, namespace: str
) -> None:
    pod = node.api_pod(namespace, "survivor", placed(("0",), 512, 1024))
    container, _, _ = node.start(pod)
    name = f"{namespace}/survivor/main"
    synced = node.plugin_log.read_text().count("Synchronize delivered")
    node.restart_agent()
    wait_for(
        "the plugin's Synchronize to the restarted agent",
        lambda: node.plugin_log.read_text().count("Synchronize delivered") > synced,
        20,
    )
    assert "Synchronize delivered: " in node.plugin_log.read_text()
    assert node.state(container) == "CONTAINER_RUNNING" and name in node.clients()  # its fence is intact
    conflicting = node.api_pod(namespace, "conflict", placed(("0",), 256, 512, "sm-sharing"))
    created = node.create(conflicting, node.run_pod(conflicting))
    assert created.returncode != 0 and "[mode-mixing]" in created.stderr, created.stderr
    assert "survivor" in created.stderr  # the other Pod, by name
    node.containerd.crictl("stop", "--timeout", "1", container)
    wait_for("the stop to release the re-adopted client", lambda: name not in node.clients(), 20)


def test_with_the_agent_down_a_fractional_container_is_refused_and_an_unannotated_one_starts(
    node: Node, namespace: str
) -> None:
    node.agent.kill()
    try:
        pod = node.api_pod(namespace, "no-agent", placed(("1",), 256, 512))
        created = node.create(pod, node.run_pod(pod))
        assert created.returncode != 0
        assert "fail closed" in created.stderr and "did not answer" in created.stderr, created.stderr
        plain = node.api_pod(namespace, "no-agent-plain", {})
        container, seen, _ = node.start(plain)
        assert node.state(container) == "CONTAINER_RUNNING" and SIM_TOKEN_ENV not in seen
    finally:
        node.agent = AgentProcess(node.agent.argv, node.agent.env, node.agent.log_path).start()


def test_with_the_plugin_down_the_condition_turns_false_within_its_declared_period(
    node: Node, namespace: str
) -> None:
    wait_for(
        "the condition to be True", lambda: (c := node.condition()) is not None and c["status"] == "True"
    )
    node.kill_plugin()
    killed = time.monotonic()
    condition = wait_for(
        "the condition to turn False",
        lambda: (c := node.condition()) is not None and c["status"] == "False" and c,
        NRI_PLUGIN_READINESS_PERIOD_S + 5,
    )
    took = time.monotonic() - killed
    assert condition["reason"] == REASON_PLUGIN_MISSING, condition
    assert "NRI plugin" in condition["message"] and "unfenced" in condition["message"]
    assert took <= NRI_PLUGIN_READINESS_PERIOD_S, f"False after {took:.1f} s"
    # What the condition warns of: without the plugin, containerd starts a fractional container unfenced.
    pod = node.api_pod(namespace, "unfenced", placed(("0",), 256, 512))
    _, seen, _ = node.start(pod)
    assert SIM_TOKEN_ENV not in seen and "NVIDIA_GPU_MEMORY_LIMIT" not in seen
    # The plugin back: it registers again and the condition is True again.
    node.start_plugin()
    wait_for(
        "the condition to be True again",
        lambda: (c := node.condition()) is not None and c["status"] == "True",
    )

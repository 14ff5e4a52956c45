"""The hook's NRI forms (what enforcement/nri's Go plugin sends) and the plugin's readiness.

The plugin knows a Pod only as NRI's pod sandbox; the agent builds the Pod from it and decides as for
the simulated kubelet. The plugin reports its registration every second; the node condition is False,
naming the plugin, when it is not registered or stopped reporting.
"""

from __future__ import annotations

from pathlib import Path

from enforcement.agent.agent import HealthLoop
from enforcement.agent.environment import ENV_PIPE_DIRECTORY
from enforcement.agent.handler import REASON_PLUGIN_MISSING
from enforcement.agent.kube import RecordingKube
from enforcement.agent.options import AgentOptions
from enforcement.agent.testing import internal_errors, sim_agent
from enforcement.contract import SUFFIX_LIMIT, Fraction, nvidia_key, render_placement
from enforcement.hook import HookClient, HookServer, PluginStatus, pod_from_sandbox, ref_from_sandbox


def sandbox(name: str, annotations: dict[str, str], uid: str = "uid-1") -> dict[str, object]:
    return {"name": name, "namespace": "ns", "uid": uid, "annotations": annotations, "labels": {"app": "x"}}


def placed(container: str, request: int, limit: int, mode: str = "time-slicing") -> dict[str, str]:
    return render_placement(container, Fraction(container, request, limit, mode, ("0",)))  # type: ignore[arg-type]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_pod_built_from_a_sandbox_has_its_identity_annotations_and_the_container() -> None:
    pod = pod_from_sandbox(sandbox("p", {"a": "b"}), "main")
    assert pod["metadata"] == {
        "name": "p",
        "namespace": "ns",
        "uid": "uid-1",
        "annotations": {"a": "b"},
        "labels": {"app": "x"},
    }
    assert pod["spec"]["containers"] == [{"name": "main"}]
    assert str(ref_from_sandbox(sandbox("p", {}), "main")) == "ns/p[main]"


def test_create_stop_and_synchronize_in_the_nri_forms(tmp_path: Path) -> None:
    a = sim_agent()
    with HookServer(tmp_path / "hook.sock", a.core) as server:
        client = HookClient(tmp_path / "hook.sock")
        adj = client.create_container_nri(sandbox("p", placed("main", 256, 512)), "main")
        assert adj.allowed, adj.message
        assert adj.env[ENV_PIPE_DIRECTORY] in adj.mounts  # the pipe directory is bound into the container
        assert "/tmp/gpuconf-test/client.sock" in adj.mounts  # and the simulated device's socket
        assert len(a.core.registry) == 1
        # Synchronize: a running container is kept; StopContainer releases it.
        reply = client._call(
            {
                "op": "Synchronize",
                "containers": [{"sandbox": sandbox("p", {}), "container": "main", "pid": 7}],
            }
        )
        assert reply["incarnation"] == server.incarnation
        assert len(a.core.registry) == 1
        client._call(
            {"op": "StopContainer", "sandbox": sandbox("p", {}), "container": "main", "exit_code": 0}
        )
        assert len(a.core.registry) == 0 and not a.node.snapshot().clients
        # A Synchronize without the container releases what it held.
        assert client.create_container_nri(sandbox("q", placed("main", 256, 512), "uid-2"), "main").allowed
        client._call({"op": "Synchronize", "containers": []})
        assert len(a.core.registry) == 0
    assert internal_errors(a.core) == 0


def test_a_malformed_placement_from_a_sandbox_is_refused_naming_key_and_rule(tmp_path: Path) -> None:
    a = sim_agent()
    annotations = placed("main", 256, 512)
    annotations[nvidia_key("main", SUFFIX_LIMIT)] = "lots"
    with HookServer(tmp_path / "hook.sock", a.core):
        adj = HookClient(tmp_path / "hook.sock").create_container_nri(sandbox("p", annotations), "main")
    assert not adj.allowed and adj.reason == "CreateContainerConfigError"
    assert nvidia_key("main", SUFFIX_LIMIT) in adj.message and "[" in adj.message
    assert not adj.mounts and len(a.core.registry) == 0


def test_a_container_without_annotations_gets_no_env_and_no_mounts(tmp_path: Path) -> None:
    a = sim_agent()
    with HookServer(tmp_path / "hook.sock", a.core):
        adj = HookClient(tmp_path / "hook.sock").create_container_nri(sandbox("p", {}), "main")
    assert adj.allowed and not adj.env and not adj.mounts


def test_every_reply_carries_an_incarnation_new_per_server(tmp_path: Path) -> None:
    a = sim_agent(options=AgentOptions(node="node-a", nri_plugin_timeout_s=5))
    seen = []
    for _ in range(2):
        with HookServer(tmp_path / "hook.sock", a.core):
            seen.append(HookClient(tmp_path / "hook.sock").plugin_status(PluginStatus(True, "gpuconf")))
    assert all(seen) and seen[0] != seen[1]


def test_plugin_health_needs_a_fresh_registered_report_when_a_plugin_is_expected() -> None:
    clock = Clock()
    a = sim_agent(options=AgentOptions(node="node-a", nri_plugin_timeout_s=5))
    a.core.clock = clock
    ok, why = a.core.plugin_health()
    assert not ok and "not reported" in why and "unfenced" in why
    a.core.plugin_status(PluginStatus(True, "gpuconf", "containerd v2.4.2", 42))
    assert a.core.plugin_health() == (True, "NRI plugin gpuconf registered with containerd v2.4.2")
    clock.now += 6
    ok, why = a.core.plugin_health()
    assert not ok and "has not reported for 6 s" in why
    a.core.plugin_status(PluginStatus(False, "gpuconf"))
    ok, why = a.core.plugin_health()
    assert not ok and "not registered with the container runtime" in why
    # No plugin expected (the simulated kubelet calls the hook): always fine.
    assert sim_agent().core.plugin_health() == (True, "")


def test_the_node_condition_names_the_missing_plugin_and_the_backend_first() -> None:
    kube = RecordingKube()
    a = sim_agent(options=AgentOptions(node="node-a", nri_plugin_timeout_s=5), kube=kube)
    loop = HealthLoop(a.core, lambda: None)
    loop.run_once()
    ok, reason, message = kube.conditions[-1]
    assert (ok, reason) == (False, REASON_PLUGIN_MISSING) and "NRI plugin" in message
    assert loop.ready is False  # what /healthz says: the DaemonSet's Pod is not Ready either
    a.core.plugin_status(PluginStatus(True, "gpuconf", "containerd"))
    loop.run_once()
    ok, reason, message = kube.conditions[-1]
    assert ok and "NRI plugin gpuconf registered" in message and loop.ready is True

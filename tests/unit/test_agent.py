"""The agent's CreateContainer/StopContainer decisions on an in-process simulated node.

Each contract case from docs/contract.md §2/§5 becomes the environment the container gets, the client
the device holds, or a refusal naming key and rule; plus the mode guard and the seeded faults.
"""

from __future__ import annotations

import pytest
from agent_pods import make_pod, placement

from enforcement.agent.environment import (
    ENV_LIMIT,
    ENV_PINNED_LIMIT,
    ENV_PIPE_DIRECTORY,
    ENV_REQUEST,
    ENV_THREAD_PERCENTAGE,
    ENV_VISIBLE_DEVICES,
    enforcement_env,
    pinned_limit,
)
from enforcement.agent.handler import REASON_CREATE_ERROR
from enforcement.agent.kube import (
    REASON_BACKEND_UNAVAILABLE,
    REASON_MODE_CONFLICT,
    REASON_REJECTED,
    REASON_UNFENCED,
)
from enforcement.agent.options import AgentOptions
from enforcement.agent.registry import LABEL_AGENT, LABEL_CONTAINER, LABEL_NAMESPACE, LABEL_POD, LABEL_UID
from enforcement.agent.testing import SimAgent, internal_errors, sim_agent
from enforcement.backends import BackendUnavailable
from enforcement.contract import Fraction, nvidia_key
from enforcement.hook import REASON_CONFIG_ERROR, ContainerRef
from enforcement.sim.admin import client_spec
from workloads.simwire import SIM_SOCKET_ENV, SIM_TOKEN_ENV

MIB = 1 << 20


def uuids(agent: SimAgent) -> list[str]:
    return [g.uuid for g in agent.node.gpus]


def client(agent: SimAgent, name: str):
    return next((c for c in agent.node.snapshot().clients if c.name == name), None)


# ---- the environment, case by case


def test_single_device_request_and_limit() -> None:
    a = sim_agent()
    pod = make_pod("p", placement("main", 256, 512, devices=("0",)))
    adj = a.core.create_container(pod, "main")
    assert adj.allowed, adj.message
    env = adj.env
    assert env[ENV_REQUEST] == "256" and env[ENV_LIMIT] == "512"
    assert env[ENV_PINNED_LIMIT] == "0=512M"
    assert env[ENV_VISIBLE_DEVICES] == uuids(a)[0]
    assert env[ENV_PIPE_DIRECTORY].endswith("/time-slicing")
    assert ENV_THREAD_PERCENTAGE not in env
    assert env[SIM_SOCKET_ENV] == "/tmp/gpuconf-test/client.sock" and env[SIM_TOKEN_ENV]
    held = client(a, "ns/p/main")
    assert held is not None and held.mode == "time-slicing"
    assert [(g.uuid, g.hard_limit_bytes, g.guarantee_bytes) for g in held.gpus] == [
        (uuids(a)[0], 512 * MIB, 256 * MIB)
    ]
    assert held.labels[LABEL_NAMESPACE] == "ns" and held.labels[LABEL_POD] == "p"
    assert held.labels[LABEL_UID] == pod["metadata"]["uid"] and held.labels[LABEL_CONTAINER] == "main"
    assert held.labels[LABEL_AGENT] == "node-a"


def test_the_token_in_the_env_opens_the_client_on_the_device() -> None:
    a = sim_agent()
    adj = a.core.create_container(make_pod("p", placement("main", 64, 128)), "main")
    ctx, hello = a.node.open_context(adj.env[SIM_TOKEN_ENV])
    assert hello.client == "ns/p/main" and [d.total_bytes for d in hello.devices] == [128 * MIB]
    a.node.close_context(ctx)


def test_multi_device_limits_per_visible_ordinal_in_written_order() -> None:
    a = sim_agent((1024, 1024, 1024))
    u = uuids(a)
    ann = {**placement("main", 100, 300, devices=(u[2], "0")), "gpu-fraction-num-devices": "2"}
    adj = a.core.create_container(make_pod("p", ann), "main")
    assert adj.allowed, adj.message
    assert adj.env[ENV_PINNED_LIMIT] == "0=300M,1=300M"
    assert adj.env[ENV_VISIBLE_DEVICES] == f"{u[2]},{u[0]}"
    held = client(a, "ns/p/main")
    assert [g.uuid for g in held.gpus] == [u[2], u[0]]


def test_request_only_means_limit_equals_request() -> None:
    a = sim_agent()
    ann = {
        nvidia_key("main", ".gpu-memory.request"): "1Gi",
        nvidia_key("main", ".gpus.devices"): "1",
    }
    adj = a.core.create_container(make_pod("p", ann), "main")
    assert adj.allowed, adj.message
    assert adj.env[ENV_REQUEST] == adj.env[ENV_LIMIT] == "1024"
    assert adj.env[ENV_PINNED_LIMIT] == "0=1024M"


def test_limit_only_means_request_equals_limit() -> None:
    a = sim_agent()
    ann = {
        nvidia_key("main", ".gpu-memory.limit"): "1000M",  # rounded up: 954 MiB
        nvidia_key("main", ".gpus.devices"): "0",
    }
    adj = a.core.create_container(make_pod("p", ann), "main")
    assert adj.allowed, adj.message
    assert adj.env[ENV_REQUEST] == adj.env[ENV_LIMIT] == "954"


def test_sm_sharing_with_portion_sets_the_thread_percentage() -> None:
    a = sim_agent()
    pod = make_pod("p", placement("main", 64, 128, mode="sm-sharing", portion=0.255))
    adj = a.core.create_container(pod, "main")
    assert adj.allowed, adj.message
    assert adj.env[ENV_THREAD_PERCENTAGE] == "25"
    assert adj.env[ENV_PIPE_DIRECTORY].endswith("/sm-sharing")
    assert client(a, "ns/p/main").mode == "sm-sharing"


def test_tiny_portion_gives_at_least_one_percent_and_time_slicing_ignores_the_portion() -> None:
    a = sim_agent()
    tiny = a.core.create_container(
        make_pod("p", placement("main", 64, 64, mode="sm-sharing", portion=0.001)), "main"
    )
    assert tiny.env[ENV_THREAD_PERCENTAGE] == "1"
    ts = a.core.create_container(
        make_pod("q", placement("main", 64, 64, devices=("1",), portion=0.5)), "main"
    )
    assert ts.allowed and ENV_THREAD_PERCENTAGE not in ts.env


def test_index_uuid_and_cdi_name_of_a_gpu_resolve_alike() -> None:
    a = sim_agent()
    u = uuids(a)[1]
    seen = set()
    for i, device in enumerate(("1", u, f"k8s.device-plugin.nvidia.com/gpu={u}")):
        adj = a.core.create_container(make_pod(f"p{i}", placement("main", 16, 16, devices=(device,))), "main")
        assert adj.allowed, adj.message
        seen.add(adj.env[ENV_VISIBLE_DEVICES])
    assert seen == {u}


def test_enforcement_keys_override_what_the_container_set() -> None:
    a = sim_agent()
    pod = make_pod(
        "p",
        placement("main", 64, 128),
        env={ENV_VISIBLE_DEVICES: "all", ENV_PINNED_LIMIT: "0=80G", ENV_LIMIT: "999999"},
    )
    adj = a.core.create_container(pod, "main")
    # The runtime applies Adjustment.env over the container's own env: every key it set is answered.
    assert adj.env[ENV_VISIBLE_DEVICES] == uuids(a)[0]
    assert adj.env[ENV_PINNED_LIMIT] == "0=128M" and adj.env[ENV_LIMIT] == "128"


def test_enforcement_env_is_pure_and_backend_extras_cannot_replace_contract_keys() -> None:
    fraction = Fraction("c", 100, 200, "sm-sharing", ("0", "1"), 0.5)
    env = enforcement_env(fraction, ["GPU-a", "GPU-b"], "/pipe", {ENV_LIMIT: "1", "EXTRA": "x"})
    assert env == {
        "EXTRA": "x",
        ENV_REQUEST: "100",
        ENV_LIMIT: "200",
        ENV_PINNED_LIMIT: "0=200M,1=200M",
        ENV_THREAD_PERCENTAGE: "50",
        ENV_PIPE_DIRECTORY: "/pipe",
        ENV_VISIBLE_DEVICES: "GPU-a,GPU-b",
    }
    assert pinned_limit(4096, 2) == "0=4096M,1=4096M"


def test_a_container_without_annotations_is_allowed_unchanged() -> None:
    a = sim_agent()
    pod = make_pod("p", placement("gpu", 64, 64), containers=("gpu", "sidecar"))
    adj = a.core.create_container(pod, "sidecar")
    assert adj.allowed and dict(adj.env) == {}
    assert a.node.snapshot().clients == ()
    assert a.kube.events == []


def test_mode_alone_does_nothing() -> None:
    a = sim_agent()
    adj = a.core.create_container(
        make_pod("p", {nvidia_key("main", ".gpu-compute.mode"): "sm-sharing"}), "main"
    )
    assert adj.allowed and dict(adj.env) == {}


# ---- fail closed, fail open


def test_malformed_contract_is_refused_naming_key_and_rule_with_an_event() -> None:
    a = sim_agent()
    ann = placement("main", 64, 128)
    key = nvidia_key("main", ".gpu-compute.mode")
    ann[key] = "SM-Sharing"
    pod = make_pod("p", ann)
    adj = a.core.create_container(pod, "main")
    assert not adj.allowed and adj.reason == REASON_CONFIG_ERROR
    assert key in adj.message and "[mode-word]" in adj.message
    assert a.node.snapshot().clients == ()
    (event,) = a.kube.events
    assert event.reason == REASON_REJECTED and event.kind == "Warning"
    assert key in event.message and "mode-word" in event.message
    assert event.ref == ContainerRef("ns", "p", pod["metadata"]["uid"], "main")
    assert a.core.metrics.value("gpu_fractioning_agent_rejected_containers_total", reason="malformed") == 1


@pytest.mark.parametrize(
    ("suffix", "value", "rule"),
    [
        (".gpu-memory.request", "0", "memory-minimum"),
        (".gpu-memory.request", " 1Gi", "memory-quantity"),
        (".gpu-memory.request", "300Mi", "request-exceeds-limit"),
        (".gpus.devices", "0,0", "devices-format"),
        (".gpus.devices", "all", "devices-format"),
        (".gpu-compute.portion", "1.5", "portion-value"),
    ],
)
def test_each_malformed_value_is_refused(suffix: str, value: str, rule: str) -> None:
    a = sim_agent()
    ann = placement("main", 100, 200)
    ann[nvidia_key("main", suffix)] = value
    adj = a.core.create_container(make_pod("p", ann), "main")
    assert not adj.allowed and f"[{rule}]" in adj.message


def test_a_device_the_node_lacks_is_refused_as_devices_unknown() -> None:
    a = sim_agent()
    for device in ("7", "GPU-00000000-0000-0000-0000-000000000000"):
        adj = a.core.create_container(make_pod("p", placement("main", 16, 16, devices=(device,))), "main")
        assert not adj.allowed and "[devices-unknown]" in adj.message and "node node-a" in adj.message


def test_missing_devices_is_refused_because_it_would_run_unfenced() -> None:
    a = sim_agent()
    ann = {nvidia_key("main", ".gpu-memory.request"): "1Gi"}
    adj = a.core.create_container(make_pod("p", ann), "main")
    assert not adj.allowed and "[devices-missing]" in adj.message


def test_fail_open_starts_unfenced_with_a_warning_event() -> None:
    a = sim_agent(options=AgentOptions(node="node-a", fail_open=True))
    ann = placement("main", 64, 128)
    ann[nvidia_key("main", ".gpu-memory.request")] = "lots"
    adj = a.core.create_container(make_pod("p", ann), "main")
    assert adj.allowed and dict(adj.env) == {}
    assert a.node.snapshot().clients == ()
    (event,) = a.kube.events
    assert event.reason == REASON_UNFENCED and "WITHOUT GPU enforcement" in event.message
    assert "memory-quantity" in event.message


def test_fail_open_still_refuses_a_mode_conflict() -> None:
    a = sim_agent(options=AgentOptions(node="node-a", fail_open=True))
    assert a.core.create_container(make_pod("a", placement("main", 16, 16)), "main").allowed
    adj = a.core.create_container(make_pod("b", placement("main", 16, 16, mode="sm-sharing")), "main")
    assert not adj.allowed and "sm-sharing" in adj.message and internal_errors(a.core) == 0
    rejected = "gpu_fractioning_agent_rejected_containers_total"
    assert a.core.metrics.value(rejected, reason="mode-conflict") == 1


def test_a_broken_pod_document_never_escapes_as_an_exception() -> None:
    a = sim_agent()
    for pod in ({}, {"metadata": "x"}, {"metadata": {"annotations": ["a"]}, "spec": {"containers": "c"}}):
        adj = a.core.create_container(pod, "main")
        assert adj.allowed or adj.reason == REASON_CONFIG_ERROR, adj.message  # decided, not crashed
    assert internal_errors(a.core) == 0


def test_backend_down_refuses_with_create_container_error_and_event() -> None:
    a = sim_agent()

    def down():
        raise BackendUnavailable("device server gone")

    a.backend.gpus = down  # type: ignore[method-assign]
    adj = a.core.create_container(make_pod("p", placement("main", 16, 16)), "main")
    assert not adj.allowed and adj.reason == REASON_CREATE_ERROR and "device server gone" in adj.message
    assert a.kube.reasons() == [REASON_BACKEND_UNAVAILABLE]


def test_internal_error_refuses_instead_of_crashing() -> None:
    a = sim_agent()

    def boom(*_a, **_k):
        raise RuntimeError("bug")

    a.backend.attach = boom  # type: ignore[method-assign]
    adj = a.core.create_container(make_pod("p", placement("main", 16, 16)), "main")
    assert not adj.allowed and "internal error" in adj.message and "RuntimeError: bug" in adj.message


# ---- mode guard


def test_mode_conflict_is_refused_naming_both_pods_and_modes() -> None:
    a = sim_agent()
    assert a.core.create_container(make_pod("trainer", placement("main", 16, 16)), "main").allowed
    adj = a.core.create_container(make_pod("server", placement("main", 16, 16, mode="sm-sharing")), "main")
    assert not adj.allowed and adj.reason == REASON_CONFIG_ERROR
    for word in ("ns/trainer", "ns/server", "time-slicing", "sm-sharing", uuids(a)[0], "mode-mixing"):
        assert word in adj.message
    (event,) = a.kube.events
    assert event.reason == REASON_MODE_CONFLICT and event.ref.pod == "server"
    assert client(a, "ns/server/main") is None


def test_modes_are_per_gpu_not_per_node() -> None:
    a = sim_agent()
    assert a.core.create_container(make_pod("a", placement("main", 16, 16, devices=("0",))), "main").allowed
    adj = a.core.create_container(
        make_pod("b", placement("main", 16, 16, devices=("1",), mode="sm-sharing")), "main"
    )
    assert adj.allowed, adj.message


def test_same_mode_shares_a_gpu_and_a_stopped_conflict_frees_the_gpu() -> None:
    a = sim_agent()
    first = make_pod("a", placement("main", 16, 16))
    assert a.core.create_container(first, "main").allowed
    assert a.core.create_container(make_pod("b", placement("main", 16, 16)), "main").allowed
    a.core.stop_container(ContainerRef("ns", "a", first["metadata"]["uid"], "main"), 0)
    assert not a.core.create_container(
        make_pod("c", placement("main", 16, 16, mode="sm-sharing")), "main"
    ).allowed


def test_a_conflict_only_the_device_knows_is_refused_too() -> None:
    a = sim_agent()
    a.node.attach(client_spec("outsider", ["0"], 16, 16, "sm-sharing"))  # attached without the agent
    adj = a.core.create_container(make_pod("p", placement("main", 16, 16)), "main")
    assert not adj.allowed and "sm-sharing" in adj.message and "time-slicing" in adj.message
    assert a.kube.reasons() == [REASON_MODE_CONFLICT]


def test_a_restarted_container_replaces_its_client() -> None:
    a = sim_agent()
    pod = make_pod("p", placement("main", 16, 32))
    first = a.core.create_container(pod, "main")
    second = a.core.create_container(pod, "main")
    assert first.allowed and second.allowed and first.env[SIM_TOKEN_ENV] != second.env[SIM_TOKEN_ENV]
    assert [c.name for c in a.node.snapshot().clients] == ["ns/p/main"]


# ---- stop


def test_stop_releases_memory_and_guarantee() -> None:
    a = sim_agent()
    pod = make_pod("p", placement("main", 256, 512))
    adj = a.core.create_container(pod, "main")
    ctx, _hello = a.node.open_context(adj.env[SIM_TOKEN_ENV])
    a.node.alloc(ctx, 0, 300 * MIB)
    a.core.stop_container(ContainerRef("ns", "p", pod["metadata"]["uid"], "main"), 0)
    snap = a.node.snapshot()
    assert snap.clients == () and snap.gpus[0].used_bytes == 0 and snap.gpus[0].guaranteed_bytes == 0
    assert len(a.core.registry) == 0


def test_stop_of_another_pods_container_of_the_same_name_releases_nothing() -> None:
    a = sim_agent()
    pod = make_pod("p", placement("main", 16, 16))
    assert a.core.create_container(pod, "main").allowed
    a.core.stop_container(ContainerRef("ns", "p", "some-older-uid", "main"), 0)
    assert client(a, "ns/p/main") is not None


# ---- seeded faults change what is enforced (the probe's checks must catch each)


def test_fault_no_hard_limit_makes_the_limit_the_whole_gpu() -> None:
    a = sim_agent(options=AgentOptions(node="node-a", faults=frozenset({"no-hard-limit"})))
    adj = a.core.create_container(make_pod("p", placement("main", 16, 32)), "main")
    assert adj.env[ENV_LIMIT] == "1024"
    assert client(a, "ns/p/main").gpus[0].hard_limit_bytes == 1024 * MIB


def test_fault_no_mode_guard_mixes_modes() -> None:
    a = sim_agent(options=AgentOptions(node="node-a", faults=frozenset({"no-mode-guard"})))
    assert a.core.create_container(make_pod("a", placement("main", 16, 16)), "main").allowed
    assert a.core.create_container(
        make_pod("b", placement("main", 16, 16, mode="sm-sharing")), "main"
    ).allowed


def test_unknown_fault_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown agent fault"):
        AgentOptions(node="n", faults=frozenset({"typo"}))

"""Fuzzing annotations through the agent's CreateContainer.

Properties, for any annotations at all (well-formed, malformed, wrong types, unknown containers):
the agent never raises, always answers with an ``Adjustment`` that is a decision and never an
internal error (the catch-all that keeps the hook answering would otherwise turn any crash into a
refusal that passes for one), never starts a container whose contract has errors when it fails
closed, and whatever it starts fenced is fenced with exactly the limits the contract module parsed.
"""

from __future__ import annotations

from typing import Any

from agent_pods import make_pod, placement
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from enforcement.agent.environment import ENV_LIMIT, ENV_REQUEST
from enforcement.agent.handler import REASON_CREATE_ERROR
from enforcement.agent.options import AgentOptions
from enforcement.agent.testing import internal_errors, sim_agent
from enforcement.contract import NVIDIA_PREFIX, fail_closed_containers, read_placement
from enforcement.hook import Adjustment

MIB = 1 << 20
CONTAINERS = ("main", "side")
SUFFIXES = (
    ".gpu-memory.request",
    ".gpu-memory.limit",
    ".gpu-compute.mode",
    ".gpus.devices",
    ".gpu-compute.portion",
    ".gpu-memory.bogus",
)

memory = st.one_of(
    st.sampled_from(
        ["1Gi", "512Mi", "1000M", "1G", "100M", "4294967296", "1Mi", "0", "-1Gi", " 1Gi", "", "lots"]
    ),
    st.integers(min_value=-10, max_value=1 << 40).map(lambda n: f"{n}Mi"),
    st.text(max_size=12),
)
devices = st.one_of(
    st.sampled_from(
        ["0", "1", "0,1", "1,0", "7", "0,0", "all", "", " 0", "GPU-x", "k8s.device-plugin.nvidia.com/gpu=0"]
    ),
    st.text(max_size=12),
)
modes = st.one_of(
    st.sampled_from(["time-slicing", "sm-sharing", "SM-Sharing", "mig", "", " "]), st.text(max_size=8)
)
portions = st.one_of(
    st.sampled_from(["0.5", "1", "0", "1.5", "0.001", "nan", "inf", "1e-3"]), st.text(max_size=6)
)
odd_values = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True), st.lists(st.integers())
)


@st.composite
def valid_placement(draw: st.DrawFn, container: str) -> dict[str, Any]:
    """What a correct scheduler writes: the starting point the mutations below break (or not)."""
    request = draw(st.integers(1, 2048))
    limit = draw(st.integers(request, 4096))
    devices = draw(st.sampled_from([("0",), ("1",), ("1", "0")]))
    mode = draw(st.sampled_from(["time-slicing", "sm-sharing"]))
    portion = draw(st.one_of(st.none(), st.floats(0.01, 1.0)))
    out = placement(container, request, limit, devices, mode, portion)
    if len(devices) > 1:
        out["gpu-fraction-num-devices"] = str(len(devices))
    return out


@st.composite
def annotations(draw: st.DrawFn) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for container in CONTAINERS:
        if draw(st.booleans()):
            out.update(draw(valid_placement(container)))
    for _ in range(draw(st.integers(0, 4))):
        container = draw(st.sampled_from((*CONTAINERS, "ghost", "")))
        suffix = draw(st.sampled_from(SUFFIXES))
        strategy = {
            ".gpu-memory.request": memory,
            ".gpu-memory.limit": memory,
            ".gpu-compute.mode": modes,
            ".gpus.devices": devices,
            ".gpu-compute.portion": portions,
        }.get(suffix, st.text(max_size=6))
        value = draw(st.one_of(strategy, odd_values) if draw(st.integers(0, 9)) == 0 else strategy)
        out[f"{NVIDIA_PREFIX}{container}{suffix}"] = value
    if draw(st.integers(0, 5)) == 0:
        out["gpu-fraction-num-devices"] = draw(st.sampled_from(["1", "2", "0", "x"]))
    return out


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ann=annotations(), fail_open=st.booleans())
def test_create_container_always_answers_and_never_starts_an_error_when_failing_closed(
    ann: dict[str, Any], fail_open: bool
) -> None:
    agent = sim_agent((2048, 2048), options=AgentOptions(node="node-a", fail_open=fail_open))
    pod = make_pod("fuzz", ann, containers=CONTAINERS)
    fractions, violations = read_placement(pod)
    refused = fail_closed_containers(violations)
    for container in CONTAINERS:
        adj = agent.core.create_container(pod, container)
        assert isinstance(adj, Adjustment)
        assert adj.allowed or (adj.reason and adj.message)
        assert internal_errors(agent.core) == 0, adj.message
        if container in refused:
            if fail_open:
                assert not adj.env, "a fail-open start is unfenced, not half-fenced"
            else:
                assert not adj.allowed, f"{container} started despite {violations}"
                assert any(v.key in adj.message and f"[{v.rule}]" in adj.message for v in violations)
        if adj.allowed and adj.env:
            fraction = fractions[container]
            assert adj.env[ENV_REQUEST] == str(fraction.request_mib)
            assert adj.env[ENV_LIMIT] == str(fraction.limit_mib)
            held = next(c for c in agent.node.snapshot().clients if c.name == f"ns/fuzz/{container}")
            assert {g.hard_limit_bytes for g in held.gpus} == {fraction.limit_mib * MIB}
            assert {g.guarantee_bytes for g in held.gpus} == {fraction.request_mib * MIB}
        if adj.allowed and not adj.env:
            # unchanged: not fractional, or started unfenced by a fail-open agent (the node may find
            # more wrong than the contract module can without it, e.g. a device it lacks)
            assert container not in fractions or fail_open


@settings(max_examples=100, deadline=None)
@given(
    pod=st.recursive(
        st.one_of(st.none(), st.text(max_size=5), st.integers()),
        lambda c: st.dictionaries(
            st.sampled_from(["metadata", "spec", "annotations", "containers", "name", "uid", "namespace"]),
            c,
            max_size=4,
        ),
        max_leaves=12,
    )
)
def test_any_document_as_a_pod_gets_an_answer(pod: Any) -> None:
    agent = sim_agent()
    adj = agent.core.create_container(pod if isinstance(pod, dict) else {"spec": pod}, "main")
    assert isinstance(adj, Adjustment)
    # An answer, and a decision: not a crash that the catch-all turned into a refusal.
    assert internal_errors(agent.core) == 0, adj.message
    assert adj.allowed or adj.reason != REASON_CREATE_ERROR, adj.message

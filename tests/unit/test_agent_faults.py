"""The reference agent's newer seeded faults, each breaking exactly one duty (and nothing else)."""

from __future__ import annotations

import pytest
from agent_pods import make_pod, placement

from enforcement.agent.agent import build_parser
from enforcement.agent.environment import (
    ENV_LIMIT,
    ENV_PIPE_DIRECTORY,
    ENV_THREAD_PERCENTAGE,
    ENV_VISIBLE_DEVICES,
)
from enforcement.agent.evictor import choose_victims
from enforcement.agent.kube import REASON_REJECTED
from enforcement.agent.options import FAULT_ALIASES, FAULTS, AgentOptions, canonical_fault
from enforcement.agent.testing import sim_agent
from enforcement.backends import Candidate, GpuPressure
from enforcement.contract import nvidia_key
from enforcement.hook import ContainerRef
from enforcement.sim import SIM_TOKEN_ENV
from workloads.simwire import SimFault, SimOutOfMemory

MIB = 1 << 20
BORROWER = Candidate("borrower", used_bytes=300, guarantee_bytes=100)
WITHIN = Candidate("within", used_bytes=100, guarantee_bytes=100)


def agent(*faults: str):
    return sim_agent((1024, 1024, 1024), options=AgentOptions(node="node-a", faults=frozenset(faults)))


def idle(*candidates: Candidate) -> GpuPressure:
    return GpuPressure(0, "GPU-0", False, 0, 1 << 30, (), 0.0, tuple(candidates), ())


def test_evict_without_pressure_picks_every_borrower_on_an_idle_gpu_and_no_one_within() -> None:
    assert choose_victims([idle(BORROWER, WITHIN)]) == []
    victims = choose_victims([idle(BORROWER, WITHIN)], without_pressure=True)
    assert [v.client for v in victims] == ["borrower"]


def test_ignore_mode_runs_sm_sharing_as_time_slicing_and_nothing_else_changes() -> None:
    a = agent("ignore-mode")
    pod = make_pod("p", placement("main", 64, 128, mode="sm-sharing", portion=0.5))
    adj = a.core.create_container(pod, "main")
    assert adj.allowed
    assert adj.env[ENV_PIPE_DIRECTORY].endswith("/time-slicing") and ENV_THREAD_PERCENTAGE not in adj.env
    held = next(c for c in a.node.snapshot().clients if c.name == "ns/p/main")
    assert held.mode == "time-slicing" and held.gpus[0].hard_limit_bytes == 128 * MIB


def test_wrong_visible_devices_names_other_gpus_than_the_fence() -> None:
    a = agent("wrong-visible-devices")
    uuids = [g.uuid for g in a.node.gpus]
    adj = a.core.create_container(make_pod("p", placement("main", 64, 128, devices=("0",))), "main")
    assert adj.allowed and adj.env[ENV_VISIBLE_DEVICES] != uuids[0]
    assert adj.env[ENV_LIMIT] == "128"
    held = next(c for c in a.node.snapshot().clients if c.name == "ns/p/main")
    assert [g.uuid for g in held.gpus] == [uuids[0]], "the fence itself stays on the assigned GPU"


def test_fail_open_silently_starts_unfenced_and_records_nothing() -> None:
    a = agent("fail-open-silently")
    ann = placement("main", 64, 128)
    ann[nvidia_key("main", ".gpu-memory.request")] = "lots"
    adj = a.core.create_container(make_pod("p", ann), "main")
    assert adj.allowed and dict(adj.env) == {}
    assert a.kube.events == [] and a.node.snapshot().clients == ()


def test_without_faults_a_malformed_contract_is_still_refused_with_an_event() -> None:
    a = agent()
    ann = placement("main", 64, 128)
    ann[nvidia_key("main", ".gpu-memory.request")] = "lots"
    adj = a.core.create_container(make_pod("p", ann), "main")
    assert not adj.allowed and [e.reason for e in a.kube.events] == [REASON_REJECTED]


def test_full_visibility_fences_every_gpu_of_the_node_with_the_containers_own_limit() -> None:
    a = agent("full-visibility")
    uuids = [g.uuid for g in a.node.gpus]
    adj = a.core.create_container(make_pod("p", placement("main", 64, 128, devices=("1",))), "main")
    assert adj.allowed and adj.env[ENV_VISIBLE_DEVICES] == ",".join(uuids) and adj.env[ENV_LIMIT] == "128"
    held = next(c for c in a.node.snapshot().clients if c.name == "ns/p/main")
    assert [g.uuid for g in held.gpus] == uuids and {g.hard_limit_bytes for g in held.gpus} == {128 * MIB}


def test_shared_fault_domain_puts_time_slicing_neighbours_in_one_fault_domain_and_nothing_else_changes() -> (
    None
):
    broken, good = agent("shared-fault-domain"), agent()
    envs: dict[tuple[bool, str], dict[str, str]] = {}
    for a, is_broken in ((broken, True), (good, False)):
        for name in ("faulty", "neighbour"):
            adj = a.core.create_container(make_pod(name, placement("main", 64, 128, devices=("0",))), "main")
            assert adj.allowed
            envs[is_broken, name] = dict(adj.env)
    for name in ("faulty", "neighbour"):
        broken_env, good_env = envs[True, name], envs[False, name]
        assert broken_env[ENV_PIPE_DIRECTORY].endswith("/time-slicing")
        assert {k: v for k, v in broken_env.items() if k != SIM_TOKEN_ENV} == {
            k: v for k, v in good_env.items() if k != SIM_TOKEN_ENV
        }, "the environment (pipe directory, limits, devices) is what it is without the fault"
    for a, is_broken in ((broken, True), (good, False)):
        held = {c.name: c for c in a.node.snapshot().clients}
        assert held["ns/faulty/main"].mode == held["ns/neighbour/main"].mode == "time-slicing"
        assert held["ns/faulty/main"].gpus[0].hard_limit_bytes == 128 * MIB
        faulty, neighbour = (
            a.node.open_context(envs[is_broken, n][SIM_TOKEN_ENV])[0] for n in ("faulty", "neighbour")
        )
        with pytest.raises(SimFault):
            a.node.fault(faulty, 0)
        if is_broken:
            with pytest.raises(SimFault, match="shared fault domain"):
                a.node.alloc(neighbour, 0, MIB)
        else:
            a.node.alloc(neighbour, 0, MIB)  # time-slicing isolates faults: the neighbour runs on


def test_shared_fault_domain_leaves_sm_sharing_as_it_was() -> None:
    a = agent("shared-fault-domain")
    pod = make_pod("p", placement("main", 64, 128, mode="sm-sharing", portion=0.5))
    adj = a.core.create_container(pod, "main")
    assert adj.allowed and adj.env[ENV_PIPE_DIRECTORY].endswith("/sm-sharing")
    assert adj.env[ENV_THREAD_PERCENTAGE] == "50"
    assert a.node.snapshot().clients[0].mode == "sm-sharing"


def test_clobber_neighbour_scrubs_the_neighbours_memory_when_a_container_overruns_and_nothing_else() -> None:
    for is_broken in (True, False):
        a = agent("clobber-neighbour") if is_broken else agent()
        envs = {}
        for name, (request, limit) in (("neighbour", (256, 256)), ("capped", (128, 256))):
            adj = a.core.create_container(
                make_pod(name, placement("main", request, limit, devices=("0",))), "main"
            )
            assert adj.allowed and adj.env[ENV_LIMIT] == str(limit)
            envs[name] = adj.env[SIM_TOKEN_ENV]
        neighbour, capped = (a.node.open_context(envs[n])[0] for n in ("neighbour", "capped"))
        handle = a.node.alloc(neighbour, 0, 200 * MIB).handle
        a.node.touch(neighbour, handle, 0x5A)
        a.node.alloc(capped, 0, 256 * MIB)  # up to its limit: nobody is scrubbed
        assert a.node.verify(neighbour, handle, 0x5A).mismatched_bytes == 0
        with pytest.raises(SimOutOfMemory):  # the hard limit holds either way
            a.node.alloc(capped, 0, MIB)
        lost = a.node.verify(neighbour, handle, 0x5A).mismatched_bytes
        assert lost == (MIB if is_broken else 0)


def test_limit_first_device_only_fences_the_first_of_several_devices_and_nothing_else() -> None:
    for is_broken in (True, False):
        a = agent("limit-first-device-only") if is_broken else agent()
        pair = a.core.create_container(
            make_pod("pair", placement("main", 64, 128, devices=("0", "1"))), "main"
        )
        one = a.core.create_container(make_pod("one", placement("main", 64, 128, devices=("2",))), "main")
        assert pair.allowed and one.allowed and pair.env[ENV_LIMIT] == "128"
        held = {c.name: c for c in a.node.snapshot().clients}
        hard = [g.hard_limit_bytes // MIB for g in held["ns/pair/main"].gpus]
        assert hard == ([128, 1024] if is_broken else [128, 128])
        assert [g.guarantee_bytes // MIB for g in held["ns/pair/main"].gpus] == [64, 64]
        assert held["ns/one/main"].gpus[0].hard_limit_bytes == 128 * MIB  # a single device is fenced


def test_fence_whole_pod_fences_a_sidecar_with_the_pods_fraction_and_nothing_else() -> None:
    for is_broken in (True, False):
        a = agent("fence-whole-pod") if is_broken else agent()
        pod = make_pod("p", placement("main", 64, 128, devices=("0",)), containers=("main", "sidecar"))
        main, sidecar = (a.core.create_container(pod, c) for c in ("main", "sidecar"))
        assert main.allowed and main.env[ENV_LIMIT] == "128" and sidecar.allowed
        clients = sorted(c.name for c in a.node.snapshot().clients)
        if is_broken:
            assert sidecar.env[ENV_LIMIT] == "128" and clients == ["ns/p/main", "ns/p/sidecar"]
        else:
            assert not sidecar.env and clients == ["ns/p/main"]  # the sidecar is not fenced


# ---- earlier names of faults


@pytest.mark.parametrize(("old", "new"), sorted(FAULT_ALIASES.items()))
def test_an_earlier_fault_name_means_its_new_one_everywhere_a_fault_is_named(old: str, new: str) -> None:
    assert new in FAULTS and old not in FAULTS
    assert canonical_fault(old) == new and canonical_fault(new) == new
    assert AgentOptions(node="n", faults=frozenset({old})).faults == frozenset({new})
    assert AgentOptions(node="n", faults=frozenset({old, new})).has(new)
    args = build_parser().parse_args(["--node", "n", "--hook-socket", "/tmp/h.sock", "--fault", old])
    assert args.fault == [new]


def test_the_renamed_faults_still_do_what_the_old_names_did() -> None:
    a = agent("no-borrowing")
    adj = a.core.create_container(make_pod("p", placement("main", 64, 128)), "main")
    assert adj.env[ENV_LIMIT] == "64"
    a = agent("no-release")
    assert a.core.create_container(make_pod("p", placement("main", 64, 128), uid="uid-p"), "main").allowed
    a.core.stop_container(ContainerRef("ns", "p", "uid-p", "main"), 0)
    assert [c.name for c in a.node.snapshot().clients] == ["ns/p/main"], "the client was not released"


def test_an_unknown_fault_is_still_refused_by_the_agents_command_line() -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--node", "n", "--hook-socket", "/tmp/h.sock", "--fault", "no-such"])


def test_accept_bare_number_fences_a_bare_byte_count_as_one_mib_and_nothing_else() -> None:
    a = agent("accept-bare-number")
    ann = placement("main", 64, 128)
    ann[nvidia_key("main", ".gpu-memory.request")] = "4096"
    adj = a.core.create_container(make_pod("p", ann), "main")
    assert adj.allowed and a.kube.events == []
    held = next(c for c in a.node.snapshot().clients if c.name == "ns/p/main")
    assert held.gpus[0].hard_limit_bytes == 128 * MIB
    # A quantity with a unit, zero and a large bare number still read as the contract says.
    for value, allowed in (("lots", False), ("0", False), ("134217728", True)):
        ann[nvidia_key("main", ".gpu-memory.request")] = value
        assert a.core.create_container(make_pod(f"p{value}", ann), "main").allowed is allowed, value
    assert (
        not agent()
        .core.create_container(
            make_pod("p", {**ann, nvidia_key("main", ".gpu-memory.request"): "4096"}), "main"
        )
        .allowed
    )


def test_vague_refusal_refuses_but_its_message_only_echoes_the_value() -> None:
    key = nvidia_key("main", ".gpu-memory.request")
    ann = {**placement("main", 64, 128), key: "bad-gpu-memory"}
    for faults, names in (((), True), (("vague-refusal",), False)):
        a = agent(*faults)
        adj = a.core.create_container(make_pod("p", ann), "main")
        assert not adj.allowed and [e.reason for e in a.kube.events] == [REASON_REJECTED]
        for text in (adj.message, a.kube.events[0].message):
            assert "bad-gpu-memory" in text
            assert (key in text and "memory-quantity" in text) is names, text


@pytest.mark.parametrize("broken", [True, False])
def test_smi_device_used_shows_nvidia_smi_the_neighbours_memory_only(broken: bool) -> None:
    a = agent("smi-device-used") if broken else agent()
    envs = {}
    for name in ("viewer", "neighbour"):
        adj = a.core.create_container(make_pod(name, placement("main", 256, 512, devices=("0",))), "main")
        assert adj.allowed
        envs[name] = adj.env
    neighbour = a.node.open_context(envs["neighbour"][SIM_TOKEN_ENV])[0]
    a.node.alloc(neighbour, 0, 300 * MIB)
    viewer = a.node.open_context(envs["viewer"][SIM_TOKEN_ENV])[0]
    a.node.alloc(viewer, 0, 100 * MIB)
    nvml = a.node.open_context(envs["viewer"][SIM_TOKEN_ENV], cuda=False)[0]
    seen = a.node.meminfo(nvml).devices[0]
    assert seen.total_bytes == 512 * MIB
    assert seen.used_bytes == (400 if broken else 100) * MIB
    # CUDA's own view (cudaMemGetInfo) is the container's either way: only nvidia-smi's is broken.
    assert a.node.meminfo(viewer).devices[0].used_bytes == 100 * MIB


@pytest.mark.parametrize("blank", ["", " ", "\t"])
def test_blank_mode_default_starts_a_blank_mode_as_time_slicing_and_nothing_else(blank: str) -> None:
    mode = nvidia_key("main", ".gpu-compute.mode")
    ann = {**placement("main", 64, 128), mode: blank}
    assert not agent().core.create_container(make_pod("p", ann), "main").allowed, "the reference refuses it"
    a = agent("blank-mode-default")
    adj = a.core.create_container(make_pod("p", ann), "main")
    assert adj.allowed and a.kube.events == []
    assert adj.env[ENV_PIPE_DIRECTORY].endswith("/time-slicing")
    held = next(c for c in a.node.snapshot().clients if c.name == "ns/p/main")
    assert held.mode == "time-slicing" and held.gpus[0].hard_limit_bytes == 128 * MIB
    # Another word, another case and a malformed memory value are refused as without the fault.
    for i, (key, value) in enumerate(
        ((mode, "SM-Sharing"), (mode, "mig"), (nvidia_key("main", ".gpu-memory.request"), "lots"))
    ):
        assert not a.core.create_container(make_pod(f"q{i}", {**ann, key: value}), "main").allowed, value

"""The seeded agent faults the simulated device commits for a broken agent (``ClientRequest.device_faults``)
and ``evict-borrowers-late``: each breaks its one rule and nothing else, in both fidelities."""

from __future__ import annotations

import pytest
from agent_pods import make_pod, placement

from enforcement.agent.evictor import victims_over_long
from enforcement.agent.options import LATE_EVICTION_S, AgentOptions
from enforcement.agent.testing import sim_agent
from enforcement.backends import Candidate, GpuPressure
from enforcement.sim import SIM_TOKEN_ENV
from enforcement.sim.fidelity import H200_CONTEXT_BYTES
from enforcement.sim.model import OUTSIDE_CONTEXT_BYTES, SimNode
from enforcement.sim.topology import make_gpus
from workloads.simwire import SimOutOfMemory

MIB = 1 << 20
FIDELITIES = ("ideal", "h200")


def agent(fidelity: str, *faults: str):
    node = SimNode("node-a", make_gpus("node-a", [4096, 4096, 4096]), fidelity=fidelity)
    return sim_agent(options=AgentOptions(node="node-a", faults=frozenset(faults)), sim_node=node)


def fenced(a, request: int = 512, limit: int = 1024):
    adj = a.core.create_container(
        make_pod("capped", placement("main", request, limit, devices=("0",))), "main"
    )
    assert adj.allowed
    return a.node.open_context(adj.env[SIM_TOKEN_ENV])


def search(a, ctx, piece: int = MIB, ceiling: int = 4096) -> int:
    """Allocate ``piece`` at a time until out of memory (or ``ceiling`` pieces); the bytes granted."""
    got = 0
    for _ in range(ceiling):
        try:
            a.node.alloc(ctx, 0, piece)
        except SimOutOfMemory:
            break
        got += piece
    return got


@pytest.mark.parametrize("fidelity", FIDELITIES)
def test_context_outside_limit_leaves_the_context_out_of_the_limit_and_shows_it_used(fidelity: str) -> None:
    for broken in (False, True):
        a = agent(fidelity, *(["context-outside-limit"] if broken else []))
        ctx, _hello = fenced(a)
        got = search(a, ctx, 2 * MIB)
        used = a.node.meminfo(ctx).devices[0].used_bytes
        context = H200_CONTEXT_BYTES if fidelity == "h200" else (OUTSIDE_CONTEXT_BYTES if broken else 0)
        if broken:  # its allocations reach the limit, and the context comes on top
            assert got == 1024 * MIB and used == 1024 * MIB + context
        else:  # everything it holds, its context included, is within the limit
            assert got == 1024 * MIB - context and used == 1024 * MIB
        assert a.node.snapshot().gpus[0].used_bytes == used


@pytest.mark.parametrize("fidelity", FIDELITIES)
def test_free_sub_page_grants_small_allocations_for_nothing_and_nothing_else(fidelity: str) -> None:
    for broken in (False, True):
        a = agent(fidelity, *(["free-sub-page"] if broken else []))
        ctx, _hello = fenced(a)
        search(a, ctx, 64 * MIB)  # at the boundary of what charged pieces get
        before = a.node.meminfo(ctx).devices[0].used_bytes
        small = search(a, ctx, MIB, ceiling=100)
        # At its limit: broken, a hundred 1 MiB pieces for nothing; else none.
        assert small == (100 * MIB if broken else 0)
        assert a.node.meminfo(ctx).devices[0].used_bytes == before == 1024 * MIB
        with pytest.raises(SimOutOfMemory):  # a page or more is still charged and limited
            a.node.alloc(ctx, 0, 64 * MIB)


@pytest.mark.parametrize("fidelity", FIDELITIES)
def test_cuda_enumerates_all_lists_the_nodes_other_gpus_whole_and_the_memory_view_keeps_its_own(
    fidelity: str,
) -> None:
    for broken in (False, True):
        a = agent(fidelity, *(["cuda-enumerates-all"] if broken else []))
        ctx, hello = fenced(a)
        uuids = [g.uuid for g in a.node.gpus]
        listed = [(d.ordinal, d.uuid, d.total_bytes // MIB) for d in hello.devices]
        if broken:
            assert listed == [(0, uuids[0], 1024), (1, uuids[1], 4096), (2, uuids[2], 4096)]
        else:
            assert listed == [(0, uuids[0], 1024)]
        assert [d.uuid for d in a.node.meminfo(ctx).devices] == [uuids[0]]  # what nvidia-smi reads


def over(name: str) -> GpuPressure:
    borrower = Candidate(name, used_bytes=300, guarantee_bytes=100)
    within = Candidate("within", used_bytes=100, guarantee_bytes=100)
    return GpuPressure(0, "GPU-0", False, 0, 1 << 30, (), 0.0, (borrower, within), ())


def test_evict_borrowers_late_evicts_a_borrower_above_its_request_for_long_pressure_or_not() -> None:
    since: dict[str, float] = {}
    assert victims_over_long([over("b")], since, 100.0) == []
    assert victims_over_long([over("b")], since, 100.0 + LATE_EVICTION_S) == []
    victims = victims_over_long([over("b")], since, 100.1 + LATE_EVICTION_S)
    assert [(v.client, v.reason) for v in victims] == [("b", "pressure")]  # never the one within
    # Back within its request: forgotten, and its time starts again.
    assert victims_over_long([GpuPressure(0, "GPU-0", False, 0, 1, (), 0.0, (), ())], since, 200.0) == []
    assert victims_over_long([over("b")], since, 201.0) == [] and since == {"b": 201.0}

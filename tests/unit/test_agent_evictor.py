"""The soft-limit evictor: whom it picks (largest overage first, never within a guarantee) and how."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest
from agent_pods import make_pod, placement

from enforcement.agent.evictor import Evictor, choose_victims
from enforcement.agent.kube import REASON_EVICTED, REASON_EVICTION_BLOCKED, RecordingKube
from enforcement.agent.options import AgentOptions
from enforcement.agent.testing import SimAgent, sim_agent
from enforcement.backends import Candidate, GpuPressure
from enforcement.sim.admin import client_spec
from workloads.simwire import SIM_TOKEN_ENV, SimFault, SimGone, SimPressure

MIB = 1 << 20


def pressure(shortfall: int, *candidates: Candidate, waiting=("g",), under=True, over=()) -> GpuPressure:
    return GpuPressure(0, "GPU-0", under, shortfall, 0, tuple(waiting), 0.0, tuple(candidates), tuple(over))


A = Candidate("a", used_bytes=200, guarantee_bytes=100)  # overage 100
B = Candidate("b", used_bytes=350, guarantee_bytes=50)  # overage 300
AT = Candidate("at", used_bytes=50, guarantee_bytes=50)  # exactly at its guarantee
UNDER = Candidate("under", used_bytes=40, guarantee_bytes=50)


def names(victims) -> list[str]:
    return [v.client for v in victims]


def test_largest_overage_first_and_only_as_many_as_the_shortfall_needs() -> None:
    assert names(choose_victims([pressure(300, A, B)])) == ["b"]
    assert names(choose_victims([pressure(400, A, B)])) == ["b", "a"]


def test_never_a_client_within_or_at_its_guarantee_even_when_short() -> None:
    assert names(choose_victims([pressure(10_000, UNDER, AT, A, B)])) == ["b", "a"]
    assert choose_victims([pressure(10_000, UNDER, AT)]) == []


def test_nothing_without_pressure() -> None:
    assert choose_victims([pressure(0, A, B, under=False)]) == []


def test_above_the_hard_limit_is_evicted_regardless_of_pressure() -> None:
    over = Candidate("over", used_bytes=900, guarantee_bytes=100, hard_limit_bytes=500)
    victims = choose_victims([pressure(0, A, under=False, over=(over,))])
    assert names(victims) == ["over"] and victims[0].reason == "hard-limit"


def test_skipped_clients_are_passed_over_for_the_next() -> None:
    assert names(choose_victims([pressure(300, A, B)], skip={"b"})) == ["a"]


def test_the_evict_guaranteed_fault_picks_the_waiters() -> None:
    assert names(choose_victims([pressure(300, A, B)], evict_guaranteed=True)) == ["g"]


# ---- end to end on an in-process device


def admit(agent: SimAgent, name: str, request: int, limit: int) -> tuple[dict, str]:
    pod = make_pod(name, placement("main", request, limit))
    adj = agent.core.create_container(pod, "main")
    assert adj.allowed, adj.message
    return pod, adj.env[SIM_TOKEN_ENV]


def fill(agent: SimAgent) -> dict:
    """GPU of 1024 MiB: two borrowers above their guarantees, one guaranteed client short of memory."""
    node = agent.node
    ctxs = {}
    for name, request, limit, hold in (("b1", 64, 900, 400), ("b2", 64, 900, 300)):
        _pod, token = admit(agent, name, request, limit)
        ctxs[name], _ = node.open_context(token)
        node.alloc(ctxs[name], 0, hold * MIB)
    _pod, token = admit(agent, "g", 512, 512)
    ctxs["g"], _ = node.open_context(token)
    with pytest.raises(SimPressure):
        node.alloc(ctxs["g"], 0, 512 * MIB)  # 324 MiB free: the device records g as waiting
    return ctxs


def test_pressure_evicts_the_largest_borrower_through_the_api_and_the_waiter_gets_its_memory() -> None:
    agent = sim_agent((1024,))
    ctxs = fill(agent)
    done = Evictor(agent.core).run_once()
    assert names(done) == ["ns/b1/main"]
    assert [ref.pod for ref, _at in agent.kube.evictions] == ["b1"]
    (event,) = agent.kube.events_for(REASON_EVICTED)
    assert event.ref.pod == "b1" and "400 MiB" in event.message and "336 MiB above" in event.message
    assert "Pod ns/g" in event.message
    agent.node.alloc(ctxs["g"], 0, 512 * MIB)  # the retry succeeds
    with pytest.raises(SimGone):
        agent.node.meminfo(ctxs["b1"])  # the evicted client hears why
    assert agent.core.registry.get("ns/b1/main") is None and agent.core.registry.get("ns/b2/main")
    assert agent.core.metrics.value("gpu_fractioning_agent_evictions_total", reason="pressure") == 1
    assert Evictor(agent.core).run_once() == []  # no pressure left, nothing more


def test_a_blocked_eviction_is_reported_and_retried_later_and_nothing_is_reclaimed() -> None:
    agent = sim_agent((1024,), kube=RecordingKube(evict_outcome="blocked"))
    fill(agent)
    evictor = Evictor(agent.core)
    assert evictor.run_once() == []
    assert agent.kube.reasons()[-1] == REASON_EVICTION_BLOCKED
    assert {c.name for c in agent.node.snapshot().clients} == {"ns/b1/main", "ns/b2/main", "ns/g/main"}
    assert [ref.pod for ref, _at in agent.kube.evictions] == ["b1"]
    # b1 is skipped until its retry time; meanwhile the next round tries the next borrower.
    assert evictor.run_once() == []
    assert [ref.pod for ref, _at in agent.kube.evictions] == ["b1", "b2"]


def test_an_api_error_evicts_nobody() -> None:
    agent = sim_agent((1024,), kube=RecordingKube(fail=True))
    fill(agent)
    assert Evictor(agent.core).run_once() == []
    assert len(agent.node.snapshot().clients) == 3
    assert agent.core.metrics.value("gpu_fractioning_agent_eviction_failures_total") >= 1


def test_a_candidate_the_agent_does_not_fence_is_left_alone() -> None:
    agent = sim_agent((1024,))
    node = agent.node
    outsider = node.attach(client_spec("outsider", ["0"], 64, 900))
    ctx, _ = node.open_context(outsider.token)
    node.alloc(ctx, 0, 700 * MIB)
    _pod, token = admit(agent, "g", 512, 512)
    gctx, _ = node.open_context(token)
    with pytest.raises(SimPressure):
        node.alloc(gctx, 0, 512 * MIB)
    assert Evictor(agent.core).run_once() == []
    assert agent.kube.evictions == []


def test_every_client_of_an_evicted_pod_is_reclaimed() -> None:
    agent = sim_agent((1024, 1024))
    node = agent.node
    ann = {**placement("a", 64, 900, devices=("0",)), **placement("b", 64, 64, devices=("1",))}
    pod = make_pod("two", ann, containers=("a", "b"))
    tokens = {c: agent.core.create_container(pod, c).env[SIM_TOKEN_ENV] for c in ("a", "b")}
    ctx, _ = node.open_context(tokens["a"])
    node.alloc(ctx, 0, 800 * MIB)
    _g, token = admit(agent, "g", 512, 512)
    gctx, _ = node.open_context(token)
    with pytest.raises(SimPressure):
        node.alloc(gctx, 0, 512 * MIB)
    Evictor(agent.core).run_once()
    assert {c.name for c in node.snapshot().clients} == {"ns/g/main"}


def test_no_eviction_fault_evicts_nobody() -> None:
    agent = sim_agent((1024,), options=AgentOptions(node="node-a", faults=frozenset({"no-eviction"})))
    fill(agent)
    assert Evictor(agent.core).run_once() == []


# ---- the eviction mechanisms and the reaction period


def test_evict_by_cuda_error_reclaims_without_the_api_and_the_borrower_faults() -> None:
    agent = sim_agent((1024,), options=AgentOptions(node="node-a", evict_by="cuda-error"))
    ctxs = fill(agent)
    assert names(Evictor(agent.core).run_once()) == ["ns/b1/main"]
    assert agent.kube.evictions == []  # no Eviction API call
    (event,) = agent.kube.events_for(REASON_EVICTED)
    assert event.ref.pod == "b1" and "by a CUDA error" in event.message
    agent.node.alloc(ctxs["g"], 0, 512 * MIB)  # the waiter gets its memory
    with pytest.raises(SimFault, match="cudaErrorMemoryAllocation"):
        agent.node.alloc(ctxs["b1"], 0, MIB)  # the borrower's next call fails
    assert agent.core.registry.get("ns/b1/main") is not None  # its container still runs: not forgotten


def test_evict_by_kill_kills_the_borrowers_processes() -> None:
    agent = sim_agent((1024,), options=AgentOptions(node="node-a", evict_by="kill"))
    node = agent.node
    victim = subprocess.Popen(["sleep", "60"])
    try:
        _pod, token = admit(agent, "b1", 64, 900)
        ctx, _ = node.open_context(token, victim.pid)
        node.alloc(ctx, 0, 700 * MIB)
        _pod, token = admit(agent, "g", 512, 512)
        gctx, _ = node.open_context(token)
        with pytest.raises(SimPressure):
            node.alloc(gctx, 0, 512 * MIB)
        assert names(Evictor(agent.core).run_once()) == ["ns/b1/main"]
        assert victim.wait(timeout=10) == -signal.SIGKILL
        assert agent.kube.evictions == []
        node.alloc(gctx, 0, 512 * MIB)
    finally:
        victim.kill()
        victim.wait()


def test_a_reaction_period_delays_the_eviction_until_the_pressure_lasted_that_long() -> None:
    agent = sim_agent((1024,), options=AgentOptions(node="node-a", reaction_period_s=0.3))
    fill(agent)
    evictor = Evictor(agent.core)
    assert evictor.run_once() == []  # the pressure has just begun
    time.sleep(0.35)
    assert names(evictor.run_once()) == ["ns/b1/main"]


def test_a_reaction_period_delays_but_never_hides_what_the_evictor_chose() -> None:
    """Found by the mutation run in the h200 fidelity: a period counted from the pressure alone hid the
    seeded fault evict-without-pressure (no pressure, so never old enough) from the suite."""
    options = AgentOptions(node="node-a", reaction_period_s=0.3, faults=frozenset({"evict-without-pressure"}))
    agent = sim_agent((1024,), options=options)
    _pod, token = admit(agent, "b1", 64, 900)
    ctx, _ = agent.node.open_context(token)
    agent.node.alloc(ctx, 0, 300 * MIB)  # borrowing, no pressure at all
    evictor = Evictor(agent.core)
    assert evictor.run_once() == []
    time.sleep(0.35)
    assert names(evictor.run_once()) == ["ns/b1/main"]


def test_unknown_mechanisms_and_negative_periods_are_refused() -> None:
    with pytest.raises(ValueError, match="eviction mechanism"):
        AgentOptions(node="n", evict_by="ask-nicely")
    with pytest.raises(ValueError, match="reaction period"):
        AgentOptions(node="n", reaction_period_s=-1)


# ---- the seeded faults evict-all-borrowers and evict-guaranteed-for-borrower


def test_the_evict_all_borrowers_fault_takes_every_borrower_though_one_covers_the_shortfall() -> None:
    assert names(choose_victims([pressure(300, A, B, UNDER)])) == ["b"]
    assert names(choose_victims([pressure(300, A, B, UNDER)], every_borrower=True)) == ["b", "a"]
    assert choose_victims([pressure(0, A, B, under=False)], every_borrower=True) == []


def contend(agent: SimAgent) -> dict:
    """GPU of 1024 MiB: a keeper within its guarantee, a borrower at 300 MiB past its request, and a
    second borrower that took every idle byte (no guaranteed client waits)."""
    node = agent.node
    ctxs = {}
    for name, request, limit, hold in (("keeper", 200, 200, 200), ("b1", 64, 900, 364), ("b2", 64, 900, 460)):
        _pod, token = admit(agent, name, request, limit)
        ctxs[name], _ = node.open_context(token)
        node.alloc(ctxs[name], 0, hold * MIB)
    return ctxs


def test_a_borrower_that_filled_its_gpu_gets_nobody_evicted_by_the_reference() -> None:
    agent = sim_agent((1024,))
    contend(agent)
    assert Evictor(agent.core).run_once() == []
    assert agent.kube.evictions == []


def test_the_evict_guaranteed_for_borrower_fault_evicts_the_keeper_for_the_borrowers_growth() -> None:
    options = AgentOptions(node="node-a", faults=frozenset({"evict-guaranteed-for-borrower"}))
    agent = sim_agent((1024,), options=options)
    contend(agent)
    done = Evictor(agent.core).run_once()
    assert names(done) == ["ns/keeper/main"]
    assert [ref.pod for ref, _at in agent.kube.evictions] == ["keeper"]
    # With room left on the GPU the fault does nothing: a full GPU is what it reads as a claim.
    agent = sim_agent((2048,), options=options)
    contend(agent)
    assert Evictor(agent.core).run_once() == []


def full(agent: SimAgent) -> dict:
    """GPU of 1024 MiB: two borrowers past their request that together hold all but 64 MiB of it,
    nobody within a guarantee (no pressure)."""
    node = agent.node
    ctxs = {}
    for name, request, limit, hold in (("b1", 128, 512, 500), ("b2", 128, 512, 460)):
        _pod, token = admit(agent, name, request, limit)
        ctxs[name], _ = node.open_context(token)
        node.alloc(ctxs[name], 0, hold * MIB)
    return ctxs


def test_borrowers_that_fill_their_gpu_without_pressure_get_nobody_evicted_by_the_reference() -> None:
    agent = sim_agent((1024,))
    full(agent)
    assert Evictor(agent.core).run_once() == []
    assert agent.kube.evictions == []


def test_the_evict_when_full_fault_evicts_the_largest_borrower_of_a_nearly_full_gpu() -> None:
    options = AgentOptions(node="node-a", faults=frozenset({"evict-when-full"}))
    agent = sim_agent((1024,), options=options)
    full(agent)
    done = Evictor(agent.core).run_once()
    assert names(done) == ["ns/b1/main"] and done[0].reason == "pressure" and done[0].for_clients == ()
    assert [ref.pod for ref, _at in agent.kube.evictions] == ["b1"]
    # With more than a tenth of the GPU free the fault does nothing: a nearly full GPU is its trigger.
    agent = sim_agent((2048,), options=options)
    full(agent)
    assert Evictor(agent.core).run_once() == []

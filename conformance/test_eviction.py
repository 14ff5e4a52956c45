"""Soft limits: a borrower is evicted under real pressure, and only then; a guarantee is never taken.

docs/contract.md §6. Memory between a container's request and its limit is borrowed: allocations
succeed while the GPU has idle memory. When a neighbour within its own guarantee needs memory the
GPU no longer has, that is *pressure*: a borrower above its request is evicted so that the
neighbour gets its guarantee. Without pressure nobody is evicted, and a container within its
request is never evicted, however hard the pressure.

The scenarios share their sizes (shares of one GPU, each above 0.2 so that they stay side by side
through a scheduler, see ``fixtures.suite.scenario``): a borrower asks for 0.25 and may grow to 0.9,
and takes all the idle memory; a guaranteed neighbour then asks for memory only an eviction can
free. A guaranteed workload retries its allocation while it is refused under pressure (the
simulated device refuses rather than blocks; on a real GPU the allocation waits or fails), for at
most ``PRESSURE_WAIT_S``: the time from pressure to memory available is recorded.
"""

from __future__ import annotations

from typing import Any, Final

from conformance.judgements import EvictionEffect, eviction_effect, within
from fixtures.suite.checks import Needs, check
from fixtures.suite.frame import Suite, fail
from fixtures.suite.reaction import hold_s, reaction_wait_s
from fixtures.suite.scenario import Outcome, Stage, mib, plan, require

MIB: Final = 1 << 20
PRESSURE_WAIT_S: Final = 10.0
"""How long a guaranteed workload retries under pressure (refused, or out of memory as a real GPU
says it) at least; and at least ``fixtures.suite.reaction.WAIT_PERIODS`` reaction periods."""
RETRY_S: Final = 0.05
BEAT_S: Final = 0.1
HOLD_S: Final = 1.0


def borrower_plan(stage: Stage, request: int) -> dict[str, Any]:
    """Hold the request, then take every idle byte up to the limit; Ready; beat until stopped."""
    return plan(
        "borrower",
        {"op": "alloc", "bytes": mib(within(request)), "label": "guarantee"},
        {"op": "alloc-until-oom", "granularity": mib(max(1, stage.mib(0.01))), "label": "borrowed"},
        {"op": "touch"},
        {"op": "ready"},
        {"op": "heartbeat", "interval": BEAT_S, "until_signal": "SIGTERM"},
    )


def holder_plan(name: str, size: int) -> dict[str, Any]:
    """Hold ``size`` MiB less the headroom (within its guarantee of ``size``); Ready; beat until stopped."""
    return plan(
        name,
        {"op": "alloc", "bytes": mib(within(size))},
        {"op": "touch"},
        {"op": "ready"},
        {"op": "heartbeat", "interval": BEAT_S, "until_signal": "SIGTERM"},
    )


def claimant_plan(name: str, size: int, suite: Suite) -> dict[str, Any]:
    """Allocate its guarantee of ``size`` MiB (less the headroom), retrying while refused under
    pressure or out of memory (the eviction it waits for has not landed yet)."""
    wait = reaction_wait_s(suite.options, PRESSURE_WAIT_S)
    return plan(
        name,
        {
            "op": "alloc",
            "bytes": mib(within(size)),
            "retry_on_pressure": wait,
            "retry_on_oom": wait,
            "retry_interval": RETRY_S,
        },
        {"op": "touch"},
        {"op": "meminfo"},
    )


def must_be_ready(stage: Stage, name: str, why: str) -> None:
    ended = stage.wait_ready(name)
    if ended is not None:
        require(ended, (), why)


def effects(outcomes: list[Outcome], requests: dict[str, int]) -> dict[str, EvictionEffect]:
    """Each workload's eviction, judged by its effect (``conformance.judgements.eviction_effect``)."""
    return {o.name: eviction_effect(o, requests.get(o.name)) for o in outcomes}


def eviction_fact(
    suite: Suite, evicted: list[Outcome], kept: list[Outcome], claim: Outcome, seen: dict[str, EvictionEffect]
) -> None:
    """Who was evicted under pressure (and by what mechanism) and who kept running, and how long the
    claimant waited."""
    granted = claim.step("alloc").get("ms")
    suite.evidence.fact(
        "eviction",
        {
            "evicted": [o.name for o in evicted if seen[o.name].evicted],
            "kept": [o.name for o in kept if not seen[o.name].evicted],
            "reason": ", ".join(sorted({seen[o.name].mechanism for o in evicted if seen[o.name].evicted})),
            "mechanisms": {name: e.as_fact() for name, e in seen.items()},
            "seconds": round(float(granted) / 1000, 3) if granted is not None else None,
        },
    )


def pressure_resolved(out: Outcome) -> dict[str, Any]:
    """How the claimant's allocation went: attempts under pressure and the time until it was granted."""
    step = out.step("alloc")
    resolved = step.get("pressure_resolved") or {}
    return {
        "grantedAfterMs": step.get("ms"),
        "attemptsUnderPressure": resolved.get("attempts", 1 if step.get("outcome") == "ok" else None),
        "refusedAs": resolved.get("refused_as"),
        "candidates": resolved.get("candidates"),
        "outcome": step.get("outcome"),
    }


@check(
    id="soft-limit-eviction",
    level="MUST",
    statement="When a workload within its gpu-memory.request needs memory that borrowers above their request "
    "hold, a borrower MUST be evicted and the workload MUST then get its memory.",
    profiles=("node", "stack", "probe"),
    features=("soft-limit-eviction",),
    seed="000/2",
    needs=Needs(nodes=1, gpus=1, idle=True),
)
def test_soft_limit_eviction(suite: Suite) -> None:
    stage = Stage(suite)
    request = stage.mib(0.25)
    borrower = stage.place(
        "borrower", borrower_plan(stage, request), request_mib=request, limit_mib=stage.mib(0.9)
    )
    must_be_ready(stage, borrower.name, "on an idle GPU it may take the idle memory up to its limit")
    claim = stage.mib(0.5)
    claimant = stage.place("claimant", claimant_plan("claimant", claim, suite), request_mib=claim)
    got = stage.wait_ended(claimant.name)
    suite.evidence.fact("pressure", pressure_resolved(got))
    lent = stage.stop(borrower.name)
    suite.evidence.fact("borrower", lent.as_dict())
    seen = effects([lent, got], {borrower.name: request})
    eviction_fact(suite, [lent], [got], got, seen)
    if not seen[lent.name].evicted:
        raise fail(
            f"{borrower.name} borrowed beyond its request of {request} MiB and was not evicted when "
            f"{claimant.name} "
            f"needed {claim} MiB within its guarantee (claimant ended {got.status or got.phase}): it neither "
            "ended nor lost the memory above its request"
        )
    require(got, ("ok",), f"after the borrower's eviction its {claim} MiB guarantee must be available to it")


@check(
    id="guarantee-kept",
    level="MUST",
    statement="A workload within its gpu-memory.request MUST NOT be evicted, however hard the memory "
    "pressure on its GPU.",
    profiles=("node", "stack"),
    features=("soft-limit-eviction",),
    seed="000/2",
    needs=Needs(nodes=1, gpus=1, idle=True),
)
def test_guarantee_kept(suite: Suite) -> None:
    stage = Stage(suite)
    kept = stage.mib(0.3)
    keeper = stage.place("keeper", holder_plan("keeper", kept), request_mib=kept)
    must_be_ready(stage, keeper.name, f"it holds {kept} MiB within its own guarantee on an idle GPU")
    request = stage.mib(0.25)
    borrower = stage.place(
        "borrower", borrower_plan(stage, request), request_mib=request, limit_mib=stage.mib(0.9)
    )
    must_be_ready(stage, borrower.name, "it may take the GPU's idle memory up to its limit")
    claim = stage.mib(0.4)
    claimant = stage.place("claimant", claimant_plan("claimant", claim, suite), request_mib=claim)
    got = stage.wait_ended(claimant.name)
    suite.evidence.fact("pressure", pressure_resolved(got))
    held = stage.stop(keeper.name)
    lent = stage.stop(borrower.name)
    suite.evidence.fact(
        "outcomes", {"keeper": held.as_dict(), "claimant": got.as_dict(), "borrower": lent.as_dict()}
    )
    seen = effects([lent, held, got], {borrower.name: request})
    eviction_fact(suite, [lent, held, got], [held, got], got, seen)
    evicted = [o for o in (held, got) if seen[o.name].evicted and o.status != "unexpected-oom"]
    if evicted:
        raise fail(
            "evicted within their guarantee: "
            + "; ".join(f"{o.name} ({seen[o.name].mechanism}: {seen[o.name].detail})" for o in evicted)
            + f" (the GPU was under pressure because {borrower.name} borrowed beyond its request of "
            f"{request} MiB)"
        )
    require(held, ("ok",), f"it held {kept} MiB within its guarantee and must keep running")
    beat = held.step("heartbeat")
    if beat.get("used_min") and min(beat["used_min"]) < within(kept) * MIB:
        raise fail(f"{keeper.name} held {kept} MiB within its guarantee but lost some of it under pressure")
    require(got, ("ok",), f"its {claim} MiB are within its guarantee")


@check(
    id="no-eviction-without-pressure",
    level="MUST",
    statement="Borrowers above their gpu-memory.request on a GPU that still has free memory MUST NOT be "
    "evicted.",
    profiles=("node", "stack"),
    features=("soft-limit-eviction",),
    seed="000/2",
    needs=Needs(nodes=1, gpus=1, idle=True),
)
def test_no_eviction_without_pressure(suite: Suite) -> None:
    stage = Stage(suite)
    request, limit = stage.mib(0.25), stage.mib(0.4)
    names = [
        stage.pod(
            f"borrower-{i}",
            plan(
                f"borrower-{i}",
                {"op": "alloc", "bytes": mib(within(request)), "label": "guarantee"},
                {"op": "alloc", "bytes": mib(within(limit) - within(request)), "label": "borrowed"},
                {"op": "touch"},
                # Long enough for an agent that evicts wrongly to have done it: reaction periods.
                {"op": "heartbeat", "interval": BEAT_S, "seconds": hold_s(suite.options, HOLD_S)},
                {"op": "meminfo"},
            ),
            request_mib=request,
            limit_mib=limit,
        )
        for i in range(2)
    ]
    placed = [stage.placed(n) for n in names]
    outcomes = [stage.wait_ended(p.name) for p in placed]
    suite.evidence.fact("borrowers", {o.name: o.as_dict() for o in outcomes})
    seen = effects(outcomes, {p.name: request for p in placed})
    suite.evidence.fact("mechanisms", {name: e.as_fact() for name, e in seen.items()})
    evicted = [o for o in outcomes if seen[o.name].evicted and o.status != "unexpected-oom"]
    if evicted:
        raise fail(
            f"evicted while borrowing {limit - request} MiB each on a GPU with "
            f"{stage.memory_mib - 2 * limit} MiB still free: "
            + ", ".join(f"{o.name} ({seen[o.name].mechanism}: {seen[o.name].detail})" for o in evicted)
        )
    for out in outcomes:
        require(out, ("ok",), f"it may borrow up to its limit of {limit} MiB while the GPU has free memory")

"""Soft limits: a borrower is evicted under real pressure, and only then; a guarantee is never taken.

docs/contract.md §6. Memory between a container's request and its limit is borrowed: allocations
succeed while the GPU has idle memory. When a neighbour within its own guarantee needs memory the
GPU no longer has, that is *pressure*: a borrower above its request is evicted so that the
neighbour gets its guarantee. Without pressure nobody is evicted, and a container within its
request is never evicted, however hard the pressure.

The scenarios share their sizes (shares of one GPU, each above 0.2 so that they stay side by side
through a scheduler, see ``fixtures.suite.scenario``): borrowers hold memory past their request, one
of them every idle byte; a guaranteed claimant then asks for memory only an eviction can free. A
guaranteed workload retries its allocation while it is refused under pressure (the simulated device
refuses rather than blocks; on a real GPU the allocation waits or fails), for at most
``PRESSURE_WAIT_S``: the time from pressure to memory available is recorded.

Eviction is judged by its effect (``conformance.judgements.eviction_effect``), and only once the
figures show the pressure it is about (``judge_pressure``): each borrower held more than its request
when it said Ready, and the claimant lacked memory. Otherwise the rule is not judged, and the
evidence keeps the figures. Under pressure only what is needed goes: a borrower, never a workload
within its guarantee, and no more borrowers than the claimant's shortfall requires
(``needless_evictions``: each of two borrowers alone covers it); a borrower that grows into a full
GPU, contending with another, is no claim and gets nobody evicted; and borrowers that fill the GPU
between them, with nobody within a guarantee asking, are no pressure: nobody is evicted.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Final

from conformance.judgements import (
    EvictionEffect,
    PressureVerdict,
    claim_figures,
    device_fidelity,
    eviction_effect,
    headroom_mib,
    held_when_ready,
    judge_pressure,
    needless_evictions,
    within,
)
from fixtures.suite.checks import Needs, check
from fixtures.suite.frame import Suite, fail
from fixtures.suite.reaction import LONG_BORROW_S, hold_s, reaction_wait_s
from fixtures.suite.scenario import NotJudged, Outcome, Placed, Stage, plan, require
from workloads.plan import MiB, alloc, heartbeat, meminfo, ready, search_boundary, touch

PRESSURE_WAIT_S: Final = 10.0
"""How long a guaranteed workload retries under pressure (refused, or out of memory as a real GPU
says it) at least; and at least ``fixtures.suite.reaction.WAIT_PERIODS`` reaction periods."""
RETRY_S: Final = 0.05
BEAT_S: Final = 0.1
HOLD_S: Final = 1.0


def borrower_plan(
    stage: Stage, request: int, name: str = "borrower", floor: int | None = None
) -> dict[str, Any]:
    """Hold the request, then ``floor`` MiB in all (where given: a Ready one is known to hold that
    much past its request, result or not), then take every idle byte up to the limit; count what it
    holds; Ready; beat until stopped."""
    fixed = [] if floor is None else [alloc(floor - within(request), label="borrowed")]
    return plan(
        name,
        alloc(within(request), label="guarantee"),
        *fixed,
        search_boundary(granularity_mib=max(1, stage.mib(0.01)), label="grown"),
        touch(),
        meminfo(),
        ready(),
        heartbeat(BEAT_S, until_signal="SIGTERM"),
    )


def lender_plan(name: str, request: int, limit: int) -> dict[str, Any]:
    """A borrower of a fixed size: its request, then up to its limit (less the headroom), so that a
    Ready one is known to hold past its request; count what it holds; Ready; beat until stopped."""
    return plan(
        name,
        alloc(within(request), label="guarantee"),
        alloc(within(limit) - within(request), label="borrowed"),
        touch(),
        meminfo(),
        ready(),
        heartbeat(BEAT_S, until_signal="SIGTERM"),
    )


def holder_plan(name: str, size: int) -> dict[str, Any]:
    """Hold ``size`` MiB less the headroom (within its guarantee of ``size``); Ready; beat until stopped."""
    return plan(name, alloc(within(size)), touch(), ready(), heartbeat(BEAT_S, until_signal="SIGTERM"))


def claimant_plan(name: str, size: int, suite: Suite) -> dict[str, Any]:
    """Allocate its guarantee of ``size`` MiB (less the headroom), retrying while refused under
    pressure or out of memory (the eviction it waits for has not landed yet)."""
    wait = reaction_wait_s(suite.options, PRESSURE_WAIT_S)
    return plan(
        name,
        # What it sees before it asks: on a full GPU (a real one, the simulated H200) less than its claim.
        meminfo(),
        alloc(within(size), retry_on_pressure_s=wait, retry_on_oom_s=wait, retry_interval_s=RETRY_S),
        touch(),
        meminfo(),
    )


def two_borrowers(
    stage: Stage, request: int, lent_limit: int, floor: int, *, grown_limit: int, lender_why: str
) -> tuple[Placed, Placed]:
    """Two borrowers side by side, each Ready before the scenario goes on: ``borrower-0`` at its limit
    of ``lent_limit`` MiB (less the headroom), ``borrower-1`` growing into every idle byte up to
    ``grown_limit``, holding at least ``floor`` MiB in all once Ready."""
    lender = stage.place(
        "borrower-0",
        lender_plan("borrower-0", request, lent_limit),
        request_mib=request,
        limit_mib=lent_limit,
    )
    stage.must_be_ready(lender.name, lender_why)
    grower = stage.place(
        "borrower-1",
        borrower_plan(stage, request, "borrower-1", floor),
        request_mib=request,
        limit_mib=grown_limit,
    )
    stage.must_be_ready(grower.name, "it may take the GPU's idle memory up to its limit")
    return lender, grower


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


Borrowers = list[tuple[Outcome, Placed, int | None]]
"""Each borrower's outcome, placement, and what its plan is known to hold once Ready (for one that
wrote no result; None: nothing past its request)."""


def pressure_figures(suite: Suite, borrowers: Borrowers, claim: Outcome, asked: int) -> PressureVerdict:
    """The figures of the pressure (``conformance.judgements.judge_pressure``), in the evidence."""
    verdict = judge_pressure(
        {o.name: (held_when_ready(o, floor), p.request_mib) for o, p, floor in borrowers},
        claim.name,
        claim_figures(claim, asked),
    )
    suite.evidence.fact("pressureShown", verdict.as_fact())
    return verdict


def pressure_shown(suite: Suite, borrowers: Borrowers, claim: Outcome, asked: int) -> PressureVerdict:
    """``pressure_figures``; the eviction rule is not judged unless they show the pressure."""
    verdict = pressure_figures(suite, borrowers, claim, asked)
    if not verdict.shown:
        raise NotJudged(
            "eviction under pressure not judged, the figures do not show pressure: "
            + "; ".join(verdict.missing)
        )
    return verdict


@check(
    id="soft-limit-eviction",
    level="MUST",
    statement="When a workload within its gpu-memory.request needs memory that borrowers above their request "
    "hold, a borrower MUST be evicted and the workload MUST then get its memory; borrowers MUST NOT be "
    "evicted beyond what its shortfall requires.",
    profiles=("node", "stack", "probe"),
    features=("soft-limit-eviction",),
    seed="000/2",
    needs=Needs(nodes=1, gpus=1, idle=True),
)
def test_soft_limit_eviction(suite: Suite) -> None:
    stage = Stage(suite)
    request, lent_limit = stage.mib(0.25), stage.mib(0.45)
    # Two borrowers, each of which alone holds more than the claimant needs: one at its limit, one
    # with every idle byte left (at least as much past its request).
    floor = within(stage.mib(0.5))
    lender, borrower = two_borrowers(
        stage,
        request,
        lent_limit,
        floor,
        grown_limit=stage.mib(0.9),
        lender_why="on an idle GPU it may borrow up to its limit",
    )
    claim = stage.mib(0.3)
    asked = within(claim)
    claimant = stage.place("claimant", claimant_plan("claimant", claim, suite), request_mib=claim)
    got = stage.wait_ended(claimant.name)
    suite.evidence.fact("pressure", pressure_resolved(got))
    lent = [stage.stop(lender.name), stage.stop(borrower.name)]
    suite.evidence.fact("borrowers", {o.name: o.as_dict() for o in lent})
    seen = effects([*lent, got], {lender.name: request, borrower.name: request})
    eviction_fact(suite, lent, [got], got, seen)
    pressure = pressure_shown(
        suite, [(lent[0], lender, within(lent_limit)), (lent[1], borrower, floor)], got, asked
    )
    evicted = [o for o in lent if seen[o.name].evicted]
    if not evicted:
        raise fail(
            f"{', '.join(o.name for o in lent)} borrowed beyond their request of {request} MiB and none was "
            f"evicted when {claimant.name} needed {claim} MiB within its guarantee (claimant ended "
            f"{got.status or got.phase}): none ended or lost the memory above its request"
        )
    held = {name: int(f["heldMiB"]) for name, f in pressure.figures["borrowers"].items()}
    free = max(0, stage.memory_mib - sum(held.values()))
    needless = needless_evictions({o.name: held[o.name] for o in evicted}, free, asked)
    suite.evidence.fact(
        "shortfall",
        {
            "askedMiB": asked,
            "freeMiB": free,
            "shortfallMiB": max(0, asked - free),
            "evictedHeldMiB": {o.name: held[o.name] for o in evicted},
            "needless": needless,
        },
    )
    if needless:
        raise fail(
            f"{len(evicted)} borrowers were evicted ("
            + ", ".join(f"{o.name} holding {held[o.name]} MiB: {seen[o.name].mechanism}" for o in evicted)
            + f") for {claimant.name}, short of {max(0, asked - free)} MiB of the {asked} MiB it asked for: "
            f"{' and '.join(needless)} {'was' if len(needless) == 1 else 'were each'} not needed (without "
            "it, the GPU's free memory and the other evicted borrowers' already covered the shortfall)"
        )
    require(got, ("ok",), f"after a borrower's eviction its {claim} MiB guarantee must be available to it")


@check(
    id="guarantee-kept",
    level="MUST",
    statement="A workload within its gpu-memory.request MUST NOT be evicted, however hard the memory "
    "pressure on its GPU, nor to make room for borrowers growing past their request.",
    profiles=("node", "stack"),
    features=("soft-limit-eviction",),
    seed="000/2",
    needs=Needs(nodes=1, gpus=1, idle=True),
)
def test_guarantee_kept(suite: Suite) -> None:
    stage = Stage(suite)
    kept = stage.mib(0.26)
    keeper = stage.place("keeper", holder_plan("keeper", kept), request_mib=kept)
    stage.must_be_ready(keeper.name, f"it holds {kept} MiB within its own guarantee on an idle GPU")
    request, lent_limit = stage.mib(0.22), stage.mib(0.4)
    # borrower-1 grows into what the keeper and borrower-0 left (0.34 of the GPU): past its request for
    # sure up to 0.3 (less the headroom), which a Ready one holds whether or not it writes a result.
    floor = within(stage.mib(0.3))
    lender, borrower = two_borrowers(
        stage,
        request,
        lent_limit,
        floor,
        grown_limit=stage.mib(0.9),
        lender_why="it may borrow up to its limit while the GPU has idle memory",
    )
    # Two borrowers contend for a full GPU, and nobody within a guarantee claims anything: long enough
    # (reaction periods) for an agent that reads a borrower's growth as a claim to have acted.
    contended = hold_s(suite.options, HOLD_S)
    time.sleep(contended)
    running = {p.name: stage.running(p.name) for p in (keeper, lender, borrower)}
    suite.evidence.fact(
        "contention",
        {
            "holdS": contended,
            "running": running,
            "notJudged": "whether a borrower was evicted while the borrowers contended (no guaranteed claim)",
        },
    )
    if not running[keeper.name]:
        early = stage.wait_ended(keeper.name)
        effect = eviction_effect(early, kept)
        if not effect.evicted:
            require(early, (), f"it held {kept} MiB within its guarantee and must keep running")
        raise fail(
            f"{keeper.name} was evicted within its guarantee ({effect.mechanism}: {effect.detail}) while "
            f"{borrower.name} and {lender.name} borrowed past their request of {request} MiB and filled the "
            "GPU, with no workload within its guarantee claiming memory: a borrower's growth is no claim"
        )
    claim = stage.mib(0.28)
    claimant = stage.place("claimant", claimant_plan("claimant", claim, suite), request_mib=claim)
    got = stage.wait_ended(claimant.name)
    suite.evidence.fact("pressure", pressure_resolved(got))
    held = stage.stop(keeper.name)
    lent = [stage.stop(lender.name), stage.stop(borrower.name)]
    suite.evidence.fact(
        "outcomes",
        {"keeper": held.as_dict(), "claimant": got.as_dict(), **{o.name: o.as_dict() for o in lent}},
    )
    seen = effects([*lent, held, got], {lender.name: request, borrower.name: request})
    eviction_fact(suite, [*lent, held, got], [held, got], got, seen)
    borrowed: Borrowers = [(lent[0], lender, within(lent_limit)), (lent[1], borrower, floor)]
    evicted = [o for o in (held, got) if seen[o.name].evicted and o.status != "unexpected-oom"]
    if evicted:
        # Evicted within a guarantee is a failure whatever the pressure; the figures say how much there was.
        pressure_figures(suite, borrowed, got, within(claim))
        raise fail(
            "evicted within their guarantee: "
            + "; ".join(f"{o.name} ({seen[o.name].mechanism}: {seen[o.name].detail})" for o in evicted)
            + f" (the GPU was under pressure because {lender.name} and {borrower.name} borrowed beyond "
            f"their request of {request} MiB)"
        )
    pressure_shown(suite, borrowed, got, within(claim))
    require(held, ("ok",), f"it held {kept} MiB within its guarantee and must keep running")
    beat = held.step("heartbeat")
    if beat.get("used_min") and min(beat["used_min"]) < within(kept) * MiB:
        raise fail(f"{keeper.name} held {kept} MiB within its guarantee but lost some of it under pressure")
    require(got, ("ok",), f"its {claim} MiB are within its guarantee")


FULL_SHARE: Final = 0.5
"""Each of the two borrowers' limit, as a share of the GPU: together their limits are its memory."""


def fill_figures(gpu_mib: int, outcomes: Sequence[Outcome], limit_mib: int) -> dict[str, Any]:
    """What the borrowers held of a GPU of ``gpu_mib`` while they held, from each one's ``meminfo``
    before Ready (its own used memory, and the free memory it saw: on a device that bounds it by what
    the GPU has left, the GPU's), and what their sum leaves free: nothing else holds memory on the
    stage's GPU. ``full``: the free memory is at most what their limits (``limit_mib`` each) leave of
    the GPU plus one headroom each (``headroom_mib``: the one tolerance rule's size, which every plan
    leaves on every device); None where a borrower left no figures."""
    held: dict[str, int | None] = {}
    free_seen: dict[str, int | None] = {}
    fidelity = None
    for out in outcomes:
        devices = out.step("meminfo").get("devices") or []
        held[out.name] = int(devices[0].get("used") or 0) // MiB if devices else None
        free_seen[out.name] = int(devices[0].get("free") or 0) // MiB if devices else None
        fidelity = fidelity or device_fidelity(out.result)
    counted = [h for h in held.values() if h is not None]
    used = sum(counted) if len(counted) == len(held) else None
    allowance = max(0, gpu_mib - len(outcomes) * limit_mib) + len(outcomes) * headroom_mib(limit_mib)
    free = None if used is None else gpu_mib - used
    return {
        "gpuMiB": gpu_mib,
        "limitMiB": limit_mib,
        "heldMiB": held,
        "freeSeenMiB": free_seen,
        "deviceUsedMiB": used,
        "deviceFreeMiB": free,
        "headroomMiB": headroom_mib(limit_mib),
        "fullWithinMiB": allowance,
        "full": None if free is None else free <= allowance,
        "fidelity": fidelity,
    }


@check(
    id="no-eviction-without-pressure",
    level="MUST",
    statement="Borrowers above their gpu-memory.request MUST NOT be evicted while no workload within its "
    "guarantee lacks memory, even when together they fill the GPU.",
    profiles=("node", "stack"),
    features=("soft-limit-eviction",),
    seed="000/2",
    needs=Needs(nodes=1, gpus=1, idle=True),
)
def test_no_eviction_without_pressure(suite: Suite) -> None:
    stage = Stage(suite)
    # Limits that sum to the GPU's memory: one borrower holds its limit less the one headroom, the
    # other grows into every idle byte up to its own (to within a granule: the tolerance's size), so
    # the GPU is full, and nobody within a guarantee asks for anything. Pressure is a guarantee that
    # cannot be met (docs/contract.md §6), not a GPU without free memory.
    request, limit = stage.mib(0.25), stage.mib(FULL_SHARE)
    # borrower-1 is past its request for sure once Ready, whatever it found beside borrower-0 (half
    # the GPU left).
    floor = within(stage.mib(0.4))
    lender, grower = two_borrowers(
        stage,
        request,
        limit,
        floor,
        grown_limit=limit,
        lender_why=f"on an idle GPU it may borrow up to its limit of {limit} MiB",
    )
    # Both hold, the GPU full: long enough (reaction periods) for an agent that evicts wrongly to act.
    # A borrower kept for tens of seconds (a late reconcile loop) is burst-borrowing's long hold.
    held_s = hold_s(suite.options, HOLD_S)
    suite.not_judged(
        f"borrowers kept for {LONG_BORROW_S:g} s or more",
        f"judged by burst-borrowing in the node profile; here the full GPU is held {held_s:g} s",
    )
    time.sleep(held_s)
    running = {p.name: stage.running(p.name) for p in (lender, grower)}
    outcomes = [stage.stop(lender.name), stage.stop(grower.name)]
    suite.evidence.fact("borrowers", {o.name: o.as_dict() for o in outcomes})
    full = fill_figures(stage.memory_mib, outcomes, limit)
    suite.evidence.fact("full", {**full, "holdS": held_s, "runningAfterHold": running})
    if not full["full"]:
        # Still judged (nobody lacked memory), but not on the full GPU the statement names.
        suite.not_judged(
            "on a full GPU",
            f"the borrowers left {full['deviceFreeMiB']} MiB of the GPU's {stage.memory_mib} MiB free "
            f"(full: at most {full['fullWithinMiB']} MiB), or left no figures of what they held",
        )
    seen = effects(outcomes, {lender.name: request, grower.name: request})
    suite.evidence.fact("mechanisms", {name: e.as_fact() for name, e in seen.items()})
    evicted = [o for o in outcomes if seen[o.name].evicted and o.status != "unexpected-oom"]
    if evicted:
        free = full["deviceFreeMiB"]
        raise fail(
            f"evicted while borrowing past a request of {request} MiB (limits of {limit} MiB, together the "
            f"GPU's {stage.memory_mib} MiB; {'unknown' if free is None else free} MiB of it free) with "
            "nobody within a guarantee short of memory: "
            + ", ".join(f"{o.name} ({seen[o.name].mechanism}: {seen[o.name].detail})" for o in evicted)
        )
    for out in outcomes:
        require(out, ("ok",), f"it may borrow up to its limit of {limit} MiB while no guarantee lacks memory")

"""Memory limits: the hard limit stops an allocation at the limit; up to it, a workload borrows.

docs/contract.md §6. The hard limit is where an allocation fails with out-of-memory, as on a smaller
GPU; the workload finds it by ``alloc-until-oom`` (doubling, then halving to its granularity). On
the simulated device the boundary is the limit exactly; on a real GPU the CUDA context, the
allocator's granularity and driver reservations sit inside the limit, so the boundary may lie a
little below it (a stated tolerance) and never above. Borrowing: a workload grows from its request
to its limit while the GPU has idle memory, and keeps it while nobody needs it back.

Each scenario runs in the ``node`` profile (the suite places the Pods: a failure is the node
agent's) and the ``stack`` profile (through the scheduler under test).
"""

from __future__ import annotations

import time
from typing import Any, Final

from conformance.judgements import (
    device_fidelity,
    eviction_effect,
    judge_boundary,
    judge_charged,
    kept_bytes,
    search_overran,
    searches_by_device,
    within,
)
from fixtures.suite.checks import Needs, check
from fixtures.suite.frame import FINISH_S, START_S, Suite, fail
from fixtures.suite.reaction import LONG_BORROW_S, hold_s, long_hold_s
from fixtures.suite.scenario import NotJudged, Stage, plan, require
from workloads.plan import MiB, alloc, heartbeat, meminfo, ready, search_boundary, touch, verify

GRANULARITY_MIB: Final = 1
HOLD_S: Final = 1.0
BEAT_S: Final = 0.1


@check(
    id="hard-limit-oom",
    level="MUST",
    statement="An allocation that would take a container past its gpu-memory.limit MUST fail with "
    "out-of-memory at the limit (never above it), and a neighbour on the same GPU MUST keep running "
    "with every byte it held.",
    profiles=("node", "stack", "probe"),
    seed="000/2",
    needs=Needs(nodes=1, gpus=1, idle=True),
)
def test_hard_limit_oom(suite: Suite) -> None:
    stage = Stage(suite)
    guarantee = stage.mib(0.25)
    held = within(guarantee)  # what it holds within its guarantee, leaving the real-GPU headroom
    neighbour = stage.place(
        "neighbour",
        plan(
            "neighbour",
            alloc(held),
            touch(),
            ready(),
            heartbeat(BEAT_S, until_signal="SIGTERM"),
            # Every byte it held: read back what the touch wrote (a usage count misses scrubbed pages).
            verify(),
        ),
        request_mib=guarantee,
    )
    stage.must_be_ready(
        neighbour.name, f"it holds {held} MiB within its own guarantee and limit on an idle GPU"
    )
    capped = stage.place(
        "capped",
        plan(
            "capped",
            search_boundary(granularity_mib=GRANULARITY_MIB),
            meminfo(),
            # A moment alive after the out-of-memory: does the stack end the container?
            heartbeat(BEAT_S, count=3),
        ),
        request_mib=stage.mib(0.25),
        limit_mib=stage.mib(0.5),
    )
    out = stage.wait_ended(capped.name)
    search = out.step("alloc-until-oom")
    if not search:
        require(out, ("ok",), "alloc-until-oom must run to the boundary and report it")
    found_mib = int(search.get("max_bytes", 0)) // MiB
    limit = capped.limit_mib
    oom = search.get("oom") or {}
    terminated = out.status != "ok"
    verdict = judge_boundary(found_mib, limit, device_fidelity(out.result), capped.name, search)
    shown = out.step("meminfo").get("devices") or []
    charged = judge_charged(capped.name, shown[0] if shown else None, capped.written_limit_mib, found_mib)
    if charged.not_judged:
        suite.not_judged("what the device counts against the limit", charged.not_judged)
    suite.evidence.fact(
        "boundary",
        {
            **verdict.as_fact(),
            "charged": charged.as_fact(),
            "granularityMiB": GRANULARITY_MIB,
            "device": (out.result or {}).get("device"),
            "stoppedBy": search.get("stopped_by"),
            "errorType": oom.get("error_type"),
            "containerTerminatedAfterOom": terminated,
            "exit": out.as_dict(),
        },
    )
    time.sleep(3 * BEAT_S)  # a few of the neighbour's heartbeats after its neighbour's end, or their absence
    late = stage.stop(neighbour.name)
    overran = search_overran(capped.name, search, limit)
    problems = [overran or verdict.problem] if overran or verdict.problem else []
    if charged.problem:
        problems.append(charged.problem)
    if not overran and (search.get("stopped_by") != "oom" or not oom.get("error_type")):
        problems.append(
            f"{capped.name}'s search ended by {search.get('stopped_by')!r}, not by an out-of-memory error"
        )
    beat = late.step("heartbeat")
    read_back = late.step("verify")
    capped_end = float((out.result or {}).get("started_at") or 0) + float(
        (out.result or {}).get("wall_s") or 0
    )
    # "corrupted" is the read-back's own verdict after a heartbeat that ran to the signal: judged below.
    if late.status not in ("ok", "corrupted") or beat.get("ended_by") != "signal":
        problems.append(
            f"the neighbour {neighbour.name} did not keep running: it ended {late.status or late.phase} "
            f"({(late.result or {}).get('error', {}).get('message') or late.reason})"
        )
    else:
        if beat.get("used_min") and min(beat["used_min"]) < held * MiB:
            problems.append(
                f"the neighbour {neighbour.name} held {held} MiB but the device counted as little as "
                f"{min(beat['used_min']) // MiB} MiB for it while its neighbour ran out of memory"
            )
        lost = kept_bytes(f"the neighbour {neighbour.name}", held, read_back)
        if lost:
            problems.append(f"{lost} while {capped.name} ran into its limit beside it")
        if capped_end and float(beat.get("last_at") or 0) < capped_end and not problems:
            raise NotJudged(
                f"the neighbour's last heartbeat ({beat.get('last_at')}) came before {capped.name} ended "
                f"({capped_end:.3f}): nothing shows it outlived the out-of-memory"
            )
    suite.evidence.fact(
        "neighbour",
        {
            "heartbeat": beat,
            "readBack": {k: read_back.get(k) for k in ("outcome", "bytes", "mismatched", "bad")},
            "heldMiB": held,
            "keptEveryByte": bool(read_back) and not kept_bytes(neighbour.name, held, read_back),
            "exit": late.as_dict(),
        },
    )
    if problems:
        raise fail("; ".join(problems))


@check(
    id="hard-limit-each-device",
    level="MUST",
    statement="In a container given several GPUs, an allocation that would take it past its "
    "gpu-memory.limit on any one of them MUST fail with out-of-memory at the limit on that GPU (never "
    "above it): the limit holds on each device, not only the first.",
    profiles=("node", "stack"),
    features=("multi-device",),
    seed="003/4",
    needs=Needs(nodes=1, gpus=2, idle=True),
)
def test_hard_limit_each_device(suite: Suite) -> None:
    devices = 2
    stage = Stage(suite, gpus=devices)
    # Each device searched in turn, what the search found kept held: a limit shared among the
    # devices (not per device) shows as the second device's boundary falling short.
    searches = [
        search_boundary(granularity_mib=GRANULARITY_MIB, device=d, label=f"device-{d}")
        for d in range(devices)
    ]
    capped = stage.place(
        "capped",
        plan("capped", *searches, meminfo()),
        request_mib=stage.mib(0.25),
        limit_mib=stage.mib(0.5),
        devices=devices,
    )
    if len(capped.gpus) != devices:
        raise fail(
            f"{capped.name} asked for {devices} GPUs and was bound to {len(capped.gpus)}: {capped.devices}"
        )
    out = stage.wait_ended(capped.name)
    found = searches_by_device(out.result)
    if len(found) < devices:
        require(out, ("ok",), f"alloc-until-oom must run to the boundary on each of its {devices} devices")
    fidelity = device_fidelity(out.result)
    shown = {int(d.get("i") or 0): d for d in out.step("meminfo").get("devices") or []}
    problems: list[str] = []
    facts: dict[str, Any] = {}
    for ordinal in range(devices):
        search = found.get(ordinal) or {}
        who = f"{capped.name} on its device {ordinal} (GPU {capped.gpus[ordinal]})"
        found_mib = int(search.get("max_bytes", 0)) // MiB
        verdict = judge_boundary(found_mib, capped.limit_mib, fidelity, who, search)
        charged = judge_charged(who, shown.get(ordinal), capped.written_limit_mib, found_mib)
        if charged.not_judged:
            suite.not_judged(f"what device {ordinal} counts against the limit", charged.not_judged)
        oom = search.get("oom") or {}
        facts[str(ordinal)] = {
            **verdict.as_fact(),
            "gpu": capped.gpus[ordinal],
            "stoppedBy": search.get("stopped_by"),
            "errorType": oom.get("error_type"),
            "charged": charged.as_fact(),
        }
        overran = search_overran(who, search, capped.limit_mib)
        if overran or verdict.problem:
            problems.append(overran or verdict.problem)
        if charged.problem:
            problems.append(charged.problem)
        if not overran and (search.get("stopped_by") != "oom" or not oom.get("error_type")):
            problems.append(f"{who}: the search ended by {search.get('stopped_by')!r}, not by out-of-memory")
    suite.evidence.fact(
        "boundaries", {"granularityMiB": GRANULARITY_MIB, "devices": facts, "exit": out.as_dict()}
    )
    if problems:
        raise fail("; ".join(problems))


@check(
    id="burst-borrowing",
    level="MUST",
    statement="On an otherwise idle GPU a workload MUST be able to grow from its gpu-memory.request to its "
    "gpu-memory.limit and keep that memory for as long as no guaranteed neighbour needs it, without being "
    "evicted.",
    profiles=("node", "stack", "probe"),
    seed="000/2",
    needs=Needs(nodes=1, gpus=1, idle=True),
)
def test_burst_borrowing(suite: Suite) -> None:
    stage = Stage(suite)
    request, limit = stage.mib(0.25), stage.mib(0.75)
    # Up to its limit, less the headroom a real GPU's context and pages take inside it.
    total = within(limit)
    # "For as long as nobody needs it": in the node profile, which judges the node agent, long enough
    # for a reconcile loop of tens of seconds that evicts borrowers late (pressure or not) to act.
    # Its stack twin judges the scheduler's part and holds only the reaction periods.
    long = suite.profile == "node"
    held_for = long_hold_s(suite.options) if long else hold_s(suite.options, HOLD_S)
    if not long:
        suite.not_judged(
            f"keeping the borrowed memory for {LONG_BORROW_S:g} s or more",
            f"judged in the node profile (this {suite.profile} run held it {held_for:g} s)",
        )
    borrower = stage.place(
        "borrower",
        plan(
            "borrower",
            alloc(within(request), label="guarantee"),
            alloc(total - within(request), chunk_mib=max(1, (total - within(request)) // 4)),
            touch(),
            heartbeat(max(BEAT_S * 2, held_for / 60), seconds=held_for),
            meminfo(),
        ),
        request_mib=request,
        limit_mib=limit,
    )
    out = stage.wait_ended(borrower.name, timeout=START_S + held_for + FINISH_S)
    beat = out.step("heartbeat")
    # How far into the hold it got: the heartbeat's own count, else the time its step ran until it failed.
    into = (
        beat.get("s")
        if beat.get("s") is not None
        else (round(beat["ms"] / 1000, 1) if beat.get("ms") else None)
    )
    shown = out.step("meminfo").get("devices") or []
    used = int(shown[0].get("used", 0)) // MiB if shown else None
    effect = eviction_effect(out)
    suite.evidence.fact(
        "borrowing",
        {
            "requestMiB": borrower.request_mib,
            "limitMiB": borrower.limit_mib,
            "askedMiB": total,
            "heldMiB": used,
            "holdS": held_for,
            "heldForS": into,
            "beats": beat.get("beats"),
            "held": out.status == "ok" and not effect.evicted and used is not None and used >= total,
            "eviction": effect.as_fact(),
            "exit": out.as_dict(),
        },
    )
    if effect.evicted and out.status != "unexpected-oom":
        raise fail(
            f"{borrower.name} was evicted ({effect.mechanism}: {effect.detail}) while borrowing "
            f"{borrower.limit_mib - borrower.request_mib} MiB on a GPU nobody else used, "
            f"{into if into is not None else 'an unknown time'} s into its {held_for:g} s hold: there was "
            "no pressure"
        )
    require(
        out,
        ("ok",),
        f"on an idle GPU it may grow from its request of {borrower.request_mib} MiB to {total} MiB "
        f"(its limit of {borrower.limit_mib} MiB less the headroom a real GPU needs) and keep it",
    )
    if used is not None and used < total:
        raise fail(f"{borrower.name} held {total} MiB, but the device counted only {used} MiB after the hold")

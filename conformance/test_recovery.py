"""Recovery: after the node agent restarts, running workloads keep their fences and new ones are fenced.

docs/contract.md §8 (seed 000's rollout path: "check ... recovery after the node agent restarts").
An agent is restarted for every upgrade; it must not take its workloads' limits with it. With
workloads running, the check restarts the agent of its leased node (``fixtures.suite.agentcontrol``: the
agent's Pod is deleted and its DaemonSet brings it back, or, for an agent run as a local process,
the restart hook its Node announces), and then:

- a running workload's hard limit still holds: an allocation past it fails with out-of-memory;
- a running borrower is still evicted when a guaranteed neighbour, started after the restart,
  needs its memory (the restarted agent knows it again);
- that new workload is fenced: its own limit holds;
- the agent still knows which compute mode each GPU runs: a container of the other mode, created
  after the restart on a GPU a workload from before it holds, does not start and says the modes
  conflict, either way round (an sm-sharing one beside time-slicing, and one with no mode, so
  time-slicing, beside sm-sharing; an agent that rebuilds its fences but reads every adopted
  client back as the default mode refuses only the first);
- it still refuses a malformed placement (fail closed), as before the restart.

The last two need placements no correct scheduler writes: they are judged in the ``node`` profile
(the suite writes the placement), and named as not judged in ``stack``. The mode part needs
sm-sharing (the feature), and its second direction a second GPU on the leased node; what cannot be
judged is named. Their Pods are created together right after the one restart, and judged after the
claimant, so they add no wait of their own.

The running workload learns *when* to try its allocation from SIGTERM: it beats until the check
stops it after the restart, then runs the rest of its plan within its grace period.
"""

from __future__ import annotations

import time
from typing import Final

from conformance.judgements import (
    Intrusion,
    device_fidelity,
    eviction_effect,
    judge_boundary,
    judge_charged,
    within,
)
from conformance.test_compute import hold_plan, intrude, intruder_plan, said_by, settle_intrusions
from conformance.test_failclosed import EXPLAIN_S, QUIET_S, Malformed, cases, placement, refusal_verdict
from enforcement.contract import SM_SHARING, TIME_SLICING
from fixtures.suite.agentcontrol import restart_agent
from fixtures.suite.checks import Needs, check
from fixtures.suite.frame import Suite, fail
from fixtures.suite.manifests import placement_annotations
from fixtures.suite.reaction import reaction_wait_s
from fixtures.suite.scenario import CONTAINER, Placed, Stage, plan
from fixtures.suite.waiting import WaitTimeout, wait_until
from workloads.plan import MiB, alloc, heartbeat, meminfo, ready, search_boundary

BEAT_S: Final = 0.1
PRESSURE_WAIT_S: Final = 15.0


@check(
    id="agent-restart",
    level="MUST",
    statement="After the node agent restarts, running workloads MUST keep their limits (an allocation "
    "past the limit still fails, a borrower is still evicted under pressure), new workloads MUST be "
    "fenced, and (node profile) the agent MUST still know each GPU's compute mode (a container of the "
    "other mode created after the restart does not start, either way round) and MUST still refuse a "
    "malformed placement.",
    profiles=("node", "stack"),
    features=("agent-restart",),
    seed="000/4",
    needs=Needs(nodes=1, gpus=1, idle=True),
)
def test_agent_restart(suite: Suite) -> None:
    by_hand = suite.profile == "node"
    modes = by_hand and "sm-sharing" in suite.options.supported_features
    stage = Stage(suite, gpus=2 if modes and suite.node.gpu_count >= 2 else 1)
    request, limit = stage.mib(0.25), stage.mib(0.35)
    capped = stage.place(
        "capped",
        plan(
            "capped",
            alloc(within(request), label="before"),
            ready(),
            heartbeat(BEAT_S, until_signal="SIGTERM"),
            # Stopped after the restart: the limit must still hold, and the room below it be there,
            # judged as hard-limit-oom judges its boundary (conformance.judgements.judge_boundary).
            search_boundary(granularity_mib=1, label="after"),
            # What the device counts then, its context included: within the limit (judge_charged).
            meminfo(),
        ),
        request_mib=request,
        limit_mib=limit,
    )
    stage.must_be_ready(capped.name, f"it allocates {request} MiB within its guarantee on a GPU with room")
    borrower = stage.place(
        "borrower",
        plan(
            "borrower",
            alloc(within(stage.mib(0.25)), label="guarantee"),
            search_boundary(granularity_mib=stage.mib(0.01)),
            ready(),
            heartbeat(BEAT_S, until_signal="SIGTERM"),
        ),
        request_mib=stage.mib(0.25),
        limit_mib=stage.mib(0.9),
    )
    stage.must_be_ready(borrower.name, "it may take the GPU's idle memory up to its limit")

    shared = _sm_holder(stage) if modes else None

    restarted = restart_agent(suite.cluster, stage.node.name, suite.options)
    suite.evidence.fact("restart", restarted.as_dict())
    intrusions, malformed = _after_restart(suite, stage, capped, shared, by_hand=by_hand, modes=modes)

    claim, claim_limit = stage.mib(0.3), stage.mib(0.4)
    claimant = stage.place(
        "claimant",
        plan(
            "claimant",
            alloc(
                within(claim),
                retry_on_pressure_s=reaction_wait_s(suite.options, PRESSURE_WAIT_S),
                retry_on_oom_s=reaction_wait_s(suite.options, PRESSURE_WAIT_S),
                retry_interval_s=0.05,
            ),
            search_boundary(granularity_mib=1),
        ),
        request_mib=claim,
        limit_mib=claim_limit,
    )
    got = stage.wait_ended(claimant.name)
    kept = stage.stop(capped.name)
    lent = stage.stop(borrower.name)
    suite.evidence.fact(
        "after",
        {"capped": kept.as_dict(), "borrower": lent.as_dict(), "claimant": got.as_dict()},
    )
    problems = []
    beat = kept.step("heartbeat")
    search = kept.step("alloc-until-oom")
    kept_found = within(request) + int(search.get("max_bytes", 0)) // MiB
    kept_verdict = judge_boundary(kept_found, limit, device_fidelity(kept.result), capped.name, search)
    shown = kept.step("meminfo").get("devices") or []
    charged = judge_charged(capped.name, shown[0] if shown else None, capped.written_limit_mib, kept_found)
    if charged.not_judged and shown:
        suite.not_judged("what the device counts against the limit after the restart", charged.not_judged)
    lent_effect = eviction_effect(lent, stage.mib(0.25))
    facts = {
        "capped": {**kept_verdict.as_fact(), "charged": charged.as_fact()},
        "borrowerEviction": lent_effect.as_fact(),
    }
    if beat.get("ended_by") != "signal":
        problems.append(
            f"{capped.name} did not survive the restart: {kept.status or kept.phase} "
            f"({((kept.result or {}).get('error') or {}).get('message') or kept.reason})"
        )
    elif kept.status != "ok" or search.get("stopped_by") != "oom":
        problems.append(
            f"after the restart {capped.name} could not search for its limit of {limit} MiB: {kept.status} "
            f"(stopped by {search.get('stopped_by')})"
        )
    elif not kept_verdict.ok:
        problems.append(f"after the restart, {kept_verdict.problem}")
    elif charged.problem:
        problems.append(f"after the restart, {charged.problem}")
    if not lent_effect.evicted:
        problems.append(
            f"after the restart {borrower.name} borrowed beyond its request and was not evicted when "
            f"{claimant.name} needed {claim} MiB within its guarantee ({got.status or got.phase})"
        )
    elif got.status != "ok":
        problems.append(
            f"{claimant.name}, started after the restart, did not get its guarantee: {got.status}"
        )
    else:
        claimed = got.step("alloc-until-oom")
        found = int(claimed.get("max_bytes", 0)) // MiB + within(claim)
        verdict = judge_boundary(found, claim_limit, device_fidelity(got.result), claimant.name, claimed)
        facts["claimant"] = verdict.as_fact()
        if not verdict.ok:
            problems.append(
                f"{claimant.name}, started after the restart: {verdict.problem}: its limit was not applied"
            )
    suite.evidence.fact("boundaries", facts)
    # The report's boundary: the capped workload's, whose search the limit bounded (the borrower's
    # and the claimant's searches were bounded by what the GPU had left, or their own limit).
    suite.evidence.fact("boundary", {**kept_verdict.as_fact(), "workload": capped.name})
    problems += _judge_after_restart(suite, stage, intrusions, malformed)
    if problems:
        raise fail("; ".join(problems))


def _sm_holder(stage: Stage) -> Placed | None:
    """An sm-sharing workload on the stage's second GPU, running across the restart (None: one GPU)."""
    if stage.gpus < 2:
        return None
    size = stage.mib(0.1)
    shared = stage.place("shared", hold_plan("shared"), request_mib=size, mode=SM_SHARING, slot=1)
    stage.must_be_ready(shared.name, "it runs sm-sharing alone on an idle GPU")
    return shared


def _after_restart(
    suite: Suite, stage: Stage, capped: Placed, shared: Placed | None, *, by_hand: bool, modes: bool
) -> tuple[list[Intrusion], Malformed | None]:
    """Right after the restart, the Pods the restarted agent must refuse: a container of the other mode
    on each GPU a workload from before the restart holds, and one malformed placement. What cannot
    be judged here is named."""
    if not by_hand:
        why = (
            f"the {suite.profile} profile places through the scheduler, which never writes a conflicting "
            "mode or a malformed placement; judged in the node profile"
        )
        suite.not_judged("modes after the restart", why)
        suite.not_judged("malformed placement after the restart", why)
        return [], None
    intrusions: list[Intrusion] = []
    if not modes:
        suite.not_judged("modes after the restart", "the implementation does not support sm-sharing")
    else:
        intrusions.append(intrude(stage, "shared-after-restart", 0, SM_SHARING, capped))
        if shared is None:
            suite.not_judged(
                "time-slicing beside sm-sharing after the restart",
                f"node {stage.node.name} has one GPU, which runs time-slicing across the restart",
            )
        else:
            intrusions.append(intrude(stage, "unset-after-restart", 1, None, shared))
    part = suite.options.node_part()
    case = next((c for c in cases(stage.node.gpu_count) if part.who_refuses(c.name) == "node"), None)
    if case is None:
        suite.not_judged(
            "malformed placement after the restart",
            f"{part.implementation} gives no malformed case to the node agent",
        )
        return intrusions, None
    size = stage.mib(0.05)
    valid = placement_annotations(CONTAINER, size, size, stage.free[:1], TIME_SLICING)
    stage.pod(
        case.name,
        intruder_plan(case.name),
        request_mib=size,
        annotations=placement(valid, case),
    )
    return intrusions, case


def _judge_after_restart(
    suite: Suite, stage: Stage, intrusions: list[Intrusion], malformed: Malformed | None
) -> list[str]:
    """The restarted agent's refusals: each intrusion by the mode guard's judgement, the malformed case
    by fail-closed's (that it does not start and says so; what it names is fail-closed's to judge)."""
    problems: list[str] = []
    if intrusions:
        seen = settle_intrusions(suite, stage, intrusions)
        suite.evidence.fact("modesAfterRestart", seen)
        problems += [f"after the restart, {f['problem']}" for f in seen.values() if f["problem"]]
    if malformed is not None:
        said: list[str] = []

        def settled() -> bool:
            said[:] = said_by(suite, [malformed.name])[malformed.name]
            started = stage.ran(malformed.name)
            return refusal_verdict(malformed, started, said, False, final=False) is not None

        try:
            wait_until(settled, f"{malformed.name} to be refused", suite.timeout(EXPLAIN_S))
        except WaitTimeout:
            pass  # the verdict below says how it did not settle
        time.sleep(suite.timeout(QUIET_S))  # a refusal that is followed by a start is no refusal
        said[:] = said_by(suite, [malformed.name])[malformed.name]
        problem = refusal_verdict(malformed, stage.ran(malformed.name), said, False)
        suite.evidence.fact(
            "malformedAfterRestart",
            {
                "case": malformed.name,
                "key": malformed.key,
                "value": malformed.shown,
                "started": stage.ran(malformed.name),
                "said": said[-3:],
            },
        )
        if problem:
            problems.append(f"after the restart, {problem}")
    return problems

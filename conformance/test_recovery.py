"""Recovery: after the node agent restarts, running workloads keep their fences and new ones are fenced.

docs/contract.md §8 (seed 000's rollout path: "check ... recovery after the node agent restarts").
An agent is restarted for every upgrade; it must not take its workloads' limits with it. With
workloads running, the check restarts the agent of its leased node (``fixtures.suite.agentcontrol``: the
agent's Pod is deleted and its DaemonSet brings it back, or, for an agent run as a local process,
the restart hook its Node announces), and then:

- a running workload's hard limit still holds: an allocation past it fails with out-of-memory;
- a running borrower is still evicted when a guaranteed neighbour, started after the restart,
  needs its memory (the restarted agent knows it again);
- that new workload is fenced: its own limit holds.

The running workload learns *when* to try its allocation from SIGTERM: it beats until the check
stops it after the restart, then runs the rest of its plan within its grace period.
"""

from __future__ import annotations

from typing import Final

from conformance.judgements import device_fidelity, eviction_effect, judge_boundary, within
from fixtures.suite.agentcontrol import restart_agent
from fixtures.suite.checks import Needs, check
from fixtures.suite.frame import Suite, fail
from fixtures.suite.reaction import reaction_wait_s
from fixtures.suite.scenario import Stage, mib, plan, require

MIB: Final = 1 << 20
BEAT_S: Final = 0.1
PRESSURE_WAIT_S: Final = 15.0


@check(
    id="agent-restart",
    level="MUST",
    statement="After the node agent restarts, running workloads MUST keep their limits (an allocation "
    "past the "
    "limit still fails, a borrower is still evicted under pressure) and new workloads MUST be fenced.",
    profiles=("node", "stack"),
    features=("agent-restart",),
    seed="000/4",
    needs=Needs(nodes=1, gpus=1, idle=True),
)
def test_agent_restart(suite: Suite) -> None:
    stage = Stage(suite)
    request, limit = stage.mib(0.25), stage.mib(0.35)
    capped = stage.place(
        "capped",
        plan(
            "capped",
            {"op": "alloc", "bytes": mib(within(request)), "label": "before"},
            {"op": "ready"},
            {"op": "heartbeat", "interval": BEAT_S, "until_signal": "SIGTERM"},
            # Stopped after the restart: the limit must still hold, and the room below it be there,
            # judged as hard-limit-oom judges its boundary (conformance.judgements.judge_boundary).
            {"op": "alloc-until-oom", "granularity": mib(1), "label": "after"},
        ),
        request_mib=request,
        limit_mib=limit,
    )
    ended = stage.wait_ready(capped.name)
    if ended is not None:
        require(ended, (), f"it allocates {request} MiB within its guarantee on a GPU with room")
    borrower = stage.place(
        "borrower",
        plan(
            "borrower",
            {"op": "alloc", "bytes": mib(within(stage.mib(0.25))), "label": "guarantee"},
            {"op": "alloc-until-oom", "granularity": mib(stage.mib(0.01))},
            {"op": "ready"},
            {"op": "heartbeat", "interval": BEAT_S, "until_signal": "SIGTERM"},
        ),
        request_mib=stage.mib(0.25),
        limit_mib=stage.mib(0.9),
    )
    ended = stage.wait_ready(borrower.name)
    if ended is not None:
        require(ended, (), "it may take the GPU's idle memory up to its limit")

    restarted = restart_agent(suite.cluster, stage.node.name, suite.options)
    suite.evidence.fact("restart", restarted.as_dict())

    claim, claim_limit = stage.mib(0.3), stage.mib(0.4)
    claimant = stage.place(
        "claimant",
        plan(
            "claimant",
            {
                "op": "alloc",
                "bytes": mib(within(claim)),
                "retry_on_pressure": reaction_wait_s(suite.options, PRESSURE_WAIT_S),
                "retry_on_oom": reaction_wait_s(suite.options, PRESSURE_WAIT_S),
                "retry_interval": 0.05,
            },
            {"op": "alloc-until-oom", "granularity": mib(1)},
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
    kept_found = within(request) + int(search.get("max_bytes", 0)) // MIB
    kept_verdict = judge_boundary(kept_found, limit, device_fidelity(kept.result), capped.name, search)
    lent_effect = eviction_effect(lent, stage.mib(0.25))
    facts = {"capped": kept_verdict.as_fact(), "borrowerEviction": lent_effect.as_fact()}
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
        found = int(claimed.get("max_bytes", 0)) // MIB + within(claim)
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
    if problems:
        raise fail("; ".join(problems))

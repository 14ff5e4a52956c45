"""The probe's checks: each a catalog check of the ``probe`` profile, judged in process.

Every check builds the annotated Pods a scheduler would, runs them through the ``Session``, and
judges with the suite's own judgement functions (``conformance.judgements``, the fail-closed
verdict): one statement, one judgement, wherever it runs. ``CHECKS`` maps each catalog id to its
function, its old probe name and the ``conformance`` module that declares it.
"""

from __future__ import annotations

import shutil
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from conformance.judgements import (
    EvictionEffect,
    Intrusion,
    device_fidelity,
    eviction_effect,
    judge_boundary,
    judge_intrusion,
    judge_smi_view,
    kept_bytes,
    within,
)
from workloads.plan import MiB

if TYPE_CHECKING:
    from enforcement.contract import Mode
    from fixtures.suite.checks import Check

from conformance.probe.session import (
    PRESSURE_RETRY_S,
    WORKLOAD_TIMEOUT_S,
    CheckFailed,
    CheckSkipped,
    Session,
)

# ---------------------------------------------------------------------------------------- checks


def _effect(s: Session, pod: Mapping[str, Any], name: str, run: Any, request_mib: int) -> EvictionEffect:
    """Was the workload of ``pod`` evicted, by the suite's judgement of the effect
    (``conformance.judgements.eviction_effect``)? The probe has no API server: the agent's Eviction
    API call, which ``RecordingKube`` keeps, stands for the Pod's ``DisruptionTarget`` condition."""
    from enforcement.agent.kube import pod_ref
    from fixtures.suite.scenario import Outcome

    evicted = pod_ref(pod).pod in [ref.pod for ref, _at in s.kube.evictions]
    out = Outcome(
        name=name,
        phase="Succeeded" if run.exit_code == 0 else "Failed",
        exit_code=run.exit_code,
        reason="",
        result=run.result or None,
        deleted=evicted,
        disruption="EvictionByEvictionAPI" if evicted else "",
    )
    return eviction_effect(out, request_mib)


def _placement(
    request_mib: int, limit_mib: int, devices: Sequence[str] = ("0",), mode: Mode = "time-slicing"
) -> dict[str, str]:
    from fixtures.suite.manifests import placement_annotations

    return placement_annotations("main", request_mib, limit_mib, devices, mode)


def _step(result: Mapping[str, Any], op: str) -> dict[str, Any]:
    for step in result.get("steps", ()):
        if step.get("op") == op:
            return dict(step)
    return {}


def _refused(adjustment: Any) -> None:
    if not adjustment.allowed:
        raise CheckFailed(f"the agent refused a valid container: {adjustment.message}")


def check_hard_limit(s: Session) -> tuple[str, dict[str, Any]]:
    import signal

    cap = s.capacity_mib
    request, limit = max(1, cap // 8), max(2, cap // 4)
    gran = MiB if s.simulated else 64 * MiB
    held = max(1, cap // 8)
    n_pod, n_adj = s.admit(_placement(held, held), "neighbour")
    _refused(n_adj)
    n_plan = {
        "name": "neighbour",
        "steps": [
            {"op": "alloc", "bytes": within(held) * MiB},  # the headroom a real GPU's context needs
            {"op": "touch"},
            {"op": "heartbeat", "interval": 0.1, "until_signal": "SIGTERM"},
            # Every byte it held, as the suite's check judges it: read back what the touch wrote (a
            # usage count misses pages scrubbed behind its back).
            {"op": "verify"},
        ],
    }
    neighbour = s.run(n_pod, n_adj, n_plan)
    neighbour.wait_for("heartbeat 1", WORKLOAD_TIMEOUT_S, or_exit=True)
    pod, adj = s.admit(_placement(request, limit))
    _refused(adj)
    plan = {
        "name": "hard-limit",
        "steps": [{"op": "alloc-until-oom", "granularity": gran, "limit": 2 * limit * MiB}],
    }
    run = s.finish(s.run(pod, adj, plan), "hard-limit")
    step = _step(run.result, "alloc-until-oom")
    got = int(step.get("max_bytes", -1))
    oom = step.get("oom") or {}
    evidence = {
        "limit_bytes": limit * MiB,
        "max_allocated_bytes": got,
        "stopped_by": step.get("stopped_by"),
        "oom": oom,
        "exit_code": run.exit_code,
    }
    verdict = judge_boundary(got // MiB, limit, "ideal" if s.simulated else "real", search=step)
    evidence["boundary"] = verdict.as_fact()
    time.sleep(0.3)  # a few of the neighbour's heartbeats after the out-of-memory
    neighbour.proc.send_signal(signal.SIGTERM)
    n_run = s.finish(neighbour, "neighbour")
    beat = _step(n_run.result, "heartbeat")
    read_back = _step(n_run.result, "verify")
    lost = kept_bytes("the neighbour", within(held), read_back)
    evidence["neighbour"] = {
        "status": n_run.result.get("status"),
        "heartbeat": beat,
        "held_bytes": within(held) * MiB,
        "read_back": {k: read_back.get(k) for k in ("outcome", "bytes", "mismatched", "bad")},
        "kept_every_byte": bool(read_back) and not lost,
    }
    # "corrupted" is the read-back's own verdict after a heartbeat that ran to the signal: judged below.
    if n_run.result.get("status") not in ("ok", "corrupted") or beat.get("ended_by") != "signal":
        raise CheckFailed(f"the neighbour did not keep running: {n_run.result.get('status')}", evidence)
    if beat.get("used_min") and min(beat["used_min"]) < within(held) * MiB:
        raise CheckFailed("the neighbour lost memory it held while its neighbour ran out of memory", evidence)
    if lost:
        raise CheckFailed(f"{lost} while its neighbour ran into its limit beside it", evidence)
    if step.get("stopped_by") != "oom":
        raise CheckFailed(
            f"no OOM: allocated {got // MiB} MiB against a limit of {limit} MiB "
            f"(stopped by {step.get('stopped_by') or run.result.get('status')})",
            evidence,
        )
    if not verdict.ok:
        raise CheckFailed(f"OOM at {got / MiB:.0f} MiB, not at the limit: {verdict.problem}", evidence)
    return (
        f"OOM at {got / MiB:.0f} MiB = limit {limit} MiB ({oom.get('error_type', '?')}); "
        f"neighbour kept every byte of its {within(held)} MiB",
        evidence,
    )


def check_borrowing(s: Session) -> tuple[str, dict[str, Any]]:
    cap = s.capacity_mib
    request, limit = max(1, cap // 8), max(2, cap // 2)
    burst = within(limit)  # up to the limit, less the headroom a real GPU's context and pages need
    pod, adj = s.admit(_placement(request, limit))
    _refused(adj)
    from conformance.test_eviction import HOLD_S
    from fixtures.suite.reaction import hold_for

    held_s = hold_for(s.reaction_period_s, HOLD_S)  # the suite's hold window, for the probe's agent
    plan = {
        "name": "borrowing",
        "steps": [
            {"op": "alloc", "bytes": burst * MiB, "chunk": max(1, burst // 4) * MiB},
            {"op": "touch"},
            # Long enough for an agent that evicts wrongly to have done it: reaction periods.
            {"op": "heartbeat", "interval": 0.2, "seconds": held_s},
            {"op": "free"},
        ],
    }
    run = s.finish(s.run(pod, adj, plan), "borrowing")
    alloc = _step(run.result, "alloc")
    seen = _effect(s, pod, "borrowing", run, request)
    evidence = {
        "request_mib": request,
        "limit_mib": limit,
        "allocated_mib": int(alloc.get("bytes", 0)) // MiB,
        "hold_s": held_s,
        "status": run.result.get("status"),
        "exit_code": run.exit_code,
        "mechanism": seen.as_fact(),
    }
    if seen.evicted:
        raise CheckFailed(
            f"the borrower was evicted on an idle GPU ({seen.mechanism}: {seen.detail})", evidence
        )
    if run.exit_code != 0 or alloc.get("outcome") != "ok":
        why = (alloc.get("oom") or {}).get("message") or run.result.get("status")
        raise CheckFailed(f"borrowing {burst} MiB (request {request}, limit {limit}) failed: {why}", evidence)
    from fixtures.suite.reaction import LONG_BORROW_S

    evidence["not_judged"] = (
        f"keeping the borrowed memory for {LONG_BORROW_S:g} s or more (a late reconcile loop): judged by "
        "burst-borrowing in the suite's node profile"
    )
    return (
        f"held {burst} MiB between request {request} MiB and limit {limit} MiB for {held_s:g} s, not "
        f"evicted; not judged here: {evidence['not_judged']}",
        evidence,
    )


def check_pressure_eviction(s: Session) -> tuple[str, dict[str, Any]]:
    from enforcement.agent.kube import REASON_EVICTED, pod_ref

    cap = s.capacity_mib
    g_request = max(1, cap // 2)
    b_request, b_limit = max(1, cap // 16), max(2, cap * 15 // 16)
    borrow = cap * 13 // 16
    guaranteed, g_adj = s.admit(_placement(g_request, g_request), "guaranteed")
    _refused(g_adj)
    borrower, b_adj = s.admit(_placement(b_request, b_limit), "borrower")
    _refused(b_adj)
    b_plan = {
        "name": "borrower",
        "steps": [
            {"op": "alloc", "bytes": borrow * MiB, "chunk": max(1, cap // 16) * MiB},
            {"op": "heartbeat", "interval": 0.2, "until_signal": "SIGTERM"},
        ],
    }
    b_proc = s.run(borrower, b_adj, b_plan)
    b_proc.wait_for("heartbeat 1", WORKLOAD_TIMEOUT_S, or_exit=True)
    g_plan = {
        "name": "guaranteed",
        "steps": [
            {
                "op": "alloc",
                "bytes": within(g_request) * MiB,
                "chunk": max(1, g_request // 4) * MiB,
                "retry_on_pressure": PRESSURE_RETRY_S,
                "retry_on_oom": PRESSURE_RETRY_S,  # a real GPU says out-of-memory until the eviction lands
                "retry_interval": 0.05,
            },
            {"op": "meminfo"},
        ],
    }
    g_run = s.finish(s.run(guaranteed, g_adj, g_plan), "guaranteed")
    evicted = [ref.pod for ref, _at in s.kube.evictions]
    still_running = pod_ref(borrower).pod not in evicted and b_proc.proc.poll() is None
    if still_running:
        # Not evicted through the API and not ended: its result (the least memory the device counted
        # for it while it ran) shows whether the node reclaimed its borrowed memory another way.
        b_proc.proc.send_signal(signal.SIGTERM)
    # Evicted: its device calls now fail with "gone" and it exits.
    b_run = s.finish(b_proc, "borrower", 30.0)
    alloc = _step(g_run.result, "alloc")
    events = [e.message for e in s.kube.events_for(REASON_EVICTED)]
    evidence = {
        "gpu_mib": cap,
        "guaranteed": {"request_mib": g_request, "status": g_run.result.get("status"), "alloc": alloc},
        "borrower": {
            "request_mib": b_request,
            "limit_mib": b_limit,
            "borrowed_mib": borrow,
            "status": b_run.result.get("status"),
            "stoppedByProbe": still_running,
        },
        "evicted_pods": evicted,
        "eviction_events": events,
        "reaction_s": s.core.metrics.value("gpu_fractioning_agent_last_eviction_reaction_seconds"),
        # The probe plays one borrower, so the statement's last clause is left to the suite's check.
        "not_judged": "that no more borrowers are evicted than the shortfall requires (one borrower here; "
        "the suite's soft-limit-eviction plays two)",
    }
    g_seen = _effect(s, guaranteed, "guaranteed", g_run, g_request)
    b_seen = _effect(s, borrower, "borrower", b_run, b_request)
    evidence["mechanisms"] = {"guaranteed": g_seen.as_fact(), "borrower": b_seen.as_fact()}
    if g_seen.evicted:
        raise CheckFailed(
            f"the Pod within its guarantee was evicted ({g_seen.mechanism}: {g_seen.detail})", evidence
        )
    if not b_seen.evicted:
        raise CheckFailed("the borrower was not evicted while a guaranteed neighbour needed memory", evidence)
    if g_run.exit_code != 0 or alloc.get("outcome") != "ok":
        raise CheckFailed(
            f"the guaranteed Pod did not get its {g_request} MiB: {g_run.result.get('status')}", evidence
        )
    return (
        f"borrower ({borrow} MiB, request {b_request}) evicted ({b_seen.mechanism}); guaranteed got "
        f"{g_request} MiB (reaction {evidence['reaction_s']:.2f} s); "
        f"not judged here: {evidence['not_judged']}",
        evidence,
    )


def check_mode_guard(s: Session) -> tuple[str, dict[str, Any]]:
    """Both ways round: sm-sharing beside time-slicing, then time-slicing (written, and by default with
    no mode annotation) beside sm-sharing, on GPU 1 where there is one (sm-sharing there must start),
    else on GPU 0 once the time-slicing container stopped."""
    from enforcement.contract import SUFFIX_MODE, nvidia_key

    small = max(1, s.capacity_mib // 16)
    first, a_adj = s.admit(_placement(small, small, ("0",), "time-slicing"), "time-slicing")
    _refused(a_adj)
    _second, b_adj = s.admit(_placement(small, small, ("0",), "sm-sharing"), "sm-sharing-same-gpu")
    first_name = first["metadata"]["name"]
    tried: list[tuple[Intrusion, Any]] = [
        (Intrusion("sm-sharing-same-gpu", "sm-sharing", "0", first_name, "time-slicing"), b_adj)
    ]
    evidence: dict[str, Any] = {}
    gpu = "1" if len(s.gpus) > 1 else "0"
    if gpu == "0":
        s.stop(first)  # one GPU: the other way round once time-slicing has left it
    holder, c_adj = s.admit(_placement(small, small, (gpu,), "sm-sharing"), "sm-sharing-holder")
    evidence["holder"] = {"gpu": gpu, "allowed": c_adj.allowed, "message": c_adj.message}
    if not c_adj.allowed:
        raise CheckFailed(f"sm-sharing was refused on GPU {gpu}, which runs no time-slicing client", evidence)
    holder_name = holder["metadata"]["name"]
    unset = _placement(small, small, (gpu,), "time-slicing")
    del unset[nvidia_key("main", SUFFIX_MODE)]
    for name, written, placed in (
        ("time-slicing-beside-sm", True, _placement(small, small, (gpu,))),
        ("unset-beside-sm", False, unset),
    ):
        _pod, adj = s.admit(placed, name)
        tried.append((Intrusion(name, "time-slicing", gpu, holder_name, "sm-sharing", written), adj))
    evidence["tried"] = {
        i.pod: {**i.as_fact(), "allowed": adj.allowed, "reason": adj.reason, "message": adj.message}
        for i, adj in tried
    }
    evidence["events"] = [e.reason for e in s.kube.events]
    # The suite's judgement of each intrusion (``conformance.judgements.judge_intrusion``).
    problems = [p for i, adj in tried if (p := judge_intrusion(i, adj.allowed, [adj.message]))]
    if problems:
        raise CheckFailed("; ".join(problems), evidence)
    return (f"refused both ways ({len(tried)} containers); sm-sharing allowed on GPU {gpu}", evidence)


def _hex(uuid: str) -> str:
    return uuid.lower().removeprefix("gpu-").replace("-", "")


def check_visibility(s: Session) -> tuple[str, dict[str, Any]]:
    """The suite's smi-visibility, in process, with its sizes and its judgement
    (``conformance.judgements.judge_smi_view``): a neighbour holds a large share of the assigned GPU
    first, then the container allocates a known amount within its request and nvidia-smi looks."""
    import math
    import signal

    from conformance.test_visibility import (
        LIMIT_SHARE,
        NEIGHBOUR_HELD_SHARE,
        NEIGHBOUR_SHARE,
        OWN_SHARE,
        SHARE,
    )

    target = s.gpus[-1]

    def share(x: float) -> int:
        return max(1, math.floor(x * target.memory_mib))

    request, limit, own = share(SHARE), share(LIMIT_SHARE), share(OWN_SHARE)
    beside = share(NEIGHBOUR_SHARE)
    held = min(share(NEIGHBOUR_HELD_SHARE), within(beside))
    devices = (str(target.index),)
    n_pod, n_adj = s.admit(_placement(beside, beside, devices), "neighbour")
    _refused(n_adj)
    n_plan = {
        "name": "neighbour",
        "steps": [
            {"op": "alloc", "bytes": held * MiB},
            {"op": "heartbeat", "interval": 0.1, "until_signal": "SIGTERM"},
        ],
    }
    neighbour = s.run(n_pod, n_adj, n_plan)
    neighbour.wait_for("heartbeat 1", WORKLOAD_TIMEOUT_S, or_exit=True)
    pod, adj = s.admit(_placement(request, limit, devices))
    _refused(adj)
    steps: list[dict[str, Any]] = [{"op": "alloc", "bytes": own * MiB}, {"op": "meminfo"}]
    has_smi = shutil.which("nvidia-smi", path=s.env(adj.env).get("PATH")) is not None
    if has_smi:
        steps.append({"op": "smi", "expect": "any"})
    run = s.finish(s.run(pod, adj, {"name": "visibility", "steps": steps}), "visibility")
    neighbour.proc.send_signal(signal.SIGTERM)
    n_run = s.finish(neighbour, "neighbour")
    kept = _step(n_run.result, "heartbeat").get("ended_by") == "signal"
    listed = _step(run.result, "smi").get("gpus") or []
    by_hex = {_hex(g.uuid): g.uuid for g in s.gpus}
    identities = [by_hex.get(_hex(str(g.get("uuid", ""))), str(g.get("uuid", ""))) for g in listed]
    fidelity = device_fidelity(run.result)
    evidence: dict[str, Any] = {
        "assigned": {"index": target.index, "uuid": target.uuid, "limit_mib": limit},
        "env": {k: adj.env.get(k) for k in ("NVIDIA_VISIBLE_DEVICES", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")},
        "workload_devices": run.result.get("devices") or [],
        "meminfo": _step(run.result, "meminfo").get("devices") or [],
        "nvidia_smi": listed,
        "own_allocation_mib": {0: own},
        "neighbour": {"held_mib": held, "gpu": target.uuid, "held_until_stopped": kept},
        "fidelity": fidelity,
        "exit_code": run.exit_code,
    }
    if not s.simulated:
        # A bare host has no container NVML shim: nvidia-smi shows the physical GPUs, so the rule
        # (nvidia-smi in a fenced container) cannot be judged here.
        raise CheckSkipped(
            "a bare host has no container NVML shim, so what nvidia-smi shows inside a container is judged "
            "by the suite's node profile, not here",
            evidence,
        )
    if not has_smi:
        raise CheckFailed("the simulated device's nvidia-smi is not on the container's PATH", evidence)
    problems = judge_smi_view(
        "the container", listed, identities, (target.uuid,), limit, {0: own}, {0: held}, fidelity
    )
    if problems:
        raise CheckFailed("; ".join(problems), evidence)
    summary = f"1 GPU ({target.uuid[:12]}...) of {limit} MiB in nvidia-smi, used = its own {own} MiB"
    if not kept:
        # It may have ended before nvidia-smi looked: its memory was then no test of the view.
        evidence["not_judged"] = (
            f"used memory beside a neighbour: the neighbour did not hold its {held} MiB until stopped "
            f"(it ended {n_run.result.get('status')})"
        )
        return f"{summary}; not judged: {evidence['not_judged']}", evidence
    return f"{summary}, not the neighbour's {held} MiB beside it", evidence


def check_release(s: Session) -> tuple[str, dict[str, Any]]:
    """The suite's release-on-exit, judged by its effect: after a workload holding 0.6 of the GPU
    exits (or dies of a device fault), the next one's 0.6 guarantee, in the other compute mode, is
    admitted and allocated whole at its first allocation, which fits only where the old one's memory
    and guarantee were released."""
    from conformance.test_release import ENDED, SHARE

    size = max(1, int(s.capacity_mib * SHARE))
    held = within(size)
    ends = {
        "exits": [{"op": "alloc", "bytes": held * MiB}, {"op": "touch"}],
        "dies": [{"op": "alloc", "bytes": held * MiB}, {"op": "touch"}, {"op": "fault"}],
    }
    statuses = {"exits": "ok", "dies": "fault-injected"}
    evidence: dict[str, Any] = {"gpu_mib": s.capacity_mib, "request_mib": size}
    for how, steps in ends.items():
        first, f_adj = s.admit(_placement(size, size, mode="time-slicing"), how)
        _refused(f_adj)
        f_run = s.finish(s.run(first, f_adj, {"name": how, "steps": steps}), how)
        s.stop(first)  # what the runtime tells the agent once the container's process is gone
        if f_run.result.get("status") != statuses[how]:
            # The probe's own set-up did not hold (an ERROR), never a verdict on the agent.
            raise RuntimeError(
                f"the first workload ({how}) did not end as planned: {f_run.result.get('status')}"
            )
        # The other mode: a GPU that still counts the old (time-slicing) container refuses it.
        name = f"after-{how}"
        after, a_adj = s.admit(_placement(size, size, mode="sm-sharing"), name)
        plan = {"name": name, "steps": [{"op": "alloc", "bytes": held * MiB}, {"op": "touch"}]}
        a_run = s.finish(s.run(after, a_adj, plan), name) if a_adj.allowed else None
        alloc = _step(a_run.result, "alloc") if a_run else {}
        evidence[how] = {
            "first": f_run.result.get("status"),
            "next": {
                "allowed": a_adj.allowed,
                "message": a_adj.message,
                "status": a_run.result.get("status") if a_run else None,
                "alloc": alloc,
            },
        }
        if not a_adj.allowed:
            raise CheckFailed(
                f"after the workload {ENDED[how]}, the next container ({size} MiB, sm-sharing) was refused: "
                f"{a_adj.message}",
                evidence,
            )
        if a_run is not None and a_run.result.get("status") != "ok":
            why = (alloc.get("oom") or alloc.get("pressure") or {}).get("message") or a_run.result.get(
                "status"
            )
            raise CheckFailed(
                f"after the workload {ENDED[how]}, the next one could not take its {size} MiB guarantee at "
                f"its first allocation: {why}",
                evidence,
            )
        s.stop(after)
    return (
        f"after a workload exited and one died, the next took its {size} MiB at once, in sm-sharing",
        evidence,
    )


def check_fail_closed(s: Session) -> tuple[str, dict[str, Any]]:
    """The suite's fail-closed, in process: the same malformed cases and the same judgement
    (``conformance.test_failclosed``), against the reference agent, which refuses each itself and
    names the key and the rule (``gpuconf-reference``'s description)."""
    from conformance.test_failclosed import cases, placement, refusal_verdict
    from enforcement.agent.kube import REASON_REJECTED
    from enforcement.hook import REASON_CONFIG_ERROR

    valid = _placement(64, 64)
    problems: list[str] = []
    seen: dict[str, Any] = {}
    for case in cases(len(s.gpus)):
        pod, adj = s.admit(placement(valid, case), case.name)
        uid = pod["metadata"]["uid"]
        events = [e.message for e in s.kube.events if e.ref.pod_uid == uid and e.reason == REASON_REJECTED]
        said = [f"{adj.reason}: {adj.message}", *(f"{REASON_REJECTED}: {m}" for m in events)]
        seen[case.name] = {"value": case.shown, "rule": case.rule, "allowed": adj.allowed, "said": said[-2:]}
        problem = refusal_verdict(case, adj.allowed, said, True)
        if not problem and not adj.allowed and adj.reason != REASON_CONFIG_ERROR:
            problem = f"{case.name} was refused with reason {adj.reason}, not {REASON_CONFIG_ERROR}"
        if not problem and not adj.allowed and not events:
            problem = f"{case.name} was refused, but no {REASON_REJECTED} Event was recorded"
        if problem:
            problems.append(problem)
        if adj.allowed:
            s.stop(pod)  # release what a broken agent fenced, so the next case starts from an idle GPU
    evidence = {"malformed": seen}
    if problems:
        raise CheckFailed("; ".join(problems), evidence)
    return (
        f"{len(seen)} malformed placements refused ({REASON_CONFIG_ERROR}), each naming key and rule",
        evidence,
    )


@dataclass(frozen=True)
class ProbeCheck:
    id: str
    """The catalog id: the declaration (statement, level, party) is the suite's check of that id."""
    run: Callable[[Session], tuple[str, dict[str, Any]]]
    alias: str = ""
    """The probe's name for it before the probe joined the catalog (still accepted by ``--check``)."""
    module: str = ""
    """The ``conformance`` module that declares it."""

    @property
    def declared(self) -> Check:
        import importlib

        from fixtures.suite.checks import REGISTRY

        importlib.import_module(f"conformance.{self.module}")
        declared = REGISTRY[self.id]
        if "probe" not in declared.profiles:
            raise RuntimeError(f"catalog check {self.id} does not list the probe profile")
        return declared

    @property
    def statement(self) -> str:
        return self.declared.statement


CHECKS: tuple[ProbeCheck, ...] = (
    ProbeCheck("hard-limit-oom", check_hard_limit, "hard-limit", "test_memory_limits"),
    ProbeCheck("burst-borrowing", check_borrowing, "borrowing", "test_memory_limits"),
    ProbeCheck("soft-limit-eviction", check_pressure_eviction, "pressure-eviction", "test_eviction"),
    ProbeCheck("mode-guard", check_mode_guard, "", "test_compute"),
    ProbeCheck("smi-visibility", check_visibility, "visibility", "test_visibility"),
    ProbeCheck("release-on-exit", check_release, "release", "test_release"),
    ProbeCheck("fail-closed", check_fail_closed, "", "test_failclosed"),
)
CHECK_IDS = tuple(c.id for c in CHECKS)
ALIASES = {c.alias: c.id for c in CHECKS if c.alias}


def check_id(name: str) -> str:
    """A catalog id from a catalog id or one of the probe's older names."""
    return ALIASES.get(name, name)

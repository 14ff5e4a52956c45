"""Compute modes on the node: each container gets the mode it asked for, and the modes behave as documented.

docs/contract.md §5 and §7. Time-slicing containers take turns on the whole GPU and each is its own
fault domain; sm-sharing containers split the SMs and run at once, and share one fault domain.
What a container can observe of its mode is its environment (the MPS pipe directory of its
server, and ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` for sm-sharing with a portion) and, on the
simulated device, the mode the device reports; side by side, the kernels themselves show it.

How the modes are told apart (docs/contract.md §7; ``conformance.judgements``): throughput, from
the workloads' own counters: with a kernel a solo calibration found not to fill the GPU,
sm-sharing neighbours keep most of their solo throughput, time-slicing ones about half. The ideal
simulated device measures exactly how long each kernel shared the GPU, so there the overlap is
judged instead. Neighbours that must compute together wait on a start barrier (Ready,
then the suite's signal) however far apart they were bound. Every figure goes to the evidence: for
each mode the single-task figures (one workload alone) beside the batch figures (two at once), the
comparison seed 000 asks for.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from typing import Any, Final

from conformance.judgements import (
    Intrusion,
    calibrated_matrix,
    compare_modes,
    compute_step,
    device_fidelity,
    judge_intrusion,
    judge_modes,
    too_short,
)
from conformance.test_failclosed import explanations
from enforcement.agent.environment import ENV_THREAD_PERCENTAGE
from enforcement.contract import SM_SHARING, SUFFIX_MODE, TIME_SLICING, Mode, nvidia_key
from enforcement.implementations import MECHANISMS
from fixtures.suite.checks import Needs, check
from fixtures.suite.frame import Suite, fail
from fixtures.suite.manifests import placement_annotations
from fixtures.suite.scenario import CONTAINER, NotJudged, Placed, Stage, plan, require
from fixtures.suite.waiting import WaitTimeout, wait_until
from workloads.plan import alloc, calibrate, compute, fault, heartbeat, hold, meminfo, read_env, ready

SHARE: Final = 0.3
PORTION: Final = 0.5
COMPUTE_S: Final = 1.5
KERNEL_MS: Final = 100
"""Long enough that a kernel's round trip to a simulated device on a loaded machine does not decide
its throughput."""
MIN_SHARED_S: Final = 0.5
"""Two neighbours must compute side by side at least this long for the comparison to mean anything."""
BEAT_S: Final = 0.1


# ---------------------------------------------------------------------------------------- mode-applied


@check(
    id="mode-applied",
    level="MUST",
    statement="A container MUST run in the compute mode its gpu-compute.mode names, on its mode's MPS "
    "server (the two modes on different servers; the implementation's pipe directory where it names one); "
    "where the implementation claims compute-portion, in sm-sharing with a gpu-compute.portion with "
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE = floor(portion x 100).",
    profiles=("node", "stack"),
    features=("sm-sharing",),
    seed="003/4",
    needs=Needs(nodes=1, gpus=2, idle=True),
)
def test_mode_applied(suite: Suite) -> None:
    part = suite.options.node_part()
    pipe_var = part.env.pipe_directory
    threads_var = part.env.thread_percentage or ENV_THREAD_PERCENTAGE
    # The portion key only where the thread cap is claimed: released KAI admission refuses the key.
    cap = suite.options.claims("compute-portion")
    if not cap:
        suite.not_judged(
            "thread cap",
            f"{part.implementation} does not claim compute-portion ({MECHANISMS['compute-portion']})",
        )
    stage = Stage(suite, gpus=2)
    names = (pipe_var, threads_var)
    probe = plan("mode", read_env(*list(names)), meminfo())
    size = stage.mib(SHARE)
    sliced = stage.place("sliced", probe, request_mib=size, mode=TIME_SLICING, slot=0)
    shared = stage.place(
        "shared", probe, request_mib=size, mode=SM_SHARING, slot=1, portion=PORTION if cap else None
    )
    seen: dict[str, dict[str, Any]] = {}
    problems: list[str] = []
    for placed in (sliced, shared):
        out = stage.wait_ended(placed.name)
        require(out, ("ok",), "it only reads its environment and its memory")
        env = out.step("env").get("env") or {}
        device_mode = (out.result or {}).get("mode")
        seen[placed.name] = {
            "asked": placed.mode,
            "portion": placed.portion,
            "env": env,
            "deviceMode": device_mode,
        }
        if device_mode and device_mode != placed.mode:
            problems.append(f"{placed.name} asked for {placed.mode} but the device runs it in {device_mode}")
        if not env.get(pipe_var):
            problems.append(f"{placed.name} has no {pipe_var}: it reaches no MPS server of its mode")
        elif part.env.pipe_directories.get(placed.mode) not in (None, env.get(pipe_var)):
            problems.append(
                f"{placed.name} ({placed.mode}) has {pipe_var}={env.get(pipe_var)!r}, expected "
                f"{part.env.pipe_directories[placed.mode]!r} ({part.implementation}'s {placed.mode} server)"
            )
        expected = _threads(placed, part.env.thread_cap_modes)
        if cap and env.get(threads_var) != expected:
            want = "unset" if expected is None else expected
            problems.append(
                f"{placed.name} ({placed.mode}, portion {placed.portion}) has {threads_var}="
                f"{env.get(threads_var)!r}, expected {want}"
            )
    pipes = {seen[p.name]["env"].get(pipe_var) for p in (sliced, shared)}
    if len(pipes) == 1 and None not in pipes:
        problems.append(
            f"{sliced.name} (time-slicing) and {shared.name} (sm-sharing) use the same MPS server "
            f"({pipes.pop()}): "
            "time-slicing containers belong on the default server, sm-sharing ones on the shared one"
        )
    suite.evidence.fact("modeApplied", seen)
    if problems:
        raise fail("; ".join(problems))


def _threads(placed: Placed, modes: Sequence[str] = (SM_SHARING,)) -> str | None:
    if placed.mode not in modes or placed.portion is None:
        return None
    return str(max(1, math.floor(placed.portion * 100)))


# ---------------------------------------------------------------------------------------- compute-modes


def busy_plan(name: str, matrix: int) -> dict[str, Any]:
    """Ready, wait for the start signal (the barrier), then compute with the calibrated kernel size."""
    return plan(
        name,
        ready(),
        hold(until_signal="SIGTERM"),
        compute(COMPUTE_S, kernel_ms=KERNEL_MS, matrix=matrix),
    )


@check(
    id="compute-modes",
    level="MUST",
    statement="Two busy sm-sharing neighbours on one GPU MUST compute at the same time, and two busy "
    "time-slicing neighbours MUST take turns.",
    profiles=("node", "stack"),
    features=("sm-sharing",),
    seed="000/3",
    needs=Needs(nodes=1, gpus=2, idle=True),
)
def test_compute_modes(suite: Suite) -> None:
    stage = Stage(suite, gpus=2)
    size = stage.mib(SHARE)
    # Single task: one workload alone per mode. Its calibration picks a kernel that does not fill the
    # GPU (two streams of it do nearly twice the work of one), and its throughput is the solo figure.
    alone = plan(
        "alone",
        calibrate(),
        compute(COMPUTE_S / 2, kernel_ms=KERNEL_MS, matrix="calibrated"),
    )
    solo = {
        mode: stage.place(f"{mode}-alone", alone, request_mib=size, mode=mode, slot=slot)
        for slot, mode in enumerate((TIME_SLICING, SM_SHARING))
    }
    soloed = {mode: stage.wait_ended(p.name) for mode, p in solo.items()}
    for out in soloed.values():
        require(out, ("ok",), "it only runs kernels on its own share")
    matrix = {mode: calibrated_matrix(out.result or {}) or 1024 for mode, out in soloed.items()}
    suite.evidence.fact(
        "calibration", {mode: out.step("calibrate") for mode, out in soloed.items()} | {"picked": matrix}
    )
    # Batch: two per mode. Through a scheduler the first of each mode must be bound before the second
    # is asked for: the second time-slicing Pod then has exactly one GPU it may join.
    order: list[tuple[str, Mode, int]] = [
        ("sliced-0", TIME_SLICING, 0),
        ("shared-0", SM_SHARING, 1),
        ("sliced-1", TIME_SLICING, 0),
        ("shared-1", SM_SHARING, 1),
    ]
    placed: dict[str, Placed] = {}
    for name, mode, slot in order[:2]:
        placed[name] = stage.place(
            name, busy_plan(name, matrix[mode]), request_mib=size, mode=mode, slot=slot
        )
    for name, mode, slot in order[2:]:
        stage.pod(name, busy_plan(name, matrix[mode]), request_mib=size, mode=mode, slot=slot)
    for name, _mode, _slot in order[2:]:
        placed[name] = stage.placed(name)
    for a, b in (("sliced-0", "sliced-1"), ("shared-0", "shared-1")):
        if set(placed[a].gpus) != set(placed[b].gpus):
            raise NotJudged(f"{a} and {b} did not land on one GPU ({placed[a].gpus} vs {placed[b].gpus})")
    # The start barrier: every neighbour is Ready (bound, started, waiting), however far apart the
    # scheduler bound them; then all are released at once and compute side by side.
    for name, _mode, _slot in order:
        stage.must_be_ready(name, "it waits for the start signal before it computes")
    released = stage.release([name for name, _m, _s in order])
    outcomes = {name: stage.wait_ended(name) for name, _m, _s in order}
    for out in outcomes.values():
        require(out, ("ok",), "it only runs kernels on its own share")
    fidelity = device_fidelity(outcomes["shared-0"].result)
    steps = {name: compute_step(out) for name, out in outcomes.items()}
    figures: dict[str, dict[str, Any]] = {
        TIME_SLICING: compare_modes(compute_step(soloed[TIME_SLICING]), steps["sliced-0"], steps["sliced-1"]),
        SM_SHARING: compare_modes(compute_step(soloed[SM_SHARING]), steps["shared-0"], steps["shared-1"]),
    }
    suite.evidence.fact("comparison", figures)
    suite.evidence.fact("barrier", {"releasedWithinS": released, "device": fidelity})
    suite.evidence.fact(
        "modes",
        {
            mode: {
                # One kernel at a time per workload: side by side, each completes one in this long.
                "completionSeconds": round(2 / sum(f["sharedKernelsPerS"]), 4)
                if sum(f["sharedKernelsPerS"])
                else None,
                "throughput": f["batchWorkPerS"],
                "overlap": f["overlapFraction"],
                "unit": f"{f.get('workUnit') or 'work'}/s",
            }
            for mode, f in figures.items()
        },
    )
    short = too_short(figures, MIN_SHARED_S)
    if short:
        raise NotJudged(
            f"the {', '.join(short)} neighbours computed side by side for less than {MIN_SHARED_S} s "
            f"({', '.join(str(figures[m]['sharedSeconds']) for m in short)} s) although they were released "
            f"together (within {released} s)"
        )
    problems = judge_modes(figures, fidelity)
    if problems:
        raise fail("; ".join(problems))


# ---------------------------------------------------------------------------------------- fault-isolation


@check(
    id="fault-isolation",
    level="MUST",
    statement="A device fault in a time-slicing workload MUST leave its time-slicing neighbour on the "
    "same GPU running; whether an sm-sharing fault hits its neighbours is recorded.",
    profiles=("node", "stack"),
    seed="003/4",
    needs=Needs(nodes=1, gpus=2, idle=True),
)
def test_fault_isolation(suite: Suite) -> None:
    modes: list[Mode] = [TIME_SLICING]
    if "sm-sharing" in suite.options.supported_features:
        modes.append(SM_SHARING)
    stage = Stage(suite, gpus=len(modes))
    size = stage.mib(SHARE)
    neighbour_plan = plan(
        "neighbour",
        alloc(stage.mib(0.05)),
        ready(),
        heartbeat(BEAT_S, until_signal="SIGTERM"),
    )
    faulty_plan = plan("faulty", alloc(stage.mib(0.05)), fault())
    neighbours = {}
    for slot, mode in enumerate(modes):
        neighbours[mode] = stage.place(
            f"{mode}-neighbour", neighbour_plan, request_mib=size, mode=mode, slot=slot
        )
    for mode, placed in neighbours.items():
        stage.must_be_ready(placed.name, f"it holds a little memory within its {mode} share")
    faulty = {
        mode: stage.place(f"{mode}-faulty", faulty_plan, request_mib=size, mode=mode, slot=slot)
        for slot, mode in enumerate(modes)
    }
    faults = {mode: stage.wait_ended(p.name) for mode, p in faulty.items()}
    for mode, out in faults.items():
        if out.status != "fault-injected":
            raise NotJudged(
                f"the {mode} workload's fault step did not fault the device ({out.status or out.phase})"
            )
        if set(faulty[mode].gpus) != set(neighbours[mode].gpus):
            raise NotJudged(f"the {mode} workload and its neighbour did not share a GPU")
    time.sleep(3 * BEAT_S)  # a few heartbeats after the fault, or their absence
    hits = {}
    for mode, placed in neighbours.items():
        out = stage.stop(placed.name)
        fault_at = float((faults[mode].result or {}).get("started_at") or 0) + float(
            (faults[mode].result or {}).get("wall_s") or 0
        )
        beat = out.step("heartbeat")
        survived = out.status == "ok" and beat.get("ended_by") == "signal"
        if survived and float(beat.get("last_at") or 0) < fault_at:
            raise NotJudged(f"the {mode} neighbour's last heartbeat came before the fault")
        hits[mode] = {"neighbourHit": not survived, "neighbourEnded": out.status, "exit": out.as_dict()}
    suite.evidence.fact("faultDomains", hits)
    suite.evidence.fact(
        "modes", {mode: {"faultIsolated": not hit["neighbourHit"]} for mode, hit in hits.items()}
    )
    if hits[TIME_SLICING]["neighbourHit"]:
        raise fail(
            f"a device fault in {faulty[TIME_SLICING].name} (time-slicing) also ended its neighbour "
            f"{neighbours[TIME_SLICING].name} on the same GPU ({hits[TIME_SLICING]['neighbourEnded']}): "
            "time-slicing workloads must be separate fault domains"
        )


# ---------------------------------------------------------------------------------------- mode-guard

GUARD_EXPLAIN_S: Final = 15.0
"""How long the node has to refuse every intruder and say why (the reference agent: well under a
second). One wait for all of them: their Pods are created at once."""
INTRUDER_SHARE: Final = 0.05
INTRUDER_HOLD_S: Final = 1.0
"""How long an intruder runs if a node starts it: started is the verdict, and ending soon frees its GPU
for the scenario's other workloads (a node that mixes the modes then refuses a holder's neighbour)."""


def intruder_plan(name: str) -> dict[str, Any]:
    """A workload that must never start; one that does ends soon by itself."""
    return plan(name, hold(seconds=INTRUDER_HOLD_S))


def hold_plan(name: str) -> dict[str, Any]:
    """A workload that is Ready and beats until the suite stops it: a GPU's mode while it runs."""
    return plan(name, ready(), heartbeat(BEAT_S, until_signal="SIGTERM"))


def intrude(stage: Stage, name: str, slot: int, mode: Mode | None, holder: Placed) -> Intrusion:
    """Create Pod ``name`` on free GPU ``slot``, which ``holder`` runs, asking for ``mode`` (None: no
    mode annotation, so time-slicing by default). The node profile only: the suite writes the
    placement, as no correct scheduler would."""
    size = stage.mib(INTRUDER_SHARE)
    annotations = placement_annotations(
        CONTAINER, size, size, stage.free[slot : slot + 1], mode or TIME_SLICING
    )
    if mode is None:
        del annotations[nvidia_key(CONTAINER, SUFFIX_MODE)]
    stage.pod(name, intruder_plan(name), request_mib=size, annotations=annotations)
    return Intrusion(
        pod=name,
        asks=mode or TIME_SLICING,
        gpu=", ".join(holder.gpus),
        holder=holder.name,
        holder_mode=holder.mode,
        written=mode is not None,
    )


def settle_intrusions(
    suite: Suite, stage: Stage, intrusions: Sequence[Intrusion]
) -> dict[str, dict[str, Any]]:
    """Wait (once, for all) until each intrusion started or was refused naming the modes; then each
    one's judgement (``problem``: empty when it holds) and evidence."""
    names = [i.pod for i in intrusions]
    said: dict[str, list[str]] = {}

    def settled() -> bool:
        said.update(said_by(suite, names))
        return all(
            judge_intrusion(i, stage.ran(i.pod), said[i.pod], final=False) is not None for i in intrusions
        )

    try:
        wait_until(settled, "every intruder to start or be refused", suite.timeout(GUARD_EXPLAIN_S))
    except WaitTimeout:
        pass  # the judgements below say which did not settle, and how
    said.update(said_by(suite, names))
    return {
        i.pod: {
            **i.as_fact(),
            "started": stage.ran(i.pod),
            "said": said[i.pod][-3:],
            "problem": judge_intrusion(i, stage.ran(i.pod), said[i.pod]) or "",
        }
        for i in intrusions
    }


def said_by(suite: Suite, names: Sequence[str]) -> dict[str, list[str]]:
    """What each Pod says about its container (waiting state, Warning Events), from one read of the
    namespace's Events."""
    by_pod: dict[str, list[Mapping[str, Any]]] = {}
    for event in suite.events():
        by_pod.setdefault((event.get("involvedObject") or {}).get("name") or "", []).append(event)
    return {n: explanations(suite.pod(n), by_pod.get(n, [])) for n in names}


@check(
    id="mode-guard",
    level="MUST",
    statement="A container placed on a GPU that already runs the other compute mode MUST NOT start, either "
    "way round (sm-sharing beside time-slicing, and time-slicing, also by default with no mode annotation, "
    "beside sm-sharing), and its status or Events MUST say that the modes conflict.",
    profiles=("node", "probe"),
    features=("sm-sharing",),
    seed="003/4",
    needs=Needs(nodes=1, gpus=2, idle=True),
)
def test_mode_guard(suite: Suite) -> None:
    # Node profile only: a correct scheduler never mixes modes on a GPU (mode-separation judges that),
    # so only a placement written by hand puts the node to this test. One GPU per mode, so that both
    # directions are judged at once, in one wait.
    stage = Stage(suite, gpus=2)
    size = stage.mib(SHARE)
    sliced = stage.place("sliced", hold_plan("sliced"), request_mib=size, mode=TIME_SLICING, slot=0)
    shared = stage.place("shared", hold_plan("shared"), request_mib=size, mode=SM_SHARING, slot=1)
    for holder in (sliced, shared):
        stage.must_be_ready(holder.name, f"it runs {holder.mode} alone on an idle GPU")
    intrusions = [
        intrude(stage, "shared-on-sliced", 0, SM_SHARING, sliced),
        intrude(stage, "sliced-on-shared", 1, TIME_SLICING, shared),
        intrude(stage, "unset-on-shared", 1, None, shared),
    ]
    seen = settle_intrusions(suite, stage, intrusions)
    suite.evidence.fact("intrusions", seen)
    problems = [f["problem"] for f in seen.values() if f["problem"]]
    stopped = [h.name for h in (sliced, shared) if not stage.running(h.name)]
    if stopped:
        problems.append(f"{', '.join(stopped)}, already on the GPU, stopped when the intruders came")
    if problems:
        raise fail("; ".join(problems))

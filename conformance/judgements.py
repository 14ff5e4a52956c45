"""The judgements that must hold on a real GPU as on the simulated one, as pure functions.

Each takes what the checks recorded (workload results, Pod outcomes) and returns a verdict with
its figures; nothing here talks to a cluster, so each is unit-tested with recorded results of both
fidelities (tests/unit/test_judgements.py). docs/contract.md §6, §7 and §10 give the rules:

- **One tolerance rule** for every boundary (``tolerance_mib``, ``judge_boundary``): an allocation
  boundary passes when it is at or below the limit and within the tolerance of it. The tolerance is
  the workload's granularity on the ideal simulated device, and on any other device (a real GPU,
  the simulated H200) the larger of 1 GiB and 2 % of the limit: the CUDA context, 2 MiB pages and
  driver reservations sit inside the limit. Above the limit always fails.
- **Own usage** (``judge_smi_usage``): nvidia-smi's used memory in a container counts all of its own
  allocation and no more than the same tolerance above it, so a neighbour's memory cannot hide in it.
- **The NVML view** (``judge_smi_view``): nvidia-smi lists exactly the assigned GPUs, each with its
  limit as memory.total, and used counted as above: ``smi-visibility``'s whole rule, wherever it runs
  (the suite, ``gpuconf probe``).
- **Headroom** (``headroom_mib``): every allocation a scenario expects to succeed within a limit or a
  guarantee of ``size`` leaves this much of it unused, so that the context and the pages fit.
- **Eviction by its effect** (``eviction_effect``): a borrower was evicted when, after the pressure,
  it ended or lost the memory above its request, whatever the mechanism; the verdict names the
  mechanism seen (the Eviction API, the node detaching it, a CUDA error, a kill, memory reclaimed).
- **Compute modes** (``compare_modes``, ``judge_modes``): by throughput, from the workloads' own
  counters (work per second), each neighbour's rate beside the other over its solo rate, on every
  device but the ideal simulated one, which measures exactly and is judged by the kernels' overlap.
- **Pressure shown first** (``held_when_ready``, ``claim_figures``, ``judge_pressure``): eviction is
  judged only once the figures show there was pressure: each borrower held more than its request
  when it said Ready, and the claimant lacked memory (its first attempt was refused, or the free
  memory it saw before it asked was less than its claim); otherwise the rule is not judged.
- **Only what is needed** (``needless_evictions``): under pressure no more borrowers are evicted than
  the claimant's shortfall requires: a borrower whose memory the others evicted with it (and the
  GPU's free memory) already covered was evicted for nothing.
- **Kept bytes** (``kept_bytes``): a neighbour kept its memory when it read back, byte for byte, the
  pattern it wrote there; a usage counter cannot show pages scrubbed or swapped behind its back.
- **Start barrier** (``shared_window``): neighbours released together compute side by side; the
  window both computed in is what the comparison rests on.
- **Mode guard** (``Intrusion``, ``judge_intrusion``): a container placed on a GPU that runs the other
  compute mode must not start, and something it says (its waiting state, a Warning Event) must name
  both modes; judged the same either way round, and the same after an agent restart.
- **Readiness without a backend** (``judge_condition_turn``, ``judge_held``): the node condition turns
  False within the window once the backend is gone and True within it once it is back; a container
  created meanwhile shows neither a running nor an ended state in any snapshot (no process ran).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from enforcement.contract import SM_SHARING, TIME_SLICING
from fixtures.suite.scenario import Outcome
from reports.figures import BOUNDED_BY_LIMIT, bounded_by
from workloads.plan import MiB

IDEAL: Final = "ideal"
REAL: Final = "real"
IDEAL_GRANULARITY_MIB: Final = 1
REAL_GPU_TOLERANCE_MIB: Final = 1024
REAL_GPU_TOLERANCE_SHARE: Final = 0.02
"""On a real GPU the boundary may lie this far below the limit: 1 GiB, or 2 % of the limit."""


def device_fidelity(result: Mapping[str, Any] | None) -> str | None:
    """What kind of device a workload ran on: ``ideal`` or ``h200`` (the simulated device's fidelity),
    ``real`` (a real GPU), None when the workload wrote no result."""
    if not result:
        return None
    if result.get("fidelity"):
        return str(result["fidelity"])
    if result.get("simulated") is True:
        return IDEAL  # results from before the fidelity setting: the exact device
    if result.get("simulated") is False:
        return REAL
    return None


def tolerance_mib(limit_mib: int, fidelity: str | None) -> int:
    """How far below the limit the boundary may lie (docs/contract.md §6; gpuconf's judgement)."""
    if fidelity == IDEAL:
        return IDEAL_GRANULARITY_MIB
    return max(REAL_GPU_TOLERANCE_MIB, int(limit_mib * REAL_GPU_TOLERANCE_SHARE))


def headroom_mib(size_mib: int) -> int:
    """What an allocation expected to succeed leaves unused of a limit or guarantee of ``size_mib``:
    the real-GPU tolerance (on every device, so a scenario is one plan everywhere), and never more
    than a quarter of the size."""
    return max(0, min(tolerance_mib(size_mib, REAL), size_mib // 4))


def within(size_mib: int) -> int:
    """The MiB a scenario allocates, and expects to get, within a limit or guarantee of ``size_mib``."""
    return size_mib - headroom_mib(size_mib)


@dataclass(frozen=True)
class BoundaryVerdict:
    found_mib: int
    limit_mib: int
    tolerance_mib: int
    fidelity: str | None
    problem: str = ""
    bounded_by: str = BOUNDED_BY_LIMIT
    """What ended the search (``reports.figures.bounded_by``): the report says it beside the figure."""

    @property
    def ok(self) -> bool:
        return not self.problem

    @property
    def gap_mib(self) -> int:
        return self.limit_mib - self.found_mib

    def as_fact(self) -> dict[str, Any]:
        return {
            "foundMiB": self.found_mib,
            "limitMiB": self.limit_mib,
            "gapMiB": self.gap_mib,
            "toleranceMiB": self.tolerance_mib,
            "fidelity": self.fidelity,
            "boundedBy": self.bounded_by,
            "ok": self.ok,
        }


def judge_boundary(
    found_mib: int,
    limit_mib: int,
    fidelity: str | None,
    who: str = "it",
    search: Mapping[str, Any] | None = None,
) -> BoundaryVerdict:
    """The one tolerance rule: at or below ``limit_mib``, and within the tolerance below it.
    ``search``, the ``alloc-until-oom`` step, says what ended it (the verdict's ``bounded_by``); the
    rule is the same whatever did."""
    tol = tolerance_mib(limit_mib, fidelity)
    problem = ""
    if found_mib > limit_mib:
        problem = f"{who} allocated {found_mib} MiB, above its limit of {limit_mib} MiB"
    elif limit_mib - found_mib >= tol:
        problem = (
            f"{who} ran out of memory at {found_mib} MiB, {limit_mib - found_mib} MiB below its limit of "
            f"{limit_mib} MiB (tolerance {tol} MiB on a {fidelity or 'unknown'} device)"
        )
    bound = bounded_by(search) if search is not None else BOUNDED_BY_LIMIT
    if problem and bound != BOUNDED_BY_LIMIT:
        problem += f"; its search was ended by {bound}, not by the limit"
    return BoundaryVerdict(found_mib, limit_mib, tol, fidelity, problem, bound)


@dataclass(frozen=True)
class ChargeVerdict:
    """What the device counted as a container's memory on one GPU once its search stopped, against
    its limit (``judge_charged``)."""

    used_mib: int | None
    total_mib: int | None
    limit_mib: int
    found_mib: int
    problem: str = ""
    not_judged: str = ""

    def as_fact(self) -> dict[str, Any]:
        return {
            "deviceUsedMiB": self.used_mib,
            "deviceTotalMiB": self.total_mib,
            "limitMiB": self.limit_mib,
            "allocatedMiB": self.found_mib,
            "outsideLimitMiB": None if self.used_mib is None else max(0, self.used_mib - self.limit_mib),
            "notJudged": self.not_judged or None,
        }


def judge_charged(who: str, shown: Mapping[str, Any] | None, limit_mib: int, found_mib: int) -> ChargeVerdict:
    """The limit bounds everything the container holds on the GPU, its CUDA context included, as the
    device reports it (docs/contract.md §6): ``shown`` is the device's memory view after the search
    (a ``meminfo`` step's entry for that device: ``cudaMemGetInfo``, the simulated device's count),
    whose used memory must not exceed ``limit_mib``. Judged only where that view is the container's
    own (its total is the limit, as with a limit on the container's own cgroup): where the total is
    the whole GPU, used counts the neighbours' memory too, and the rule is not judged there."""
    if not shown:
        return ChargeVerdict(None, None, limit_mib, found_mib, not_judged=f"{who} reported no memory view")
    used = int(shown.get("used") or 0)
    total = int(shown.get("total") or 0)
    used_mib, total_mib = -(-used // MiB), total // MiB
    if total_mib != limit_mib:
        return ChargeVerdict(
            used_mib,
            total_mib,
            limit_mib,
            found_mib,
            not_judged=f"{who}'s memory view reports a total of {total_mib} MiB, not its limit of "
            f"{limit_mib} MiB: its used memory is not the container's own",
        )
    problem = ""
    if used > limit_mib * MiB:
        problem = (
            f"{who} holds {used_mib} MiB on its GPU as the device reports it (used memory after its "
            f"search), {used_mib - limit_mib} MiB above its limit of {limit_mib} MiB, with {found_mib} MiB "
            "allocated: memory it holds (its CUDA context, what its allocations cost) is left outside "
            "the limit"
        )
    return ChargeVerdict(used_mib, total_mib, limit_mib, found_mib, problem)


def search_overran(who: str, search: Mapping[str, Any], limit_mib: int) -> str:
    """Why an ``alloc-until-oom`` search that stopped without an out-of-memory, holding more than the
    device reports as its total (``stopped_by: above-total``), fails: allocations past the limit were
    granted and not charged. Empty for any other search."""
    if search.get("stopped_by") != "above-total":
        return ""
    held = int(search.get("max_bytes") or 0) // MiB
    total = int(search.get("device_total") or 0) // MiB
    return (
        f"{who}'s alloc-until-oom step held {held} MiB in {search.get('allocs')} allocations, more than "
        f"its limit of {limit_mib} MiB (the device reports a total of {total} MiB) and never met an "
        "out-of-memory: allocations were granted without being charged against the limit, and the "
        "search was stopped there"
    )


def searches_by_device(result: Mapping[str, Any] | None) -> dict[int, dict[str, Any]]:
    """A workload's ``alloc-until-oom`` steps by the device each searched (container-visible
    ordinal; a later search of one device replaces an earlier one)."""
    out: dict[int, dict[str, Any]] = {}
    for step in (result or {}).get("steps") or []:
        if step.get("op") == "alloc-until-oom":
            out[int(step.get("device") or 0)] = dict(step)
    return out


def judge_smi_usage(
    who: str,
    listed: Sequence[Mapping[str, Any]],
    own_mib: Mapping[int, int],
    neighbour_mib: Mapping[int, int],
    limit_mib: int,
    fidelity: str | None,
) -> list[str]:
    """Whether nvidia-smi's used memory is the container's own (docs/contract.md §5), per GPU it
    lists (``listed``: the ``smi`` step's ``gpus``, by container ordinal ``index``).

    ``own_mib``: what the container allocated there; ``neighbour_mib``: what other containers hold
    on the same GPU. Used must count every MiB of its own allocation, and no more than the one
    tolerance above it (``tolerance_mib``: a CUDA context, pages, driver reservations; exact on the
    ideal device), so a neighbour's memory larger than the tolerance cannot hide in it."""
    tol = tolerance_mib(limit_mib, fidelity)
    problems = []
    for gpu in listed:
        index, used = int(gpu.get("index") or 0), int(gpu.get("used_mib") or 0)
        own, other = own_mib.get(index, 0), neighbour_mib.get(index, 0)
        where = f"GPU {index} ({gpu.get('uuid')})"
        if used < own:
            problems.append(
                f"{who}: nvidia-smi shows {used} MiB used on {where}, less than the {own} MiB it "
                "allocated there: its own memory is not counted"
            )
        elif used - own > tol:
            extra = used - own
            whose = (
                f"; a neighbour holds {other} MiB on that GPU: its memory is counted as the container's"
                if other and extra >= other
                else ""
            )
            problems.append(
                f"{who}: nvidia-smi shows {used} MiB used on {where}, {extra} MiB more than the {own} MiB "
                f"it allocated there (tolerance {tol} MiB on a {fidelity or 'unknown'} device){whose}"
            )
    return problems


def judge_smi_view(
    who: str,
    listed: Sequence[Mapping[str, Any]],
    identities: Sequence[str],
    assigned: Sequence[str],
    limit_mib: int,
    own_mib: Mapping[int, int],
    neighbour_mib: Mapping[int, int],
    fidelity: str | None,
) -> list[str]:
    """``smi-visibility``'s judgement of one container's ``smi`` step (``listed``: its ``gpus``):
    exactly the ``assigned`` GPUs (``identities``: each listed GPU's identity, resolved as
    ``assigned`` is), each with memory.total equal to ``limit_mib`` (exact: the shim reports the
    limit, it does not measure it), and used counting its own allocations only
    (``judge_smi_usage``). Empty when all of it holds."""
    problems = []
    if sorted(identities) != sorted(assigned) or len(identities) != len(assigned):
        problems.append(
            f"{who}: nvidia-smi lists {', '.join(identities) or 'no GPU'}, but it was assigned "
            f"{', '.join(assigned)}"
        )
    wrong = {str(g.get("uuid")): g.get("total_mib") for g in listed if g.get("total_mib") != limit_mib}
    if wrong:
        problems.append(
            f"{who}: memory.total "
            + ", ".join(f"{t} MiB on {u}" for u, t in wrong.items())
            + f", expected its limit of {limit_mib} MiB"
        )
    return problems + judge_smi_usage(who, listed, own_mib, neighbour_mib, limit_mib, fidelity)


# ----------------------------------------------------------------------------------- eviction


def kept_bytes(name: str, held_mib: int, read_back: Mapping[str, Any]) -> str:
    """Why ``name``'s read-back (its ``verify`` step) shows it did not keep the ``held_mib`` it
    wrote; empty when every byte it wrote read back as written."""
    if not read_back:
        return f"{name} never read back the {held_mib} MiB it wrote: nothing shows it kept them"
    if read_back.get("outcome") not in ("ok", "corrupted"):
        detail = read_back.get("message") or read_back.get("outcome")
        return f"{name} could not read back the {held_mib} MiB it wrote ({detail})"
    mismatched = int(read_back.get("mismatched") or 0)
    read = int(read_back.get("bytes") or 0)
    if read_back.get("outcome") == "corrupted" or mismatched:
        pieces = ", ".join(
            f"{int(b.get('mismatched') or 0) / MiB:.1f} of {int(b.get('bytes') or 0) // MiB} MiB on device "
            f"{b.get('device')}"
            for b in read_back.get("bad") or []
        )
        return (
            f"{name} read back {mismatched / MiB:.1f} MiB of the {held_mib} MiB it wrote differently from "
            f"what it wrote{f' ({pieces})' if pieces else ''}: its memory was overwritten"
        )
    if read < held_mib * MiB:
        return f"{name} read back only {read // MiB} MiB of the {held_mib} MiB it wrote"
    return ""


@dataclass(frozen=True)
class EvictionEffect:
    evicted: bool
    mechanism: str
    """What was seen: ``Eviction API``, ``detached by the node``, ``CUDA error``, ``killed``,
    ``memory reclaimed``, or ``none``."""
    detail: str = ""

    def as_fact(self) -> dict[str, Any]:
        return {"evicted": self.evicted, "mechanism": self.mechanism, "detail": self.detail}


_CUDA_ERROR_STATUSES: Final = ("device-fault", "unexpected-oom", "error")
_KILLED_EXIT_CODES: Final = (137, 9)


def eviction_effect(out: Outcome, request_mib: int | None = None) -> EvictionEffect:
    """Was ``out``'s workload evicted, judged by the effect (see the module docstring)?

    It was when it ended before the suite stopped it (any end but the suite's own stop), or when
    the least the device counted for it while it ran fell to its request or below after it had
    held more. ``request_mib`` None: the memory test is skipped.
    """
    if out.disruption:
        return EvictionEffect(True, "Eviction API", f"DisruptionTarget: {out.disruption}")
    status = out.status
    error = (out.result or {}).get("error") or {}
    if status == "client-gone":
        return EvictionEffect(
            True, "detached by the node", str(error.get("reason") or error.get("message") or "")
        )
    if status in _CUDA_ERROR_STATUSES:
        return EvictionEffect(
            True, "CUDA error", f"{error.get('type') or status}: {error.get('message') or ''}"[:300]
        )
    if out.result is None and (out.exit_code in _KILLED_EXIT_CODES or out.reason in ("Error", "OOMKilled")):
        return EvictionEffect(
            True, "killed", f"exit {out.exit_code} ({out.reason or 'no reason'}), no result"
        )
    if out.exit_code is not None and out.exit_code >= 128 and status not in ("ok", "terminated"):
        return EvictionEffect(True, "killed", f"exit {out.exit_code} ({out.reason})")
    beat = out.step("heartbeat")
    if request_mib is not None and beat.get("used_min"):
        least = min(int(u) for u in beat["used_min"]) // MiB
        if least <= request_mib and _held_above(out, request_mib):
            return EvictionEffect(True, "memory reclaimed", f"the device counted {least} MiB for it at least")
    return EvictionEffect(False, "none")


def _held_above(out: Outcome, request_mib: int) -> bool:
    held = sum(
        int(s.get("max_bytes") or s.get("bytes") or 0)
        for s in (out.result or {}).get("steps") or []
        if s.get("op") in ("alloc", "alloc-until-oom")
    )
    return held // MiB > request_mib


def held_when_ready(out: Outcome, ready_floor_mib: int | None = None) -> int | None:
    """The MiB ``out``'s workload held when it said Ready: the device's count in a ``meminfo`` step
    before its ``ready`` step, else the sum of its allocations before it. Without a result (a killed
    workload writes none): ``ready_floor_mib``, what its plan is known to hold once it was seen Ready
    (the allocations before its ``ready`` step must succeed), else None; None too when it never got
    to its ``ready`` step."""
    if out.result is None:
        return ready_floor_mib
    steps = out.result.get("steps") or []
    allocated = 0
    counted: int | None = None
    for s in steps:
        op = s.get("op")
        if op == "ready":
            return (counted if counted is not None else allocated) // MiB
        if op in ("alloc", "alloc-until-oom"):
            allocated += int(s.get("max_bytes") or s.get("bytes") or 0)
        elif op == "meminfo" and s.get("devices"):
            counted = int(s["devices"][0].get("used") or 0)
    return None


def claim_figures(out: Outcome, asked_mib: int) -> dict[str, Any]:
    """How the claimant's first allocation (its first ``alloc`` step) met the GPU: whether it was
    refused at first (and as what), granted after how long, and the free memory it saw before it
    asked (a ``meminfo`` step before the allocation); ``lacked``: the figures show it lacked memory."""
    steps = (out.result or {}).get("steps") or []
    free_mib: int | None = None
    alloc: Mapping[str, Any] = {}
    for s in steps:
        if s.get("op") == "meminfo" and s.get("devices"):
            free_mib = int(s["devices"][0].get("free") or 0) // MiB
        if s.get("op") == "alloc":
            alloc = s
            break
    resolved = alloc.get("pressure_resolved") or {}
    outcome = alloc.get("outcome")
    refused_as = resolved.get("refused_as") or (outcome if outcome in ("pressure", "oom") else None)
    return {
        "askedMiB": asked_mib,
        "freeBeforeMiB": free_mib,
        "refusedAtFirstAs": refused_as,
        "attempts": resolved.get("attempts", 1 if outcome == "ok" else None),
        "grantedAfterMs": alloc.get("ms") if outcome == "ok" else None,
        "outcome": outcome,
        "lacked": refused_as is not None or (free_mib is not None and free_mib < asked_mib),
    }


@dataclass(frozen=True)
class PressureVerdict:
    """Whether the figures show the pressure an eviction rule is about (``judge_pressure``)."""

    shown: bool
    missing: tuple[str, ...]
    """What the figures did not show, one sentence each; empty when shown."""
    figures: Mapping[str, Any]

    def as_fact(self) -> dict[str, Any]:
        return {"shown": self.shown, "missing": list(self.missing), **self.figures}


def judge_pressure(
    borrowers: Mapping[str, tuple[int | None, int]], claimant: str, claim: Mapping[str, Any]
) -> PressureVerdict:
    """Was there pressure? ``borrowers``: name -> (MiB held when Ready, ``held_when_ready``; request
    MiB); ``claim``: the claimant's ``claim_figures``. Every borrower must have held more than its
    request and the claimant must have lacked memory."""
    missing: list[str] = []
    held: dict[str, Any] = {}
    for name, (mib_held, request) in borrowers.items():
        held[name] = {
            "heldMiB": mib_held,
            "requestMiB": request,
            "aboveRequestMiB": None if mib_held is None else mib_held - request,
        }
        if mib_held is None:
            missing.append(f"{name} left no figures of what it held (no result)")
        elif mib_held <= request:
            missing.append(f"{name} held {mib_held} MiB, not more than its request of {request} MiB")
    if not claim.get("lacked"):
        missing.append(
            f"{claimant} was granted its {claim.get('askedMiB')} MiB at its first attempt (free before it "
            f"asked: {claim.get('freeBeforeMiB')} MiB): it never lacked memory"
        )
    figures = {"borrowers": held, "claimant": {"name": claimant, **claim}}
    return PressureVerdict(not missing, tuple(missing), figures)


def needless_evictions(evicted: Mapping[str, int], free_mib: int, asked_mib: int) -> list[str]:
    """The evicted borrowers (name -> MiB each held) that were not needed: the GPU's ``free_mib`` and
    what the other evicted borrowers held already covered the claimant's ``asked_mib`` without it.
    Empty when every eviction was needed (at most as many borrowers as the shortfall requires)."""
    total = sum(evicted.values())
    return [name for name, held in evicted.items() if free_mib + total - held >= asked_mib]


# ----------------------------------------------------------------------------------- compute modes

SIM_OVERLAP_SM: Final = 0.5
SIM_OVERLAP_TS: Final = 0.05
SHARED_OVER_SOLO_SM: Final = 0.7
"""Two busy sm-sharing neighbours with kernels that do not fill the GPU each keep at least this much
of their solo throughput."""
SHARED_OVER_SOLO_TS: Final = 0.7
"""Two busy time-slicing neighbours each keep at most this much: they take turns (about half)."""
MIN_SHARED_S: Final = 0.5


def compute_step(out: Outcome) -> dict[str, Any]:
    return out.step("compute")


def shared_window(first: Mapping[str, Any], second: Mapping[str, Any]) -> tuple[float, float, float]:
    """The window both compute steps ran in (start, end, seconds; seconds 0 if they never met)."""
    start = max(float(first.get("t0") or 0), float(second.get("t0") or 0))
    end = min(_end(first), _end(second))
    return start, end, max(0.0, end - start)


def _end(step: Mapping[str, Any]) -> float:
    if step.get("t_end") is not None:
        return float(step["t_end"])
    spans = step.get("spans_ms") or []  # results from before the summary
    return float(step.get("t0") or 0) + (
        float(spans[-1][1]) / 1000 if spans else float(step.get("wall_s") or 0)
    )


def _rate(step: Mapping[str, Any]) -> float:
    return float(step.get("work_per_s") or 0.0)


def compare_modes(
    solo: Mapping[str, Any], first: Mapping[str, Any], second: Mapping[str, Any]
) -> dict[str, Any]:
    """One mode's figures from three compute steps: a workload alone, then two released together.

    Throughput is each workload's own counter (``work_per_s``); the overlap is the time the device
    counted another client's kernels beside each one (``shared_s``; the simulated device only),
    over the window both computed in.
    """
    solo_rate = _rate(solo)
    _s, _e, both = shared_window(first, second)
    shared = [_rate(first), _rate(second)]
    counted = [x.get("shared_s") for x in (first, second)]
    overlap = None
    if both > 0 and all(c is not None for c in counted):
        overlap = round(min(1.0, sum(float(c) for c in counted if c is not None) / (2 * both)), 3)
    kernels = [int(x.get("kernels") or 0) for x in (first, second)]
    return {
        "soloWorkPerS": round(solo_rate, 4),
        "soloKernelsPerS": float(solo.get("kernels_per_s") or 0.0),
        "matrix": first.get("matrix"),
        "sharedSeconds": round(both, 3),
        "overlapFraction": overlap,
        "sharedWorkPerS": [round(r, 4) for r in shared],
        "sharedKernelsPerS": [float(x.get("kernels_per_s") or 0.0) for x in (first, second)],
        "kernels": kernels,
        "batchWorkPerS": round(sum(shared), 4),
        "sharedOverSolo": [round(r / solo_rate, 3) if solo_rate else None for r in shared],
        "workUnit": first.get("work_unit"),
    }


def judge_modes(figures: Mapping[str, Mapping[str, Any]], fidelity: str | None) -> list[str]:
    """Problems with two modes' figures (``compare_modes``); empty when both behave as documented.

    On the ideal simulated device, which measures exactly how long each kernel shared the GPU, the
    overlap is judged (sm-sharing kernels overlap, time-slicing ones never do): there a kernel costs
    only the time it is asked to take, so throughput says more about the machine's load (each
    kernel's round trip) than about the modes. On every other device (a real GPU, the simulated
    H200) kernel spans stretch and overlap even when the GPU takes turns, so throughput is judged.
    """
    ts, sm = figures[TIME_SLICING], figures[SM_SHARING]
    problems: list[str] = []
    if fidelity == IDEAL:
        if sm.get("overlapFraction") is not None and sm["overlapFraction"] < SIM_OVERLAP_SM:
            problems.append(
                f"sm-sharing neighbours' kernels overlapped for only {sm['overlapFraction']:.0%} of the "
                "time both computed: they did not run at the same time"
            )
        if ts.get("overlapFraction") is not None and ts["overlapFraction"] > SIM_OVERLAP_TS:
            problems.append(
                f"time-slicing neighbours' kernels overlapped for {ts['overlapFraction']:.0%} of the "
                "time both computed: they did not take turns"
            )
        return problems
    for mode, f, keeps in ((SM_SHARING, sm, True), (TIME_SLICING, ts, False)):
        for ratio in f.get("sharedOverSolo") or []:
            if ratio is None:
                continue
            if keeps and ratio < SHARED_OVER_SOLO_SM:
                problems.append(
                    f"{mode} neighbours kept only {ratio:.0%} of their solo throughput side by side "
                    f"(kernel size {f.get('matrix')}, calibrated not to fill the GPU): they did not run at "
                    "the same time"
                )
            if not keeps and ratio > SHARED_OVER_SOLO_TS:
                problems.append(
                    f"{mode} neighbours kept {ratio:.0%} of their solo throughput: they did not take turns"
                )
    return problems


def too_short(figures: Mapping[str, Mapping[str, Any]], minimum_s: float = MIN_SHARED_S) -> list[str]:
    """The modes whose neighbours computed side by side for less than ``minimum_s``."""
    return [m for m, f in figures.items() if float(f.get("sharedSeconds") or 0) < minimum_s]


def calibrated_matrix(solo: Mapping[str, Any]) -> int | None:
    """The kernel size a solo run's ``calibrate`` step picked."""
    for step in solo.get("steps") or []:
        if step.get("op") == "calibrate" and step.get("matrix"):
            return int(step["matrix"])
    return None


def kernel_rates(steps: Sequence[Mapping[str, Any]]) -> float:
    """Kernels per second of several compute steps together, over the window from the first start to
    the last end (density-ramp's GPU throughput)."""
    if not steps:
        return 0.0
    start = min(float(s.get("t0") or 0) for s in steps)
    end = max(_end(s) for s in steps)
    kernels = sum(int(s.get("kernels") or 0) for s in steps)
    return round(kernels / (end - start), 2) if end > start else 0.0


# ----------------------------------------------------------------------------------- mode guard


@dataclass(frozen=True)
class Intrusion:
    """A container placed on a GPU that already runs the other compute mode: who asks, who holds it."""

    pod: str
    asks: str
    """The mode it asks for, as written (``time-slicing``, ``sm-sharing``, or no annotation: the
    default, time-slicing)."""
    gpu: str
    holder: str
    """The Pod already running on ``gpu``."""
    holder_mode: str
    written: bool = True
    """Whether its mode annotation is written; False: none, so it is time-slicing by default."""

    @property
    def shown(self) -> str:
        return self.asks if self.written else f"{self.asks}, no mode annotation"

    def as_fact(self) -> dict[str, Any]:
        return {
            "pod": self.pod,
            "asks": self.shown,
            "gpu": self.gpu,
            "holder": self.holder,
            "holderMode": self.holder_mode,
        }


def names_mode_conflict(text: str) -> bool:
    """Whether ``text`` says that the compute modes conflict: it names both of them."""
    low = text.lower()
    return SM_SHARING in low and TIME_SLICING in low


def judge_intrusion(
    intrusion: Intrusion, started: bool, said: Sequence[str], *, final: bool = True
) -> str | None:
    """The mode guard's judgement of one intrusion: empty when it did not start and something it said
    names both modes; a problem when not; None while not ``final`` and it may still settle (the node
    has time left to refuse, or to explain)."""
    what = f"{intrusion.pod} ({intrusion.shown})"
    if started:
        return (
            f"{what} started on GPU {intrusion.gpu}, which already runs {intrusion.holder} "
            f"({intrusion.holder_mode}): the node mixed the compute modes"
        )
    if any(names_mode_conflict(s) for s in said):
        return ""
    if not final:
        return None
    return (
        f"{what} did not start on GPU {intrusion.gpu} beside {intrusion.holder} ({intrusion.holder_mode}), "
        f"but nothing it says names the compute modes' conflict{': ' + said[-1] if said else ''}"
    )


# ---- readiness without a backend (agent-readiness)


def judge_condition_turn(
    condition: str, want: bool, took_s: float | None, window_s: float, after: str
) -> str | None:
    """The node condition had to turn ``want`` within ``window_s`` of ``after``; it took ``took_s``
    seconds (None: it never did while watched). Returns the problem, or None."""
    if took_s is not None and took_s <= window_s:
        return None
    status = "True" if want else "False"
    if took_s is None:
        return f"the node condition {condition} did not turn {status} within {window_s:g} s of {after}"
    return (
        f"the node condition {condition} turned {status} {took_s:.1f} s after {after}, later than "
        f"{window_s:g} s"
    )


def container_started(pods: Sequence[Mapping[str, Any]], container: str) -> str | None:
    """What in ``pods`` (a Pod's snapshots, in order) shows ``container`` started (a running or an
    ended state: a process ran), or None when every snapshot shows it not started."""
    for pod in pods:
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            if cs.get("name") != container:
                continue
            state = cs.get("state") or {}
            if "running" in state:
                return f"running since {state['running'].get('startedAt') or 'an unknown time'}"
            if "terminated" in state:
                ended = state["terminated"]
                return f"ran and ended ({ended.get('reason') or 'exit'} {ended.get('exitCode')})"
    return None


def judge_held(
    name: str, pods: Sequence[Mapping[str, Any]], container: str, held_s: float, why: str
) -> str | None:
    """``name``'s ``container`` must not have started in the ``held_s`` seconds watched (``pods``,
    its snapshots); ``why``: what kept it from being fenced. Returns the problem, or None."""
    started = container_started(pods, container)
    if started is None:
        return None
    return f"{name} was created while {why}, and its container started anyway ({started}): it runs unfenced"


def waiting_reason(pods: Sequence[Mapping[str, Any]], container: str) -> str:
    """The last waiting reason and message ``pods`` show for ``container`` ('' if none): the evidence of
    why it is held."""
    said = ""
    for pod in pods:
        for cs in (pod.get("status") or {}).get("containerStatuses") or []:
            waiting = (cs.get("state") or {}).get("waiting") or {}
            if cs.get("name") == container and (waiting.get("reason") or waiting.get("message")):
                said = f"{waiting.get('reason') or ''}: {waiting.get('message') or ''}".strip(": ")
    return said

"""What the reports read out of a check's evidence: boundaries, borrowing, evictions, modes, density.

A check leaves its evidence as ``Evidence.summary()`` (``facts``, ``pods``, ``workloads``, ``notes``,
``files``; fixtures/suite/evidence.py). The renderings and ``gpuconf report diff`` read the measurements
below from it. Each has one preferred shape, a ``facts`` entry a check writes on purpose, and is
otherwise derived from what the check recorded anyway (workload results, the probe's evidence):

``facts["boundary"]``
    ``{"limitMiB": L, "foundMiB": F, "boundedBy": B?, "toleranceMiB": T?}``: the hard limit and where
    an allocation first failed, and what bounded it (``bounded_by``: ``the limit``; or ``the GPU's
    free memory`` where neighbours held the rest, ``a neighbour's claim`` where memory pressure
    refused it, ``the search's own ceiling``: then the distance to the limit is no error, and no
    ``boundaryErrorMiB`` is derived), and how far below the limit still passes.
    Derived from a workload's ``alloc-until-oom`` step (``max_bytes``) with the Pod's limit at
    binding, or the probe's ``limit_bytes`` / ``max_allocated_bytes``.
``facts["borrowing"]``
    ``{"requestMiB", "limitMiB", "heldMiB", "held": bool}``: memory held between request and limit.
``facts["eviction"]``
    ``{"evicted": [pod], "kept": [pod], "reason": str, "seconds": float}``: who was evicted under
    pressure, why, and how fast. Also read from the eviction checks' ``outcomes`` (or ``borrower``)
    with ``pressure.grantedAfterMs``, and the probe's ``evicted_pods``, ``eviction_events``, ``reaction_s``.
``facts["memoryTimeline"]``
    ``{workload: {"requestMiB", "limitMiB", "points": [[seconds, MiB], ...]}}``: memory over time.
``facts["modes"]``
    ``{mode: {"completionSeconds", "throughput", "overlap", "faultIsolated"}}``; derived per mode
    from the workloads' ``compute`` steps (their kernel spans, ``work_per_s``) and the Pods' modes.
``facts["densityRamp"]``
    ``[{"pods": n, "seconds": s, "throughput": t}, ...]``: a density ramp, one point per step.

``CheckResult.figures`` are the numbers a later run is compared on; ``figures_of`` adds the ones
derived here: ``boundaryErrorMiB``, ``evictionSeconds``, ``throughput.<mode>``, ``overlap.<mode>``,
``completionSeconds.<mode>``, ``density.maxPods``, ``density.throughput``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from reports.model import CheckResult, RunRecord
from workloads.plan import MiB

MODE_SUFFIX: Final = ".gpu-compute.mode"
LIMIT_SUFFIX: Final = ".gpu-memory.limit"
REQUEST_SUFFIX: Final = ".gpu-memory.request"


def resolve(record: RunRecord | None, path: str) -> Path | None:
    """An evidence file named in a result: under the run directory (where a moved run keeps it), else as
    written."""
    p = Path(path)
    if record is not None and record.directory is not None:
        parts = p.parts
        candidates = (
            [record.directory.joinpath(*parts[parts.index("evidence") :])] if "evidence" in parts else []
        )
        if not p.is_absolute():
            candidates.append(record.directory / p)
        for candidate in candidates:
            if candidate.is_file():
                return candidate
    return p if p.is_file() else None


def section(record: RunRecord | None, result: CheckResult, name: str) -> Any:
    """One evidence section; one that was moved to a file (``{"file": path}``) is read back."""
    value = result.evidence.get(name)
    if isinstance(value, Mapping) and set(value) == {"file"}:
        found = resolve(record, str(value["file"]))
        return json.loads(found.read_text()) if found else None
    return value


def facts(record: RunRecord | None, result: CheckResult) -> dict[str, Any]:
    found = section(record, result, "facts")
    return dict(found) if isinstance(found, Mapping) else {}


def pods(record: RunRecord | None, result: CheckResult) -> dict[str, dict[str, Any]]:
    found = section(record, result, "pods")
    return {str(k): dict(v) for k, v in found.items() if isinstance(v, Mapping)} if found else {}


def workloads(record: RunRecord | None, result: CheckResult) -> dict[str, dict[str, Any]]:
    found = section(record, result, "workloads")
    return {str(k): dict(v) for k, v in (found or {}).items() if isinstance(v, Mapping)}


def files(record: RunRecord | None, result: CheckResult) -> dict[str, Path]:
    out = {}
    for name, path in (result.evidence.get("files") or {}).items():
        found = resolve(record, str(path))
        if found is not None:
            out[str(name)] = found
    return out


def _mib(value: Any) -> float | None:
    """A MiB figure from an annotation value (``4096Mi``, ``4Gi``, ``4096``) or a number."""
    if isinstance(value, int | float):
        return float(value)
    if not isinstance(value, str) or not value:
        return None
    units = {"Ki": 1 / 1024, "Mi": 1.0, "Gi": 1024.0, "Ti": 1024.0 * 1024}
    for unit, factor in units.items():
        if value.endswith(unit):
            try:
                return float(value[: -len(unit)]) * factor
            except ValueError:
                return None
    try:
        return float(value)
    except ValueError:
        return None


def _annotation(pod: Mapping[str, Any], suffix: str) -> str | None:
    for key, value in (pod.get("annotationsAtBind") or {}).items():
        if str(key).endswith(suffix):
            return str(value)
    return None


def _steps(result: Mapping[str, Any], op: str) -> list[dict[str, Any]]:
    return [dict(s) for s in result.get("steps") or [] if isinstance(s, Mapping) and s.get("op") == op]


# ----------------------------------------------------------------------------- measurements


BOUNDED_BY_LIMIT: Final = "the limit"
BOUNDED_BY_DEVICE: Final = "the GPU's free memory"
BOUNDED_BY_NEIGHBOUR: Final = "a neighbour's claim (memory pressure)"
BOUNDED_BY_CEILING: Final = "the search's own ceiling"


@dataclass
class Boundary:
    workload: str
    limit_mib: float
    found_mib: float
    bounded_by: str = BOUNDED_BY_LIMIT
    """What stopped the search: the limit (the fence), or what the GPU had left (a neighbour held
    the rest), a neighbour's claim, the search's own ceiling, in which case the distance to the
    limit is no error."""
    tolerance_mib: float | None = None
    """How far below the limit a search bounded by it may end and still pass (None: not recorded)."""

    @property
    def error_mib(self) -> float:
        return abs(self.found_mib - self.limit_mib)

    @property
    def by_limit(self) -> bool:
        return self.bounded_by == BOUNDED_BY_LIMIT

    @property
    def within_tolerance(self) -> bool | None:
        """Whether a search the limit ended came close enough to it (``conformance.judgements``'
        rule: at or below it, less than the tolerance below); None: not bounded by it, or no
        tolerance recorded."""
        if not self.by_limit or self.tolerance_mib is None:
            return None
        return self.found_mib <= self.limit_mib and self.limit_mib - self.found_mib < self.tolerance_mib


def bounded_by(step: Mapping[str, Any]) -> str:
    """What ended an ``alloc-until-oom`` search, from what the workload and the device said: an
    out-of-memory error the device gives no other reason for is the limit's (a real GPU names none)."""
    stopped = step.get("stopped_by")
    if stopped == "pressure":
        return BOUNDED_BY_NEIGHBOUR
    if stopped in ("limit", "above-total"):  # its own ceiling: a limit, or the device's total passed
        return BOUNDED_BY_CEILING
    reason = str((step.get("oom") or {}).get("reason") or "")
    if reason in ("device-full", "guarantee-unsatisfiable"):
        return BOUNDED_BY_DEVICE
    return BOUNDED_BY_LIMIT


def boundaries(record: RunRecord | None, result: CheckResult) -> list[Boundary]:
    f = facts(record, result)
    out: list[Boundary] = []
    given = f.get("boundary")
    if isinstance(given, Mapping) and given.get("limitMiB") is not None and given.get("foundMiB") is not None:
        out.append(
            Boundary(
                str(given.get("workload") or "main"),
                given["limitMiB"],
                given["foundMiB"],
                str(given.get("boundedBy") or BOUNDED_BY_LIMIT),
                tolerance if isinstance(tolerance := given.get("toleranceMiB"), int | float) else None,
            )
        )
    elif "limit_bytes" in f and "max_allocated_bytes" in f:
        out.append(Boundary("probe", f["limit_bytes"] / MiB, max(0, f["max_allocated_bytes"]) / MiB))
    if out:
        return out
    pod_info = pods(record, result)
    for name, res in workloads(record, result).items():
        for step in _steps(res, "alloc-until-oom"):
            limit = _mib(_annotation(pod_info.get(name, {}), LIMIT_SUFFIX)) or _mib(
                _annotation(pod_info.get(name, {}), REQUEST_SUFFIX)
            )
            if limit is not None and step.get("max_bytes") is not None:
                out.append(Boundary(name, limit, int(step["max_bytes"]) / MiB, bounded_by(step)))
    return out


@dataclass
class Borrowing:
    request_mib: float | None
    limit_mib: float | None
    held_mib: float | None
    held: bool | None


def borrowing(record: RunRecord | None, result: CheckResult) -> Borrowing | None:
    f = facts(record, result)
    given = f.get("borrowing")
    if isinstance(given, Mapping):
        return Borrowing(
            given.get("requestMiB"), given.get("limitMiB"), given.get("heldMiB"), given.get("held")
        )
    if {"request_mib", "limit_mib", "allocated_mib"} <= set(f):
        return Borrowing(f["request_mib"], f["limit_mib"], f["allocated_mib"], f.get("exit_code") == 0)
    return None


@dataclass
class Eviction:
    evicted: list[str]
    kept: list[str] = field(default_factory=list)
    reason: str = ""
    seconds: float | None = None


def eviction(record: RunRecord | None, result: CheckResult) -> Eviction | None:
    f = facts(record, result)
    given = f.get("eviction")
    if isinstance(given, Mapping):
        return Eviction(
            [str(p) for p in given.get("evicted") or []],
            [str(p) for p in given.get("kept") or []],
            str(given.get("reason") or ""),
            given.get("seconds"),
        )
    outcomes = f.get("outcomes") if isinstance(f.get("outcomes"), Mapping) else None
    if outcomes is None and isinstance(f.get("borrower"), Mapping) and "pressure" in f:
        outcomes = {"borrower": f["borrower"]}
    if outcomes:
        # the suite's scenario outcomes ({pod: {"disruption", "status", ...}}), beside "pressure"
        hit = {str(n): o for n, o in outcomes.items() if isinstance(o, Mapping) and o.get("disruption")}
        pressure = f.get("pressure")
        granted = pressure.get("grantedAfterMs") if isinstance(pressure, Mapping) else None
        return Eviction(
            list(hit),
            [str(n) for n in outcomes if str(n) not in hit],
            "; ".join(f"{n}: {o.get('disruption')}" for n, o in hit.items()),
            float(granted) / 1000 if granted is not None else None,
        )
    if "evicted_pods" in f:
        events = [str(e) for e in f.get("eviction_events") or []]
        return Eviction([str(p) for p in f["evicted_pods"]], [], "; ".join(events), f.get("reaction_s"))
    return None


@dataclass
class Spans:
    """One workload's kernels: ``(start, end)`` seconds on a clock shared with its neighbours."""

    workload: str
    mode: str
    spans: list[tuple[float, float]]
    wall_s: float = 0.0
    throughput: float | None = None
    unit: str = ""


def kernel_spans(record: RunRecord | None, result: CheckResult) -> list[Spans]:
    pod_info = pods(record, result)
    out = []
    for name, res in workloads(record, result).items():
        for step in _steps(res, "compute"):
            t0 = float(step.get("t0") or 0.0)
            spans = [(t0 + a / 1000.0, t0 + b / 1000.0) for a, b in step.get("spans_ms") or []]
            if not spans and step.get("t_end"):
                # Results keep a summary (the spans are in the workload's log): its compute window.
                spans = [(t0, float(step["t_end"]))]
            mode = _annotation(pod_info.get(name, {}), MODE_SUFFIX) or str(res.get("mode") or "time-slicing")
            out.append(
                Spans(
                    name,
                    mode,
                    spans,
                    float(step.get("wall_s") or 0.0),
                    step.get("work_per_s"),
                    str(step.get("work_unit") or ""),
                )
            )
    return out


def overlap(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """The share of the time either ran during which both ran (0: taking turns, 1: always together)."""
    if not a or not b:
        return 0.0
    both = 0.0
    for s1, e1 in a:
        for s2, e2 in b:
            both += max(0.0, min(e1, e2) - max(s1, s2))
    busy = sum(e - s for s, e in a) + sum(e - s for s, e in b) - both
    return round(both / busy, 4) if busy > 0 else 0.0


@dataclass
class ModeFigures:
    mode: str
    completion_s: float | None = None
    throughput: float | None = None
    unit: str = ""
    overlap: float | None = None
    fault_isolated: bool | None = None
    workloads: list[Spans] = field(default_factory=list)


def modes(record: RunRecord | None, result: CheckResult) -> dict[str, ModeFigures]:
    f = facts(record, result)
    out: dict[str, ModeFigures] = {}
    for spans in kernel_spans(record, result):
        m = out.setdefault(spans.mode, ModeFigures(spans.mode, unit=spans.unit))
        m.workloads.append(spans)
    for m in out.values():
        ends = [e for w in m.workloads for _s, e in w.spans]
        starts = [s for w in m.workloads for s, _e in w.spans]
        if ends:
            m.completion_s = round(max(ends) - min(starts), 3)
        rates = [w.throughput for w in m.workloads if w.throughput is not None]
        m.throughput = round(sum(rates), 3) if rates else None
        if len(m.workloads) >= 2:
            m.overlap = overlap(m.workloads[0].spans, m.workloads[1].spans)
    for mode, given in (f.get("modes") or {}).items():
        if not isinstance(given, Mapping):
            continue
        m = out.setdefault(str(mode), ModeFigures(str(mode)))
        m.completion_s = given.get("completionSeconds", m.completion_s)
        m.throughput = given.get("throughput", m.throughput)
        m.overlap = given.get("overlap", m.overlap)
        m.fault_isolated = given.get("faultIsolated", m.fault_isolated)
        m.unit = str(given.get("unit") or m.unit)
    return out


def memory_timelines(record: RunRecord | None, result: CheckResult) -> dict[str, dict[str, Any]]:
    given = facts(record, result).get("memoryTimeline")
    return {str(k): dict(v) for k, v in given.items() if isinstance(v, Mapping)} if given else {}


def density_ramp(record: RunRecord | None, result: CheckResult) -> list[dict[str, Any]]:
    given = facts(record, result).get("densityRamp")
    return [dict(p) for p in given if isinstance(p, Mapping)] if isinstance(given, list) else []


def figures_of(record: RunRecord | None, result: CheckResult) -> dict[str, float]:
    """The check's figures: those it recorded, plus the ones derived from its evidence."""
    out: dict[str, float] = {}
    found = [b for b in boundaries(record, result) if b.by_limit]
    if found:
        out["boundaryErrorMiB"] = round(max(b.error_mib for b in found), 3)
    ev = eviction(record, result)
    if ev is not None and ev.seconds is not None:
        out["evictionSeconds"] = round(float(ev.seconds), 4)
    for mode, m in modes(record, result).items():
        if m.throughput is not None:
            out[f"throughput.{mode}"] = float(m.throughput)
        if m.overlap is not None:
            out[f"overlap.{mode}"] = float(m.overlap)
        if m.completion_s is not None:
            out[f"completionSeconds.{mode}"] = float(m.completion_s)
    ramp = density_ramp(record, result)
    if ramp:
        out["density.maxPods"] = float(max(int(p.get("pods") or 0) for p in ramp))
        rates = [float(p["throughput"]) for p in ramp if p.get("throughput") is not None]
        if rates:
            out["density.throughput"] = max(rates)
    out.update({k: float(v) for k, v in result.figures.items()})
    return out

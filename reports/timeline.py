"""When the annotations appeared, relative to the binding, from a check's Pod timelines.

The Pod watch keeps every change of every Pod of a check (``pod-timelines.json``, one list of
snapshots per Pod: ``seen``, ``nodeName``, ``phase``, ``annotations``). The binding is the first
snapshot with a node; each ``nvidia.com/container.`` key's first appearance is measured from it
(negative: before the binding, as the contract requires).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from reports.figures import files, pods
from reports.model import CheckResult, RunRecord

PREFIX = "nvidia.com/container."
"""The per-container keys' prefix unless the run record names another (``annotationPrefix``)."""


@dataclass
class Appearance:
    key: str
    value: str
    after_bind_s: float | None
    """Seconds after the binding it first appeared (negative: before); None: never while watched."""


@dataclass
class PodTimeline:
    pod: str
    node: str
    bound_at: float | None
    keys: list[Appearance] = field(default_factory=list)
    phases: list[tuple[float, str]] = field(default_factory=list)


def _load(record: RunRecord | None, result: CheckResult) -> dict[str, list[dict[str, Any]]]:
    path = files(record, result).get("pod-timelines.json")
    if path is None:
        return {}
    data = json.loads(path.read_text())
    return {str(k): [dict(s) for s in v] for k, v in data.items() if isinstance(v, list)}


def timelines(record: RunRecord | None, result: CheckResult) -> list[PodTimeline]:
    """One per Pod of the check; without timelines, the annotations at binding alone."""
    raw = _load(record, result)
    prefix = str((record.under_test if record else {}).get("annotationPrefix") or PREFIX)
    out = []
    for pod, snaps in raw.items():
        bound = next((s for s in snaps if s.get("nodeName")), None)
        bound_at = float(bound["seen"]) if bound else None
        first: dict[str, tuple[float, str]] = {}
        phases: list[tuple[float, str]] = []
        for s in snaps:
            for key, value in (s.get("annotations") or {}).items():
                if key.startswith(prefix) and key not in first:
                    first[key] = (float(s["seen"]), str(value))
            phase = str(s.get("phase") or "")
            if phase and (not phases or phases[-1][1] != phase):
                phases.append((float(s["seen"]), phase))
        keys = [
            Appearance(k, v, round(t - bound_at, 3) if bound_at is not None else None)
            for k, (t, v) in sorted(first.items())
        ]
        out.append(PodTimeline(pod, str(bound["nodeName"]) if bound else "", bound_at, keys, phases))
    if out:
        return out
    for pod, info in pods(record, result).items():
        at_bind = info.get("annotationsAtBind") or {}
        keys = [Appearance(k, str(v), 0.0) for k, v in sorted(at_bind.items())]
        out.append(PodTimeline(pod, str(info.get("node") or ""), info.get("boundAt"), keys))
    return out

"""How good is the suite that made a run: the mutation score of its version, as every report states it.

``gpuconf mutate --write-score`` records, in ``conformance/mutation-score.json``, how many of the
seeded faults (a reference scheduler or node agent broken on purpose, one duty at a time) this
version of the suite caught, and per fault its kind, its verdict (``caught``, ``ESCAPED``, ``not
judged``) and the checks that caught it. It scores each simulated-GPU fidelity it was asked for
(``--fidelity ideal --fidelity h200``) on its own: each under ``fidelities`` (with its date, its
mode, ``quick`` or ``full``, and any fault judged again by hand under ``rejudged``), and the first
one also at the top, the shape of a file from before fidelities, which is still read as one score.

A run carries that file's content as it is (``RunRecord.suite_validation``); the reports read it
through ``validations`` (every fidelity's score) and ``validation`` (the first one; ``None``: no
score was recorded for this version). A file written by hand or by an older ``gpuconf mutate`` may
lack a part: what it lacks is left empty, never guessed, except the counts, which follow from the
per-fault verdicts when the file gives none, and a fidelity's mode, which is the file's when the
fidelity gives none.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Final

from reports.model import RunRecord

CAUGHT: Final = "caught"
COMMAND: Final = "gpuconf mutate --write-score"
MODES: Final = ("quick", "full")
"""``quick``: each fault judged on the checks expected to catch it; ``full``: on its whole profile."""


@dataclass
class FaultRow:
    """One seeded fault and what the suite made of it."""

    fault: str
    kind: str
    verdict: str
    caught_by: list[str] = field(default_factory=list)

    @property
    def caught(self) -> bool:
        return self.verdict == CAUGHT


@dataclass
class SuiteValidation:
    caught: int
    seeded: int
    date: str
    """When the mutation run was (as ``gpuconf mutate`` wrote it; empty: unknown)."""
    faults: list[FaultRow]
    fidelity: str = ""
    """The simulated GPUs' fidelity the faults were judged on (``ideal``, ``h200``; empty: unknown)."""
    mode: str = ""
    """``quick`` or ``full`` (``MODES``; empty: unknown)."""
    rejudged: dict[str, str] = field(default_factory=dict)
    """Faults judged again after the run, each with when and why, as the file says."""

    @property
    def escaped(self) -> list[str]:
        """The faults no check caught: escaped, or not judged (the suite could not tell)."""
        return [f.fault for f in self.faults if not f.caught]

    def line(self) -> str:
        """``N of M seeded faults caught (FIDELITY fidelity, MODE mode, mutation run of DATE)``, with
        only the labels the file gives."""
        labels = [f"{self.fidelity} fidelity"] if self.fidelity else []
        labels += [f"{self.mode} mode"] if self.mode else []
        labels += [f"mutation run of {readable_date(self.date)}"] if self.date else []
        return f"{self.caught} of {self.seeded} seeded faults caught" + (
            f" ({', '.join(labels)})" if labels else ""
        )


def readable_date(text: str) -> str:
    """An ISO date as ``YYYY-MM-DD HH:MM UTC`` (or as given, when it is not one)."""
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        return text
    if when.utcoffset() == timedelta(0):
        return when.strftime("%Y-%m-%d %H:%M UTC")
    return when.isoformat(sep=" ", timespec="minutes")


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else default


def validations(record: RunRecord) -> list[SuiteValidation]:
    """Every fidelity's mutation score the record carries, in the order written (empty: none)."""
    data = record.suite_validation
    if not isinstance(data, dict):
        return []
    given = data.get("fidelities")
    if isinstance(given, dict) and given:
        mode = _mode(data.get("mode"))
        found = [
            _score(entry, fidelity=str(name), mode=mode)
            for name, entry in given.items()
            if isinstance(entry, dict)
        ]
        return [v for v in found if v is not None]
    one = _score(data)
    return [one] if one is not None else []


def validation(record: RunRecord) -> SuiteValidation | None:
    """The first fidelity's mutation score the record carries (the file's top too), or ``None``."""
    found = validations(record)
    return found[0] if found else None


def _mode(value: Any) -> str:
    """``quick`` or ``full`` from what the file says (a hand-written ``quick (...)`` too); else empty."""
    first = str(value or "").split(" ", 1)[0].strip(",;()")
    return first if first in MODES else ""


def _score(data: dict[str, Any], fidelity: str = "", mode: str = "") -> SuiteValidation | None:
    """One score from its part of the file; ``fidelity`` and ``mode`` when the part gives none."""
    if not (data.get("score") or data.get("faults")):
        return None
    faults = data.get("faults")
    if isinstance(faults, list):  # the shape of ``gpuconf mutate``'s own mutation.json
        faults = {f.get("fault"): f for f in faults if isinstance(f, dict) and f.get("fault")}
    rows = []
    for name, given in (faults if isinstance(faults, dict) else {}).items():
        entry = given if isinstance(given, dict) else {}
        caught_by = entry.get("caughtBy", entry.get("caught_by"))
        rows.append(
            FaultRow(
                fault=str(name),
                kind=str(entry.get("kind") or ""),
                verdict=str(entry.get("verdict") or "not judged"),
                caught_by=[str(k) for k in caught_by] if isinstance(caught_by, list) else [],
            )
        )
    score = found if isinstance(found := data.get("score"), dict) else {}
    again = data.get("rejudged")
    return SuiteValidation(
        caught=_int(score.get("caught"), sum(r.caught for r in rows)),
        seeded=_int(score.get("seeded"), len(rows)),
        date=str(data.get("date") or ""),
        faults=rows,
        fidelity=str(data.get("fidelity") or fidelity),
        mode=_mode(data.get("mode")) or mode,
        rejudged={
            str(fault): ": ".join(
                x for x in (readable_date(str(e.get("date") or "")), str(e.get("why") or "")) if x
            )
            for fault, e in (again.items() if isinstance(again, dict) else ())
            if isinstance(e, dict)
        },
    )


def read_score(path: Path) -> dict[str, Any]:
    """The content of a ``mutation-score.json`` as it is; empty when there is none (or it is no JSON object).

    What a run puts in ``RunRecord.suite_validation``: a missing or broken score never stops a run.
    """
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}

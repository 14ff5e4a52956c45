"""How good is the suite that made a run: the mutation score of its version, as every report states it.

``gpuconf mutate --write-score`` records, in ``conformance/mutation-score.json``, how many of the
seeded faults (a reference scheduler or node agent broken on purpose, one duty at a time) this
version of the suite caught, and per fault its kind, its verdict (``caught``, ``ESCAPED``, ``not
judged``) and the checks that caught it. A run carries that file's content as it is
(``RunRecord.suite_validation``); the reports read it through ``validation`` (``None``: no score
was recorded for this version). A file written by hand or by an older ``gpuconf mutate`` may lack
a part: what it lacks is left empty, never guessed, except the counts, which follow from the
per-fault verdicts when the file gives none.
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

    @property
    def escaped(self) -> list[str]:
        """The faults no check caught: escaped, or not judged (the suite could not tell)."""
        return [f.fault for f in self.faults if not f.caught]

    def line(self) -> str:
        """``N of M seeded faults caught (mutation run of DATE)``."""
        when = f" (mutation run of {readable_date(self.date)})" if self.date else ""
        return f"{self.caught} of {self.seeded} seeded faults caught{when}"


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


def validation(record: RunRecord) -> SuiteValidation | None:
    """The mutation score the record carries, or ``None`` when it carries none."""
    data = record.suite_validation
    if not isinstance(data, dict) or not (data.get("score") or data.get("faults")):
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
    return SuiteValidation(
        caught=_int(score.get("caught"), sum(r.caught for r in rows)),
        seeded=_int(score.get("seeded"), len(rows)),
        date=str(data.get("date") or ""),
        faults=rows,
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

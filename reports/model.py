"""The result model: one run (or one probe) as plain data, and the files every run writes.

Everything that shows a result (the terminal lines and summary, the per-check JSON, JUnit, and the
renderings that build on them) reads these values; nothing renders from pytest's own reports. The
pytest plugin fills the model on the controller, so it is whole under pytest-xdist.

Outcomes: ``passed``, ``failed`` (the implementation broke the rule), ``skipped`` (a feature it
does not support, with the reason) and ``error`` (the suite could not judge). Exit codes follow
from them: 0 when no MUST check failed or errored, 1 when a MUST check failed, 3 when none failed
but one could not be judged (2 is for usage and preflight errors, before any check runs).
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final, Literal

Outcome = Literal["passed", "failed", "skipped", "error"]
OUTCOMES: Final[tuple[Outcome, ...]] = ("passed", "failed", "skipped", "error")
EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2
EXIT_NOT_JUDGED: Final = 3
SCHEMA: Final = "gpuconf.io/v1alpha1"


@dataclass
class CheckResult:
    """One check item's verdict, with what it judged and the evidence."""

    key: str
    """``<profile>/<id>`` (plus ``[form]`` for a per-form check)."""
    id: str
    profile: str
    party: str
    level: str
    statement: str
    capability: str
    outcome: Outcome
    reason: str = ""
    """One line: why it failed, errored or was skipped (empty when it passed)."""
    detail: str = ""
    duration_s: float = 0.0
    features: list[str] = field(default_factory=list)
    seed: str = ""
    form: str | None = None
    evidence: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    nodeid: str = ""

    def line(self) -> str:
        """What ``gpuconf run`` prints as the check finishes."""
        mark = {"passed": "PASS", "failed": "FAIL", "skipped": "SKIP", "error": "ERROR"}[self.outcome]
        level = "" if self.level == "MUST" else f" ({self.level})"
        text = f"{mark:<5} {self.key}{level}  {self.duration_s:.1f}s"
        return f"{text}  {self.reason}" if self.reason else text

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class RunRecord:
    """One run: what was judged, against what, with which options, and every check's result."""

    run_id: str
    started: float
    finished: float
    target: dict[str, Any]
    options: dict[str, Any]
    results: list[CheckResult]
    preflight: dict[str, Any] = field(default_factory=dict)
    interrupted: bool = False

    def counts(self) -> Counter[str]:
        return Counter(r.outcome for r in self.results)

    def exit_code(self) -> int:
        must = [r for r in self.results if r.level == "MUST"]
        if any(r.outcome == "failed" for r in must):
            return EXIT_FAILED
        if any(r.outcome == "error" for r in must) or self.interrupted:
            return EXIT_NOT_JUDGED
        return EXIT_OK

    def verdict_line(self) -> str:
        c = self.counts()
        parts = ", ".join(f"{c[o]} {o}" for o in OUTCOMES if c[o])
        verdict = {
            EXIT_OK: "CONFORMANT: every MUST check that ran passed",
            EXIT_FAILED: "NOT CONFORMANT: a MUST check failed",
            EXIT_NOT_JUDGED: "NOT JUDGED: a MUST check could not be judged (error)",
        }[self.exit_code()]
        if self.interrupted:
            verdict += " (the run was interrupted)"
        return f"{verdict}; {parts} in {self.finished - self.started:.0f} s"

    def summary_table(self) -> list[str]:
        rows = [("CHECK", "LEVEL", "PARTY", "OUTCOME", "SECONDS", "REASON")]
        for r in self.results:
            rows.append((r.key, r.level, r.party, r.outcome.upper(), f"{r.duration_s:.1f}", r.reason[:100]))
        widths = [max(len(row[i]) for row in rows) for i in range(5)]
        return [
            "  ".join(c.ljust(w) for c, w in zip(row[:5], widths, strict=True)) + "  " + row[5]
            for row in rows
        ]

    def as_dict(self) -> dict[str, Any]:
        c = self.counts()
        return {
            "apiVersion": SCHEMA,
            "kind": "ConformanceRun",
            "runId": self.run_id,
            "date": datetime.fromtimestamp(self.started, UTC).isoformat(timespec="seconds"),
            "durationSeconds": round(self.finished - self.started, 1),
            "target": self.target,
            "options": self.options,
            "preflight": self.preflight,
            "interrupted": self.interrupted,
            "statistics": {o: c[o] for o in OUTCOMES},
            "exitCode": self.exit_code(),
            "results": [r.as_dict() for r in self.results],
        }


def load_run(directory: Path) -> RunRecord:
    """Read back a run written by ``write_run``."""
    data = json.loads((directory / "run.json").read_text())
    results = [CheckResult(**r) for r in data["results"]]
    started = datetime.fromisoformat(data["date"]).timestamp()
    return RunRecord(
        run_id=data["runId"],
        started=started,
        finished=started + float(data["durationSeconds"]),
        target=data["target"],
        options=data["options"],
        results=results,
        preflight=data.get("preflight") or {},
        interrupted=bool(data.get("interrupted")),
    )


def write_run(record: RunRecord, directory: Path) -> list[Path]:
    """Write ``run.json``, one JSON file per check under ``checks/``, and ``junit.xml``."""
    from reports.junit import write_junit

    directory.mkdir(parents=True, exist_ok=True)
    checks = directory / "checks"
    checks.mkdir(exist_ok=True)
    for result in record.results:
        name = result.key.replace("/", ".").replace("[", "-").replace("]", "") + ".json"
        (checks / name).write_text(json.dumps(result.as_dict(), indent=2, default=str) + "\n")
    run = directory / "run.json"
    run.write_text(json.dumps(record.as_dict(), indent=2, default=str) + "\n")
    junit = write_junit(record, directory / "junit.xml")
    return [run, checks, junit]

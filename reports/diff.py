"""``gpuconf report diff BEFORE AFTER``: what an upgrade changed, from two recorded runs.

Either side may be a run folder, a ``run.json``, a ConformanceReport YAML (``v1alpha2`` lists
every check; ``v1alpha1`` only the failed, skipped and errored ones, so a check it does not list
counts as passed) or a submission bundle (its folder, or the folder it lies under), in any pair:
a challenger re-runs the suite and compares the re-run with a submitted bundle check by check.

Run the suite before the upgrade, upgrade, run it after, and compare: checks that **regressed**
(passed before, failed or errored after), **recovered** (the other way), were **newly skipped**,
appeared or disappeared; and figures (``reports.figures``: eviction time, boundary precision,
throughput per mode, density) that moved beyond a tolerance. A regression is a check that
regressed or a figure that got worse beyond the tolerance; ``exit_code`` is then 1.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Final

import yaml

from reports.figures import figures_of
from reports.model import (
    OUTCOMES,
    SCHEMA_V1ALPHA1,
    CheckResult,
    Outcome,
    RunRecord,
    load_run,
    record_from_dict,
)

TOLERANCE: Final = 0.2
"""A figure moved when it changed by more than this share of its earlier value."""
ABSOLUTE_FLOOR: Final = 1e-3
"""Changes smaller than this are noise whatever the share (a 0.001 s eviction against 0.002 s)."""
HIGHER_IS_BETTER: Final = ("throughput.", "density.", "overlap.sm-sharing")
"""Figure names (prefixes) that are better when larger; every other figure is better when smaller."""
BAD: Final = ("failed", "error")
LISTED: Final = "listedOutcomes"
"""``RunRecord.options`` key of a record read from a report that lists only some outcomes (v1alpha1)."""


@dataclass
class Moved:
    check: str
    figure: str
    before: float
    after: float
    worse: bool

    def line(self) -> str:
        change = (self.after - self.before) / abs(self.before) if self.before else float("inf")
        verdict = "worse" if self.worse else "better"
        return f"{self.check}: {self.figure} {self.before:g} -> {self.after:g} ({change:+.0%}, {verdict})"


@dataclass
class Diff:
    regressed: list[tuple[str, str, str]] = field(default_factory=list)
    recovered: list[tuple[str, str, str]] = field(default_factory=list)
    newly_skipped: list[tuple[str, str, str]] = field(default_factory=list)
    added: list[tuple[str, str]] = field(default_factory=list)
    removed: list[tuple[str, str]] = field(default_factory=list)
    moved: list[Moved] = field(default_factory=list)

    @property
    def worse(self) -> list[Moved]:
        return [m for m in self.moved if m.worse]

    def exit_code(self) -> int:
        return 1 if self.regressed or self.worse else 0

    def lines(self) -> list[str]:
        out = []
        for title, rows in (
            ("REGRESSED", self.regressed),
            ("RECOVERED", self.recovered),
            ("NEWLY SKIPPED", self.newly_skipped),
        ):
            out += [f"{title:<14} {key}: {a} -> {b}" for key, a, b in rows]
        out += [f"{'NEW':<14} {key}: {o}" for key, o in self.added]
        out += [f"{'GONE':<14} {key}: was {o}" for key, o in self.removed]
        out += [f"{'FIGURE':<14} {m.line()}" for m in self.moved]
        verdict = "REGRESSION" if self.exit_code() else "no regression"
        counts = (
            f"{len(self.regressed)} regressed, {len(self.recovered)} recovered, "
            f"{len(self.newly_skipped)} newly skipped, {len(self.worse)} figure(s) worse"
        )
        return [*out, f"{verdict}: {counts}"]


def _worse(name: str, before: float, after: float) -> bool:
    better_up = any(name.startswith(p) for p in HIGHER_IS_BETTER)
    return after < before if better_up else after > before


def _unlisted_as_passed(record: RunRecord, keys: set[str]) -> dict[str, CheckResult]:
    """The record's results by key, with the checks a partial listing left out counted as passed."""
    out = {r.key: r for r in record.results}
    if record.options.get(LISTED):
        for key in keys - set(out):
            profile, _, rest = key.partition("/")
            out[key] = CheckResult(key, rest.split("[")[0], profile, "", "", "", "", "passed")
    return out


def diff(before: RunRecord, after: RunRecord, tolerance: float = TOLERANCE) -> Diff:
    out = Diff()
    keys = {r.key for r in before.results} | {r.key for r in after.results}
    old = _unlisted_as_passed(before, keys)
    new = _unlisted_as_passed(after, keys)
    for key, b in new.items():
        a = old.get(key)
        if a is None:
            out.added.append((key, b.outcome))
            continue
        if a.outcome == "passed" and b.outcome in BAD:
            out.regressed.append((key, a.outcome, b.outcome))
        elif a.outcome in BAD and b.outcome == "passed":
            out.recovered.append((key, a.outcome, b.outcome))
        elif b.outcome == "skipped" and a.outcome != "skipped":
            out.newly_skipped.append((key, a.outcome, b.outcome))
        fa, fb = figures_of(before, a), figures_of(after, b)
        for name in sorted(set(fa) & set(fb)):
            x, y = fa[name], fb[name]
            if abs(y - x) <= ABSOLUTE_FLOOR or abs(y - x) <= tolerance * abs(x):
                continue
            out.moved.append(Moved(key, name, x, y, _worse(name, x, y)))
    out.removed = [(key, a.outcome) for key, a in old.items() if key not in new]
    return out


def load(path: Path) -> RunRecord:
    """A run to compare: a run folder, a ``run.json``, a ConformanceReport YAML, or a bundle."""
    if path.is_dir():
        if (path / "run.json").is_file():
            return load_run(path)
        if (path / "report.yaml").is_file():
            return load(path / "report.yaml")
        found = sorted(path.glob("*/*/*/run.json"))
        if len(found) == 1:
            return load_run(found[0])
        raise FileNotFoundError(
            f"{path}: not a run folder (no run.json), nor a submission bundle"
            + (f" ({len(found)} submissions below it: name one)" if found else "")
        )
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file or folder")
    text = path.read_text()
    try:
        data = json.loads(text)
    except ValueError:
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ValueError(f"{path}: neither JSON nor YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ValueError(f"{path}: not a gpuconf run or ConformanceReport (no object at the top)")
    if data.get("kind") == "ConformanceReport":
        return from_report(data, path.parent)
    if "results" not in data:
        raise ValueError(f"{path}: neither a run.json (ConformanceRun) nor a ConformanceReport")
    return record_from_dict(data, directory=path.parent)


def from_report(data: dict[str, Any], directory: Path | None = None) -> RunRecord:
    """A record with the checks a ConformanceReport lists (no evidence: figures are not compared)."""
    results = []
    partial = data.get("apiVersion") == SCHEMA_V1ALPHA1
    for profile in data.get("profiles") or []:
        name = str(profile.get("name") or "")

        def result(
            key: str, outcome: str, reason: str = "", level: str = "", check_id: str = ""
        ) -> CheckResult:
            check = check_id or key.split("/", 1)[-1].split("[")[0]
            kept: Outcome = outcome if outcome in OUTCOMES else "error"
            return CheckResult(key, check, name, "", level, "", "", kept, reason)  # noqa: B023

        if partial:
            results += [result(str(k), "failed") for k in profile.get("failedChecks") or []]
            results += [result(str(k), "error") for k in profile.get("erroredChecks") or []]
            results += [
                result(str(s.get("name")), "skipped", str(s.get("reason") or ""))
                for s in profile.get("skippedChecks") or []
            ]
        else:
            results += [
                result(
                    str(c["name"]),
                    str(c["outcome"]),
                    str(c.get("reason") or ""),
                    str(c.get("level") or ""),
                    str(c.get("id") or ""),
                )
                for c in profile.get("checks") or []
            ]
    started = datetime.fromisoformat(str(data.get("date") or "1970-01-01T00:00:00+00:00")).timestamp()
    return RunRecord(
        run_id=str(data.get("runId") or ""),
        started=started,
        finished=started + float(data.get("durationSeconds") or 0),
        target={},
        options={LISTED: ["failed", "skipped", "error"]} if partial else {},
        results=results,
        directory=directory,
    )

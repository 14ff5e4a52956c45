"""``gpuconf report diff BEFORE AFTER``: what an upgrade changed, from two recorded runs.

Run the suite before the upgrade, upgrade, run it after, and compare: checks that **regressed**
(passed before, failed or errored after), **recovered** (the other way), were **newly skipped**,
appeared or disappeared; and figures (``reports.figures``: eviction time, boundary precision,
throughput per mode, density) that moved beyond a tolerance. A regression is a check that
regressed or a figure that got worse beyond the tolerance; ``exit_code`` is then 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from reports.figures import figures_of
from reports.model import RunRecord, load_run

TOLERANCE: Final = 0.2
"""A figure moved when it changed by more than this share of its earlier value."""
ABSOLUTE_FLOOR: Final = 1e-3
"""Changes smaller than this are noise whatever the share (a 0.001 s eviction against 0.002 s)."""
HIGHER_IS_BETTER: Final = ("throughput.", "density.", "overlap.sm-sharing")
"""Figure names (prefixes) that are better when larger; every other figure is better when smaller."""
BAD: Final = ("failed", "error")


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


def diff(before: RunRecord, after: RunRecord, tolerance: float = TOLERANCE) -> Diff:
    out = Diff()
    old = {r.key: r for r in before.results}
    new = {r.key: r for r in after.results}
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
    """A run to compare: its directory or its ``run.json``."""
    if not (path / "run.json").is_file() and not path.is_file():
        raise FileNotFoundError(f"{path}: not a run directory (no run.json) nor a run.json")
    return load_run(path)

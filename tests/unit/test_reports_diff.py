"""``gpuconf report diff``: regressions, recoveries, new skips and moved figures between two runs."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from reports.diff import diff
from reports.model import RunRecord, load_run

RUNS = Path(__file__).resolve().parents[1] / "data" / "runs"


def load(name: str) -> RunRecord:
    return load_run(RUNS / name)


def test_passed_to_failed_is_a_regression() -> None:
    d = diff(load("reference-error-skips"), load("bad-scheduler-xdist"))
    regressed = {key for key, _a, _b in d.regressed}
    assert "scheduler/memory-fit" in regressed and "scheduler/mode-separation" in regressed
    assert d.exit_code() == 1 and d.lines()[-1].startswith("REGRESSION")


def test_failed_to_passed_is_a_recovery_not_a_regression() -> None:
    d = diff(load("bad-scheduler-xdist"), load("reference-error-skips"))
    assert {key for key, _a, _b in d.recovered} >= {"scheduler/memory-fit", "scheduler/mode-separation"}
    assert ("scheduler/multi-device", "passed", "skipped") in d.newly_skipped
    assert d.exit_code() == 0


def test_passed_to_error_is_a_regression_and_new_and_gone_checks_are_listed() -> None:
    before = load("reference-error-skips")
    after = copy.deepcopy(before)
    changed = next(r for r in after.results if r.id == "memory-fit")
    changed.outcome = "error"
    after.results = [r for r in after.results if r.id != "node-readiness"]
    extra = copy.deepcopy(changed)
    extra.key, extra.outcome = "scheduler/brand-new", "passed"
    after.results.append(extra)
    d = diff(before, after)
    assert d.regressed == [("scheduler/memory-fit", "passed", "error")]
    assert d.added == [("scheduler/brand-new", "passed")]
    assert d.removed == [("scheduler/node-readiness", "passed")]


def _with(record: RunRecord, key: str, **figures: float) -> RunRecord:
    out = copy.deepcopy(record)
    next(r for r in out.results if r.key == key).figures.update(figures)
    return out


@pytest.mark.parametrize(
    ("key", "figure", "before", "after", "worse"),
    [
        ("node/pressure-eviction", "evictionSeconds", 0.42, 1.5, True),  # slower eviction
        ("node/pressure-eviction", "evictionSeconds", 0.42, 0.2, False),  # faster
        ("node/agent-restart", "agentRestartSeconds", 2.1, 9.0, True),
    ],
)
def test_a_figure_beyond_the_tolerance(
    key: str, figure: str, before: float, after: float, worse: bool
) -> None:
    base = load("node-stack-handmade")
    d = diff(_with(base, key, **{figure: before}), _with(base, key, **{figure: after}))
    (moved,) = [m for m in d.moved if m.figure == figure]
    assert (moved.check, moved.before, moved.after, moved.worse) == (key, before, after, worse)
    assert d.exit_code() == (1 if worse else 0)


def test_derived_figures_throughput_and_density_compare_higher_is_better() -> None:
    base = load("node-stack-handmade")
    after = copy.deepcopy(base)
    modes = next(r for r in after.results if r.key == "node/compute-modes")
    for result in modes.evidence["workloads"].values():
        result["steps"][0]["work_per_s"] /= 2  # half the throughput in both modes
    ramp = next(r for r in after.results if r.key == "stack/density-ramp")
    ramp.evidence["facts"]["densityRamp"] = ramp.evidence["facts"]["densityRamp"][:3]  # 4 Pods, not 16
    d = diff(base, after)
    worse = {(m.check, m.figure) for m in d.worse}
    assert {
        ("node/compute-modes", "throughput.time-slicing"),
        ("node/compute-modes", "throughput.sm-sharing"),
        ("stack/density-ramp", "density.maxPods"),
        ("stack/density-ramp", "density.throughput"),
    } <= worse
    assert d.exit_code() == 1


def test_small_moves_are_within_the_tolerance() -> None:
    base = load("node-stack-handmade")
    key = "node/hard-limit"
    assert diff(_with(base, key, boundaryErrorMiB=32), _with(base, key, boundaryErrorMiB=36)).moved == []
    assert diff(_with(base, key, boundaryErrorMiB=32), _with(base, key, boundaryErrorMiB=36), 0.05).moved
    assert diff(base, base).lines() == [
        "no regression: 0 regressed, 0 recovered, 0 newly skipped, 0 figure(s) worse"
    ]

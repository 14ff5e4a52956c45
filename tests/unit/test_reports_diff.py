"""``gpuconf report diff``: regressions, recoveries, new skips and moved figures between two runs."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from reports.diff import diff
from reports.diff import load as read
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


# ----------------------------------------------------------------------------- any pair of inputs


def _yaml(tmp_path: Path, name: str, version: str = "gpuconf.io/v1alpha2") -> Path:
    import yaml

    from reports import conformance

    data = conformance.report(load_run(RUNS / name))
    data["apiVersion"] = version
    path = tmp_path / f"{name}-{version.rsplit('/', 1)[-1]}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_report_yaml_is_compared_like_its_run(tmp_path: Path) -> None:
    as_run = diff(read(RUNS / "bad-scheduler-xdist"), read(RUNS / "reference-error-skips"))
    as_yaml = diff(
        read(_yaml(tmp_path, "bad-scheduler-xdist")), read(_yaml(tmp_path, "reference-error-skips"))
    )
    assert as_yaml.regressed == as_run.regressed and as_yaml.recovered == as_run.recovered
    assert as_yaml.newly_skipped == as_run.newly_skipped


def test_a_v1alpha1_yaml_counts_unlisted_checks_as_passed(tmp_path: Path) -> None:
    old = read(_yaml(tmp_path, "bad-scheduler-xdist", "gpuconf.io/v1alpha1"))
    assert {r.outcome for r in old.results} <= {"failed", "skipped", "error"}
    d = diff(old, read(RUNS / "bad-scheduler-xdist"))
    assert d.regressed == [] and d.recovered == [] and d.added == [] and d.removed == []


def test_diff_reads_a_bundle_and_says_what_it_cannot_read(tmp_path: Path) -> None:
    import shutil

    from reports.cli import EXIT_INPUT

    bundle = tmp_path / "out" / "0.1" / "org-project" / "scheduler-v1"
    shutil.copytree(RUNS / "bad-scheduler-xdist", bundle)
    assert read(tmp_path / "out").run_id == load_run(RUNS / "bad-scheduler-xdist").run_id
    (tmp_path / "junk.yaml").write_text("- a list\n")
    with pytest.raises(ValueError, match="not a gpuconf run"):
        read(tmp_path / "junk.yaml")
    from conformance.cli import main

    assert (
        main(["report", "diff", str(tmp_path / "junk.yaml"), str(RUNS / "bad-scheduler-xdist")]) == EXIT_INPUT
    )

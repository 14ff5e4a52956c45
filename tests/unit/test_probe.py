"""``gpuconf probe`` on simulated GPUs: every check passes against the reference agent, and each
check FAILS against the agent broken in the way that check exists to catch (a seeded fault). Its
checks are catalog checks (profile ``probe``) and its result is the suite's result model."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from conformance import probe
from conformance.probe import CHECK_IDS, ProbeOptions, SetupError, render_table, run_probe
from fixtures.suite.checks import REGISTRY
from reports.model import load_run

# check -> the seeded agent fault it must catch
CAUGHT_BY = {
    "hard-limit-oom": "no-hard-limit",
    "burst-borrowing": "limit-from-request",
    "soft-limit-eviction": "no-eviction",
    "mode-guard": "no-mode-guard",
    "smi-visibility": "whole-gpu-visibility",
    "release-on-exit": "leak-on-exit",
    "fail-closed": "fail-open",
}
ALSO_CAUGHT = (
    ("mode-guard", "mode-guard-one-way"),
    ("smi-visibility", "full-visibility"),
    ("fail-closed", "blank-mode-default"),
    # Held for the suite's hold window (reaction periods), judged by the suite's eviction effect.
    ("burst-borrowing", "evict-without-pressure"),
)
"""More (check, fault) pairs the probe must catch: faults that break only part of a check's rule."""


def cli(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    probe.register(parser.add_subparsers())
    args = parser.parse_args(["probe", *argv])
    return int(args.func(args))


def test_every_check_has_a_fault_that_it_catches() -> None:
    assert set(CAUGHT_BY) == set(CHECK_IDS)


def test_every_probe_check_is_a_catalog_check_in_the_probe_profile() -> None:
    for check in probe.CHECKS:
        declared = check.declared
        assert declared is REGISTRY[check.id] and "probe" in declared.profiles
        assert check.statement == declared.statement


def test_all_checks_pass_on_the_simulated_device_and_results_are_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "probe.json"
    assert cli("--backend", "sim", "--output", str(out), "--report-dir", str(tmp_path / "run")) == 0
    table = capsys.readouterr().out
    assert "7 of 7 checks passed" in table
    for check in CHECK_IDS:
        assert f"{check} " in table
    data = json.loads(out.read_text())
    assert data["kind"] == "ConformanceRun" and data["source"] == "probe" and data["exitCode"] == 0
    assert data["environment"]["simulated"] and data["environment"]["agent_backend"] == "sim"
    assert [r["key"] for r in data["results"]] == [f"probe/{c}" for c in CHECK_IDS]
    assert all(r["outcome"] == "passed" and r["evidence"]["facts"] for r in data["results"])
    pressure = next(r for r in data["results"] if r["id"] == "soft-limit-eviction")
    assert pressure["statement"] == REGISTRY["soft-limit-eviction"].statement
    assert pressure["evidence"]["facts"]["evicted_pods"] == ["borrower"]
    assert pressure["evidence"]["facts"]["reaction_s"] <= 1.0
    record = load_run(tmp_path / "run")  # written as gpuconf run writes a run
    assert record.source == "probe" and record.mode == "probe" and record.exit_code() == 0
    assert {r.profile for r in record.results} == {"probe"}


@pytest.mark.parametrize(("check", "fault"), sorted(CAUGHT_BY.items()) + list(ALSO_CAUGHT))
def test_each_check_fails_against_its_seeded_fault(check: str, fault: str) -> None:
    report = run_probe(ProbeOptions(backend="sim", checks=(check,), faults=frozenset({fault})))
    (result,) = report.results
    assert result.status == "FAIL", f"{check} did not catch {fault}: {result.summary}"
    assert not report.passed
    assert "SEEDED FAULTS" in render_table(report)


def test_an_earlier_fault_name_is_its_new_one() -> None:
    report = run_probe(
        ProbeOptions(backend="sim", checks=("burst-borrowing",), faults=frozenset({"no-borrowing"}))
    )
    assert report.faults == ["limit-from-request"]
    assert [r.status for r in report.results] == ["FAIL"]


def test_the_evictor_choosing_the_guaranteed_pod_fails_soft_limit_eviction() -> None:
    report = run_probe(
        ProbeOptions(backend="sim", checks=("soft-limit-eviction",), faults=frozenset({"evict-guaranteed"}))
    )
    (result,) = report.results
    assert result.status == "FAIL" and "within its guarantee" in result.summary


def test_a_failed_check_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli("--backend", "sim", "--check", "fail-closed", "--fault", "fail-open") == 1
    assert "FAIL" in capsys.readouterr().out


def test_the_probes_older_check_names_still_select_their_checks() -> None:
    report = run_probe(ProbeOptions(backend="sim", checks=("hard-limit", "release")))
    assert [r.id for r in report.results] == ["hard-limit-oom", "release-on-exit"]
    assert report.to_record().results[0].key == "probe/hard-limit-oom"


def test_setup_errors_exit_2_with_a_reason(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli("--backend", "sim", "--sim-gpus", "lots") == 2
    assert "GPU spec 'lots'" in capsys.readouterr().err
    with pytest.raises(SetupError, match="unknown check"):
        run_probe(ProbeOptions(checks=("nope",)))
    with pytest.raises(SetupError, match="unknown fault"):
        run_probe(ProbeOptions(faults=frozenset({"nope"})))


def test_mps_without_a_gpu_is_a_setup_error_said_plainly(capsys: pytest.CaptureFixture[str]) -> None:
    try:
        import pynvml  # noqa: F401
    except ImportError:
        assert cli("--backend", "mps") == 2
        assert "mps backend cannot run here" in capsys.readouterr().err
    else:  # pragma: no cover - a GPU machine runs the real thing instead
        pytest.skip("pynvml is installed: this machine may have a GPU")


@pytest.mark.parametrize(
    ("check", "fault", "said"),
    [
        # The neighbour's usage count is unchanged; only reading back what it wrote shows the loss.
        ("hard-limit-oom", "clobber-neighbour", "differently from what it wrote"),
        ("fail-closed", "accept-bare-number", "bare-number"),
        ("fail-closed", "vague-refusal", "names the key"),
        # The suite's judgement of used memory: the neighbour's memory counted as the container's.
        ("smi-visibility", "smi-device-used", "its memory is counted as the container's"),
        ("fail-closed", "blank-mode-default", "blank-mode"),
        ("burst-borrowing", "evict-without-pressure", "evicted on an idle GPU (Eviction API"),
    ],
)
def test_the_probe_judges_as_the_suites_check_does(check: str, fault: str, said: str) -> None:
    report = run_probe(ProbeOptions(backend="sim", checks=(check,), faults=frozenset({fault})))
    (result,) = report.results
    assert result.status == "FAIL" and said in result.summary, result.summary

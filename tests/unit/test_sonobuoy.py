"""The Sonobuoy done-file protocol: results first, then ``done`` naming the results file."""

from __future__ import annotations

import os
import tarfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conformance import sonobuoy
from conformance.cli import main

JUNIT = (
    '<?xml version="1.0"?>\n'
    '<testsuites><testsuite name="gpuconf" tests="1"><testcase name="x"/></testsuite></testsuites>\n'
)


def a_run(report: Path) -> Path:
    report.mkdir(parents=True)
    (report / "junit.xml").write_text(JUNIT)
    (report / "report.yaml").write_text("kind: ConformanceReport\n")
    (report / "evidence").mkdir()
    (report / "evidence" / "a.json").write_text("{}")
    return report


def members(tarball: Path) -> set[str]:
    with tarfile.open(tarball) as tar:
        return set(tar.getnames())


def test_results_dir_comes_from_the_environment() -> None:
    assert sonobuoy.results_dir({}) is None
    assert sonobuoy.results_dir({"SONOBUOY_RESULTS_DIR": " "}) is None
    assert sonobuoy.results_dir({"SONOBUOY_RESULTS_DIR": "/tmp/sonobuoy/results"}) == Path(
        "/tmp/sonobuoy/results"
    )


def test_finish_packs_the_report_then_names_it_in_done(tmp_path: Path) -> None:
    report, results = a_run(tmp_path / "gpuconf-results"), tmp_path / "results"
    tarball = sonobuoy.finish(report, results, 0)
    assert tarball == results.resolve() / "gpuconf-results.tar.gz"
    assert (results / "done").read_text() == str(tarball)
    assert {
        "gpuconf-results/junit.xml",
        "gpuconf-results/report.yaml",
        "gpuconf-results/evidence/a.json",
    } <= members(tarball)
    assert sorted(p.name for p in results.iterdir()) == ["done", "gpuconf-results.tar.gz"], "no partial files"
    # done is written last: it is never older than the file it names.
    assert os.stat(results / "done").st_mtime_ns >= os.stat(tarball).st_mtime_ns


def test_a_run_that_judged_nothing_reports_one_errored_case(tmp_path: Path) -> None:
    report, results = tmp_path / "gpuconf-results", tmp_path / "results"
    report.mkdir()
    (report / "preflight.json").write_text('{"failed": "no GPU node: no node carries the labels"}')
    tarball = sonobuoy.finish(report, results, 2)
    with tarfile.open(tarball) as tar:
        extracted = tar.extractfile("gpuconf-results/junit.xml")
        assert extracted is not None
        root = ET.fromstring(extracted.read())
    (error,) = root.iter("error")
    assert "preflight failed: no GPU node" in error.attrib["message"]
    assert root.attrib["errors"] == "1"


def test_without_preflight_the_error_names_the_exit_code(tmp_path: Path) -> None:
    tarball = sonobuoy.finish(tmp_path / "r", tmp_path / "results", 2)
    with tarfile.open(tarball) as tar:
        data = tar.extractfile("gpuconf-results/junit.xml")
        assert data is not None and b"exit code 2" in data.read()


def test_the_report_dir_may_be_the_results_dir(tmp_path: Path) -> None:
    both = a_run(tmp_path / "results")
    tarball = sonobuoy.finish(both, both, 0)
    names = members(tarball)
    assert "gpuconf-results/junit.xml" in names
    assert not any(n.endswith((".tar.gz", "/done", ".partial")) for n in names), names


def test_gpuconf_run_writes_done_even_on_a_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    results = tmp_path / "results"
    monkeypatch.setenv("SONOBUOY_RESULTS_DIR", str(results))
    rc = main(["run", "--kubeconfig", str(tmp_path / "missing"), "--report-dir", str(tmp_path / "report")])
    assert rc == 2
    assert (results / "done").read_text() == str(results.resolve() / "gpuconf-results.tar.gz")
    assert "gpuconf-results/junit.xml" in members(results / "gpuconf-results.tar.gz")

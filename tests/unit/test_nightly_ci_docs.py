"""docs/nightly-ci.md: its example pipelines parse, and each runs the suite, publishes the reports and
fails on a regression against last night's run."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from conformance.cli import build_parser

DOC = Path(__file__).resolve().parents[2] / "docs" / "nightly-ci.md"


def blocks() -> list[dict[str, Any]]:
    return [yaml.safe_load(b) for b in re.findall(r"```yaml\n(.*?)```", DOC.read_text(), re.S)]


def test_the_github_workflow() -> None:
    github = blocks()[0]
    assert github[True]["schedule"][0]["cron"]  # YAML reads the key `on` as True
    (job,) = github["jobs"].values()
    assert "self-hosted" in job["runs-on"] and "gpu" in job["runs-on"]
    runs = "\n".join(step.get("run", "") for step in job["steps"])
    assert "gpuconf run --kubeconfig" in runs and "gpuconf report allure results" in runs
    assert "gpuconf report diff baseline results" in runs
    uploaded = [
        s["with"]["path"]
        for s in job["steps"]
        if str(s.get("uses", "")).startswith("actions/upload-artifact")
    ]
    assert any("report.html" in p for p in uploaded) and "results/allure-report" in uploaded
    verdict = job["steps"][-1]
    assert verdict["if"] == "always()" and "steps.diff.outcome" in verdict["run"]


def test_the_gitlab_job() -> None:
    (job,) = blocks()[1].values()
    script = "\n".join(job["script"])
    assert "gpuconf run --kubeconfig" in script and "gpuconf report diff baseline results" in script
    assert job["artifacts"]["when"] == "always"
    assert "results/report.html" in job["artifacts"]["paths"]
    assert "results/allure-report/" in job["artifacts"]["paths"]
    assert job["artifacts"]["reports"]["junit"] == "results/junit.xml"
    assert any(r["if"] == '$CI_PIPELINE_SOURCE == "schedule"' for r in job["rules"])


def test_every_gpuconf_command_line_in_the_pipelines_parses() -> None:
    parser = build_parser()
    text = DOC.read_text().replace("\\\n", " ")
    lines = re.findall(r"\.venv/bin/gpuconf ([^\n]+)", text)
    assert len(lines) >= 6, lines
    for line in lines:
        argv = [w.strip('"') for w in line.split()]
        parser.parse_args(argv)  # SystemExit (a test error) on an unknown option

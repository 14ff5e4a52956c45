"""The mutation run: the whole suite passes the reference stack and catches every seeded fault.

``gpuconf mutate`` runs once for the module: the control (every profile against the unbroken
reference scheduler and agent, on two xdist workers: the reference stack must pass in parallel too,
and it halves the control's time), then each seeded scheduler fault on the scheduler profile and
each seeded agent fault on the node profile. Every fault must be caught, and by the check a person
would expect (``EXPECTED_SCHEDULER`` / ``EXPECTED_AGENT`` in ``conformance/mutate.py``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conformance.mutate import EXPECTED_AGENT, EXPECTED_SCHEDULER
from enforcement.agent.options import FAULTS as AGENT_FAULTS
from fixtures.sandbox.scheduler.faults import FAULTS as SCHEDULER_FAULTS

pytestmark = pytest.mark.sandbox


def test_every_seeded_fault_has_an_expected_check() -> None:
    assert set(EXPECTED_SCHEDULER) == set(SCHEDULER_FAULTS), "a scheduler fault without an expected check"
    assert set(EXPECTED_AGENT) == set(AGENT_FAULTS), "an agent fault without an expected check"


@pytest.fixture(scope="module")
def mutation(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict[str, Any], str, Path]:
    out = tmp_path_factory.mktemp("mutation")
    argv = [
        sys.executable,
        "-m",
        "conformance.cli",
        "mutate",
        "--quick",
        "--control-workers=2",
        f"--report-dir={out}",
    ]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    # Every seeded fault (49 runs) on 2 busy cores: about 20-25 minutes; the limit leaves room.
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=3000, env=env)
    report = out / "mutation.json"
    data = json.loads(report.read_text()) if report.exists() else {}
    return proc.returncode, data, proc.stdout + proc.stderr, out


def test_the_control_passes_every_profile(mutation: tuple[int, dict[str, Any], str, Path]) -> None:
    _rc, data, output, out = mutation
    assert data.get("control", {}).get("exitCode") == 0, output
    record = json.loads((out / "control" / "run.json").read_text())
    outcomes = {r["key"]: r["outcome"] for r in record["results"]}
    assert {r["profile"] for r in record["results"]} == {"scheduler", "node", "stack"}
    assert set(outcomes.values()) == {"passed"}, {k: v for k, v in outcomes.items() if v != "passed"}
    assert len(outcomes) >= 40, "the whole suite: every check in every profile"
    control = out / "control"
    assert (control / "junit.xml").exists() and len(list((control / "checks").glob("*.json"))) == len(
        outcomes
    )


@pytest.mark.parametrize(
    "fault", [f"scheduler:{f}" for f in EXPECTED_SCHEDULER] + [f"agent:{f}" for f in EXPECTED_AGENT]
)
def test_each_seeded_fault_is_caught_by_its_expected_check(
    mutation: tuple[int, dict[str, Any], str, Path], fault: str
) -> None:
    _rc, data, output, _out = mutation
    kind, name = fault.split(":", 1)
    found = {(f["kind"], f["fault"]): f for f in data.get("faults", [])}
    assert (kind, name) in found, f"{fault} was not judged\n{output[-4000:]}"
    result = found[(kind, name)]
    assert not result["errors"], f"{fault}: the suite could not judge: {result['errors']}"
    assert result["verdict"] == "caught", (
        f"{fault}: {result['verdict']}; failed: {result['caught_by']}, expected {result['expected']}"
    )


def test_the_score_is_every_fault(mutation: tuple[int, dict[str, Any], str, Path]) -> None:
    rc, data, output, _out = mutation
    seeded = len(EXPECTED_SCHEDULER) + len(EXPECTED_AGENT)
    assert data["score"] == {"caught": seeded, "seeded": seeded}, output[-4000:]
    assert rc == 0, output[-4000:]

"""``make test``'s runner (tests/runner.py): both halves run, the verdict is theirs, no tests is a failure."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def half(folder: Path, body: str | None) -> Path:
    folder.mkdir()
    if body is not None:
        (folder / f"test_{folder.name}.py").write_text(body)
    return folder


PASS = "def test_passes():\n    print('ran', flush=True)\n"
FAIL = "def test_fails():\n    assert 1 == 2\n"


def runner(unit: Path, integration: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, str(ROOT / "tests" / "runner.py"), f"--unit={unit}"]
    argv += [f"--integration={integration}"]
    argv += ["--unit-workers=0", "--integration-workers=0", *extra, "--", "-p", "no:cacheprovider", "-q"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=ROOT)


@pytest.mark.parametrize("mode", ["one-after-the-other", "beside", "serial"])
def test_both_halves_pass_and_beside_the_unit_half_is_printed_after_the_integration_half(
    tmp_path: Path, mode: str
) -> None:
    unit = half(tmp_path / "unit", "def test_unit_half():\n    pass\n")
    integration = half(tmp_path / "integration", PASS)
    done = runner(unit, integration, *({"beside": ["--beside"], "serial": ["--serial"]}.get(mode, [])))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("1 passed") == 2  # each half ran its one test
    if mode == "beside":
        assert done.stdout.index("== the unit tests (exit 0)") > done.stdout.index("1 passed")


@pytest.mark.parametrize("beside", [False, True], ids=["one-after-the-other", "beside"])
def test_a_failing_unit_half_fails_the_run_even_when_the_integration_half_passes(
    tmp_path: Path, beside: bool
) -> None:
    done = runner(
        half(tmp_path / "unit", FAIL), half(tmp_path / "integration", PASS), *(["--beside"] * beside)
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "assert 1 == 2" in done.stdout and done.stdout.count("1 passed") == 1
    assert ("== the unit tests (exit 1)" in done.stdout) == beside


def test_a_failing_integration_half_fails_the_run(tmp_path: Path) -> None:
    done = runner(half(tmp_path / "unit", PASS), half(tmp_path / "integration", FAIL))
    assert done.returncode == 1, done.stdout + done.stderr


@pytest.mark.parametrize("empty", ["unit", "integration"])
def test_a_half_without_tests_is_a_failure_never_a_pass(tmp_path: Path, empty: str) -> None:
    unit = half(tmp_path / "unit", None if empty == "unit" else PASS)
    integration = half(tmp_path / "integration", None if empty == "integration" else PASS)
    for mode in ([], ["--beside"]):
        done = runner(unit, integration, *mode)
        assert done.returncode == 1, done.stdout + done.stderr
        assert "pytest collected no tests: failing" in done.stderr


def test_integration_arguments_reach_only_the_integration_half(tmp_path: Path) -> None:
    done = runner(
        half(tmp_path / "unit", PASS),
        half(tmp_path / "integration", PASS),
        "--beside",
        "--integration-arg=--durations=1",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    before, _, after = done.stdout.partition("== the unit tests")
    assert "slowest 1 durations" in before and "slowest" not in after

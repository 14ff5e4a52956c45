"""The checked-in catalog is the declared checks, and gpuconf's own test run never collects them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from conformance import catalog
from fixtures.suite.checks import FEATURES, LEVELS, Check

REPO = Path(__file__).resolve().parents[2]


def test_the_checked_in_catalog_is_in_step_with_the_declared_checks() -> None:
    assert catalog.drift() == [], "run `gpuconf catalog --write` and commit conformance/catalog.yaml"


def test_a_changed_statement_is_a_drift(tmp_path: Path) -> None:
    copy = tmp_path / "catalog.yaml"
    text = catalog.CATALOG_PATH.read_text()
    copy.write_text(text.replace("MUST", "SHOULD", 1))
    lines = catalog.drift(copy)
    assert any(line.startswith("-") and "SHOULD" in line for line in lines)
    assert any(line.startswith("+") and "MUST" in line for line in lines)


def test_every_check_states_its_rule_with_its_level_and_names_known_features() -> None:
    entries = yaml.safe_load(catalog.render())["checks"]
    assert len({e["id"] for e in entries}) == len(entries)
    for entry in entries:
        assert entry["level"] in LEVELS and entry["level"] in entry["statement"].split(), entry["id"]
        assert set(entry["features"]) <= set(FEATURES), entry["id"]
        assert (REPO / entry["file"]).is_file(), entry["id"]


def test_a_declaration_without_its_level_word_is_refused() -> None:
    try:
        Check(id="x-y", level="MUST", statement="It should hold.", profiles=("scheduler",), capability="x")
    except ValueError as exc:
        assert "must say MUST" in str(exc)
    else:
        raise AssertionError("a statement without MUST was accepted for a MUST check")


def test_gpuconfs_own_test_run_does_not_collect_the_checks() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "--co", "-q", "-p", "no:cacheprovider"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    collected = [line for line in proc.stdout.splitlines() if "::" in line]
    assert collected, "the test run collected nothing"
    assert not [line for line in collected if line.startswith("conformance/")]

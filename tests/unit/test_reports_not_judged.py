"""What a check did not judge for the implementation is named in every report, and never turns a
pass into anything else (docs/contract.md §9: a verdict never overstates)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from reports import allure, conformance, html, junit, terminal
from reports.model import NOT_JUDGED, Implementation, RunRecord, load_run, not_judged_parts

RUNS = Path(__file__).resolve().parents[1] / "data" / "runs"
KEY = "node/hard-limit"
PART = "pinned-mps-limits: operator-gen2 does not claim it (the limit per ordinal)"
SUBMITTER = Implementation(
    organization="Example GPU Co", project="p", url="https://example.com", version="1", contact=["@a"]
)
NOT_CLAIMED = {"nvml-memory-view": "nvidia-smi reports the limit as memory.total: in no release"}


@pytest.fixture
def record() -> RunRecord:
    """A recorded run whose passed hard-limit check names a part it did not judge."""
    rec = load_run(RUNS / "node-stack-handmade")
    checked = next(r for r in rec.results if r.key == KEY)
    assert checked.outcome == "passed"
    checked.notes.append(NOT_JUDGED + PART)
    checked.notes.append("an ordinary note")
    rec.under_test = {"mechanismsNotClaimed": dict(NOT_CLAIMED)}
    return rec


def test_the_model_gives_the_parts_without_the_prefix(record: RunRecord) -> None:
    checked = next(r for r in record.results if r.key == KEY)
    assert checked.not_judged() == [PART]
    assert [(r.key, part) for r, part in not_judged_parts(record.results)] == [(KEY, PART)]


def test_terminal_names_the_part(record: RunRecord) -> None:
    text = terminal.summary(record)
    assert f"  {KEY}: {PART}" in text
    row = next(line for line in text.splitlines() if line.startswith(KEY + " "))
    assert "PASSED" in row.split()


def test_yaml_names_the_part_and_stays_valid(record: RunRecord) -> None:
    data = yaml.safe_load(conformance.render_yaml(record, SUBMITTER))
    assert conformance.validate(data) == []
    (check,) = [c for p in data["profiles"] for c in p["checks"] if c["name"] == KEY]
    assert check["outcome"] == "passed" and check["notJudged"] == [PART]
    others = [c for p in data["profiles"] for c in p["checks"] if c["name"] != KEY]
    assert all("notJudged" not in c for c in others)


def test_html_names_the_part_in_the_row_the_evidence_and_the_summary(record: RunRecord) -> None:
    page = html.render_html(record)
    summary = page[page.index('id="not-judged"') : page.index('id="suite-validation"')]
    assert f"{KEY}</a> (passed): {PART}" in summary
    assert "nvml-memory-view" in summary and "in no release" in summary
    # the row in the table of every check: still a pass, the part beside it styled as not judged
    rows = re.findall(r'<tr class="row-(\w+)">\s*<td><a href="#check-node-hard-limit">', page)
    assert rows and set(rows) == {"passed"}
    checks = page[page.index('id="checks"') :]
    row = checks[checks.index('<a href="#check-node-hard-limit">node/hard-limit</a>') :]
    row = row[: row.index("</tr>")]
    assert 'o-passed">passed' in row and f'<span class="pill s-not-judged">not judged</span> {PART}' in row
    assert "o-failed" not in row
    evidence = page[page.index('id="check-node-hard-limit"') :]
    evidence = evidence[: evidence.index("</details>")]
    assert f'<p class="not-judged"><span class="pill s-not-judged">not judged</span> {PART}</p>' in evidence
    assert '<p class="note">an ordinary note</p>' in evidence and f'class="note">{NOT_JUDGED}' not in evidence


def test_html_without_anything_unjudged_has_no_summary_block() -> None:
    page = html.render_html(load_run(RUNS / "bad-scheduler-xdist"))
    assert 'id="not-judged"' not in page


def test_junit_names_the_part_and_the_testcase_stays_passed(record: RunRecord) -> None:
    root = junit.junit_tree(record).getroot()
    (case,) = [c for c in root.iter("testcase") if c.get("name") == KEY]
    props = {p.get("name"): p.get("value") for p in case.iter("property")}
    assert props["not-judged"] == PART
    assert NOT_JUDGED + PART in (case.findtext("system-out") or "")
    assert {c.tag for c in case} == {"properties", "system-out"}  # no failure, error or skipped
    counts = record.counts()
    assert (root.get("failures"), root.get("skipped")) == (str(counts["failed"]), str(counts["skipped"]))
    others = [c for c in root.iter("testcase") if c.get("name") != KEY]
    assert all("not-judged" not in {p.get("name") for p in c.iter("property")} for c in others)


def test_allure_names_the_part_and_the_result_stays_passed(tmp_path: Path, record: RunRecord) -> None:
    out = allure.write_results(record, tmp_path / "allure-results")
    results = {r["name"]: r for r in (json.loads(p.read_text()) for p in out.glob("*-result.json"))}
    result = results[KEY]
    assert result["status"] == "passed" and "statusDetails" not in result
    assert [(s["name"], s["status"]) for s in result["steps"]] == [(NOT_JUDGED + PART, "skipped")]
    assert ("tag", allure.NOT_JUDGED_TAG) in {(x["name"], x["value"]) for x in result["labels"]}
    assert result["description"].startswith(next(r.statement for r in record.results if r.key == KEY))
    assert f"- {PART}" in result["description"]
    assert all(not r.get("steps") for name, r in results.items() if name != KEY)
    props = (out / "environment.properties").read_text()
    assert "Not.judged.mechanisms=nvml-memory-view" in props and "Level=LEVEL: " in props

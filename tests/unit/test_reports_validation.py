"""How good is the suite: the mutation score a run carries, in run.json, the ConformanceReport, the HTML."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from reports import conformance, html, validation
from reports.model import Implementation, RunRecord, load_run, record_from_dict
from reports.records import write_run
from reports.render import render_all

RUNS = Path(__file__).resolve().parents[1] / "data" / "runs"
SUBMITTER = Implementation(
    organization="Example GPU Co",
    project="fraction-scheduler",
    url="https://example.com/fraction-scheduler",
    version="v1.2.3",
    contact=["@example/gpu-team"],
)
# The shape `gpuconf mutate --write-score` writes to conformance/mutation-score.json.
SCORE: dict[str, Any] = {
    "date": "2026-03-02T04:05:06+00:00",
    "seconds": 1234.5,
    "score": {"caught": 3, "seeded": 5},
    "faults": {
        "overcommit": {"kind": "scheduler", "verdict": "caught", "caughtBy": ["scheduler/memory-fit"]},
        "omit-limit": {
            "kind": "scheduler",
            "verdict": "caught",
            "caughtBy": ["scheduler/annotations-at-bind", "scheduler/limit-and-mode-at-bind"],
        },
        "no-eviction": {"kind": "agent", "verdict": "caught", "caughtBy": ["node/pressure-eviction"]},
        "late-annotations": {"kind": "scheduler", "verdict": "ESCAPED", "caughtBy": []},
        "ignore-limit": {"kind": "agent", "verdict": "not judged", "caughtBy": []},
    },
}


def scored(name: str = "bad-scheduler-xdist", score: dict[str, Any] | None = None) -> RunRecord:
    return replace(load_run(RUNS / name), suite_validation=SCORE if score is None else score)


def submitted(record: RunRecord) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(conformance.render_yaml(record, SUBMITTER))
    return data


# ----------------------------------------------------------------------------- the model


def test_the_score_goes_into_run_json_as_it_is_and_comes_back(tmp_path: Path) -> None:
    write_run(scored(), tmp_path)
    assert json.loads((tmp_path / "run.json").read_text())["suiteValidation"] == SCORE
    again = load_run(tmp_path)
    assert again.suite_validation == SCORE
    assert validation.validation(again) == validation.validation(scored())


def test_a_run_json_without_a_score_still_loads_and_has_none() -> None:
    data = json.loads((RUNS / "reference-error-skips" / "run.json").read_text())
    assert "suiteValidation" not in data  # recorded before the field existed
    record = record_from_dict(data)
    assert record.suite_validation == {} and validation.validation(record) is None
    data["suiteValidation"] = ["not", "an", "object"]
    assert record_from_dict(data).suite_validation == {}


def test_read_score_takes_the_file_as_it_is_and_never_fails(tmp_path: Path) -> None:
    path = tmp_path / "mutation-score.json"
    assert validation.read_score(path) == {}  # no file: no score
    path.write_text("{ half")
    assert validation.read_score(path) == {}
    path.write_text("[1, 2]")
    assert validation.read_score(path) == {}
    path.write_text(json.dumps(SCORE))
    assert validation.read_score(path) == SCORE


def test_the_view_counts_from_the_verdicts_when_the_file_gives_no_score() -> None:
    view = validation.validation(scored(score={"faults": SCORE["faults"]}))
    assert view is not None
    assert (view.caught, view.seeded, view.date) == (3, 5, "")
    assert view.escaped == ["late-annotations", "ignore-limit"]
    assert view.line() == "3 of 5 seeded faults caught"
    assert validation.validation(scored(score={"date": "2026-01-01T00:00:00+00:00"})) is None


def test_the_view_reads_the_fault_list_of_mutate_s_own_mutation_json() -> None:
    listed = [
        {"fault": n, **{"caught_by" if k == "caughtBy" else k: v for k, v in f.items()}}
        for n, f in SCORE["faults"].items()
    ]
    view = validation.validation(scored(score={**SCORE, "faults": listed}))
    assert view == validation.validation(scored())


# ----------------------------------------------------------------------------- ConformanceReport


def test_the_conformance_report_has_the_score_and_the_escaped_faults() -> None:
    data = submitted(scored())
    assert data["suiteValidation"] == {
        "caught": 3,
        "seeded": 5,
        "date": "2026-03-02T04:05:06+00:00",
        "escaped": ["late-annotations", "ignore-limit"],
    }
    assert conformance.validate(data) == []
    assert list(data)[-1] == "suiteValidation"


def test_the_conformance_report_has_no_block_without_a_score() -> None:
    data = submitted(load_run(RUNS / "bad-scheduler-xdist"))
    assert "suiteValidation" not in data and conformance.validate(data) == []


def test_a_score_with_nothing_escaped_is_valid() -> None:
    faults = {n: f for n, f in SCORE["faults"].items() if f["verdict"] == "caught"}
    data = submitted(scored(score={**SCORE, "score": {"caught": 3, "seeded": 3}, "faults": faults}))
    assert data["suiteValidation"]["escaped"] == [] and conformance.validate(data) == []


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("caught", -1),
        ("seeded", "5"),
        ("date", "yesterday"),
        ("escaped", ["x", "x"]),
        ("escaped", "late-annotations"),
        ("extra", 1),
    ],
)
def test_the_schema_rejects_a_broken_suite_validation(key: str, value: object) -> None:
    data = submitted(scored())
    data["suiteValidation"][key] = value
    assert any(e.startswith("suiteValidation") for e in conformance.validate(data))


def test_the_schema_requires_every_part_of_the_block() -> None:
    for key in ("caught", "seeded", "date", "escaped"):
        data = submitted(scored())
        del data["suiteValidation"][key]
        assert conformance.validate(data), key


# ----------------------------------------------------------------------------- HTML


def test_the_html_says_how_good_the_suite_is_after_the_verdicts() -> None:
    page = html.render_html(scored())
    section = page[page.index('<section id="suite-validation">') :]
    section = section[: section.index("</section>")]
    assert page.index('id="verdict"') < page.index('id="suite-validation"') < page.index('id="checklist"')
    assert "How good is this suite?" in section
    # a score file from before fidelities: one score, what it does not say is said as not recorded
    assert "<td><b>not recorded</b></td>\n        <td><b>3 of 5 seeded faults caught</b></td>" in section
    assert "<td>2026-03-02 04:05 UTC</td>" in section
    assert (
        "Not caught by any check: <code>late-annotations</code>, <code>ignore-limit</code> (not judged)."
        in section
    )
    # the per-fault table, folded
    assert '<details class="faults">' in section and "Per seeded fault (5)" in section
    folded = section[section.index('<details class="faults">') :]
    rows = folded[folded.index("<tbody>") : folded.index("</tbody>")].split("<tr")[1:]
    assert len(rows) == 5
    (escaped,) = [r for r in rows if "late-annotations" in r]
    assert "ESCAPED" in escaped and "s-failed" in escaped and "scheduler" in escaped
    (not_judged,) = [r for r in rows if "ignore-limit" in r]
    assert "not judged" in not_judged and "s-not-judged" in not_judged
    (omit,) = [r for r in rows if "omit-limit" in r]
    assert "<code>scheduler/annotations-at-bind</code>, <code>scheduler/limit-and-mode-at-bind</code>" in omit


def test_the_html_without_a_score_says_so_in_one_line() -> None:
    page = html.render_html(load_run(RUNS / "reference-error-skips"))
    section = page[page.index('<section id="suite-validation">') : page.index('<section id="checklist">')]
    assert "No mutation score was recorded for this version of the suite" in section
    assert "<code>gpuconf mutate --write-score</code>" in section
    assert "<table" not in section and "seeded faults caught" not in section


def test_the_html_escapes_what_the_score_file_says() -> None:
    hostile = {
        "score": {"caught": 0, "seeded": 1},
        "faults": {"<b>x</b>": {"kind": "<i>", "verdict": "ESCAPED"}},
    }
    page = html.render_html(scored(score=hostile))
    assert "<b>x</b>" not in page and "&lt;b&gt;x&lt;/b&gt;" in page
    assert "0 of 1 seeded faults caught</b>" in page


def test_a_scored_run_renders_every_format(tmp_path: Path) -> None:
    shutil.copytree(RUNS / "node-stack-handmade", tmp_path, dirs_exist_ok=True)
    write_run(scored("node-stack-handmade"), tmp_path)
    render_all(load_run(tmp_path), tmp_path)
    report = yaml.safe_load((tmp_path / "report.yaml").read_text())
    assert report["suiteValidation"]["escaped"] == ["late-annotations", "ignore-limit"]
    assert "3 of 5 seeded faults caught" in (tmp_path / "report.html").read_text()


# ----------------------------------------------------------------------------- per fidelity


def _fidelity(date: str, mode: str, verdicts: dict[str, str]) -> dict[str, Any]:
    faults = {
        name: {"kind": "agent", "verdict": v, "caughtBy": ["node/x"] if v == "caught" else []}
        for name, v in verdicts.items()
    }
    caught = sum(v == "caught" for v in verdicts.values())
    return {
        "date": date,
        "mode": mode,
        "score": {"caught": caught, "seeded": len(verdicts)},
        "faults": faults,
    }


IDEAL = {
    "fidelity": "ideal",
    **_fidelity("2026-04-01T10:00:00+00:00", "full", {"a": "caught", "b": "caught"}),
}
H200 = {
    "fidelity": "h200",
    **_fidelity("2026-04-01T11:30:00+00:00", "quick", {"a": "caught", "b": "ESCAPED"}),
}
# The shape `gpuconf mutate --fidelity ideal --fidelity h200 --write-score` writes.
PER_FIDELITY: dict[str, Any] = {**IDEAL, "fidelities": {"ideal": IDEAL, "h200": H200}}


def test_every_fidelity_s_score_is_read_with_its_labels() -> None:
    ideal, h200 = validation.validations(scored(score=PER_FIDELITY))
    assert (ideal.fidelity, ideal.mode, ideal.caught, ideal.seeded) == ("ideal", "full", 2, 2)
    assert (h200.fidelity, h200.mode, h200.caught, h200.escaped) == ("h200", "quick", 1, ["b"])
    assert (
        h200.line()
        == "1 of 2 seeded faults caught (h200 fidelity, quick mode, mutation run of 2026-04-01 11:30 UTC)"
    )
    assert validation.validation(scored(score=PER_FIDELITY)) == ideal  # the first, as the top says


def test_an_old_score_file_is_one_score() -> None:
    (one,) = validation.validations(scored())
    assert one == validation.validation(scored())
    assert (one.fidelity, one.mode, one.caught, one.seeded) == ("", "", 3, 5)
    assert validation.validations(load_run(RUNS / "bad-scheduler-xdist")) == []


def test_the_shipped_score_file_gives_both_fidelities_with_every_seeded_fault() -> None:
    # conformance/mutation-score.json as recorded (gpuconf mutate --write-score): both fidelities,
    # each with its mode, and every fault the tables seed today, none escaped
    from conformance.mutate import EXPECTED_AGENT, EXPECTED_SCHEDULER

    shipped = validation.read_score(
        Path(validation.__file__).parents[1] / "conformance" / "mutation-score.json"
    )
    scores = validation.validations(scored(score=shipped))
    assert [v.fidelity for v in scores] == ["ideal", "h200"]
    assert all(v.mode in ("quick", "full") for v in scores), [v.mode for v in scores]
    seeded = len(EXPECTED_SCHEDULER) + len(EXPECTED_AGENT)
    assert [(v.caught, v.seeded) for v in scores] == [(seeded, seeded)] * 2


def test_the_html_shows_every_fidelity_labelled() -> None:
    page = html.render_html(scored(score=PER_FIDELITY))
    section = page[page.index('<section id="suite-validation">') :]
    section = section[: section.index("</section>")]
    rows = section[section.index("<tbody>") : section.index("</tbody>")].split("<tr")[1:]
    ideal, h200 = rows
    assert "<b>ideal</b>" in ideal and "2 of 2 seeded faults caught" in ideal
    assert "full" in ideal and "2026-04-01 10:00 UTC" in ideal and "escaped" not in ideal
    assert "<b>h200</b>" in h200 and "1 of 2 seeded faults caught" in h200
    assert "quick" in h200 and "2026-04-01 11:30 UTC" in h200 and 'class="score escaped"' in h200
    assert "Not caught by any check (h200 fidelity): <code>b</code>." in section
    assert (
        "Per seeded fault, ideal fidelity (2)" in section and "Per seeded fault, h200 fidelity (2)" in section
    )


def test_the_conformance_report_has_every_fidelity() -> None:
    data = submitted(scored(score=PER_FIDELITY))
    assert conformance.validate(data) == []
    block = data["suiteValidation"]
    assert (block["fidelity"], block["mode"], block["caught"]) == ("ideal", "full", 2)
    assert [(f["fidelity"], f["mode"], f["escaped"]) for f in block["fidelities"]] == [
        ("ideal", "full", []),
        ("h200", "quick", ["b"]),
    ]
    block["fidelities"][1]["mode"] = "slow"
    assert any(e.startswith("suiteValidation/fidelities/1/mode") for e in conformance.validate(data))


def test_mutate_writes_each_fidelity_with_its_mode() -> None:
    from conformance.mutate import FaultResult, MutationReport, score_record

    caught = FaultResult("no-eviction", "agent", "evict", caught_by=["node/soft-limit-eviction"])
    escaped = FaultResult("no-eviction", "agent", "evict")
    written = score_record(
        [
            MutationReport("2026-04-01T10:00:00+00:00", 10.0, {}, [caught], "ideal", quick=False),
            MutationReport("2026-04-01T11:00:00+00:00", 20.0, {}, [escaped], "h200", quick=True),
        ]
    )
    assert (written["fidelity"], written["mode"], written["score"]) == (
        "ideal",
        "full",
        {"caught": 1, "seeded": 1},
    )
    assert list(written["fidelities"]) == ["ideal", "h200"]
    ideal, h200 = validation.validations(scored(score=written))
    assert (ideal.fidelity, ideal.mode, ideal.escaped) == ("ideal", "full", [])
    assert (h200.fidelity, h200.mode, h200.escaped, h200.date) == (
        "h200",
        "quick",
        ["no-eviction"],
        "2026-04-01T11:00:00+00:00",
    )
    (alone,) = validation.validations(scored(score=score_record([MutationReport("", 1.0, {}, [caught])])))
    assert (alone.fidelity, alone.mode) == ("ideal", "full")

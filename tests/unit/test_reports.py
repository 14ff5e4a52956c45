"""The result model and its renderings, from recorded runs (tests/data/runs, see its README)."""

from __future__ import annotations

import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import yaml

from reports import allure, conformance, figures, html, junit, terminal
from reports.checklist import DEFAULT_RULES, checklist
from reports.environment import complete
from reports.model import OUTCOMES, Implementation, RunRecord, load_run, record_from_dict
from reports.records import write_run
from reports.render import FILES, render_all
from reports.verdicts import profile_results

RUNS = Path(__file__).resolve().parents[1] / "data" / "runs"
NAMES = sorted(p.name for p in RUNS.iterdir() if (p / "run.json").is_file())
SUBMITTER = Implementation(
    organization="Example GPU Co",
    project="fraction-scheduler",
    url="https://example.com/fraction-scheduler",
    version="v1.2.3",
    contact=["@example/gpu-team"],
)


def load(name: str) -> RunRecord:
    return load_run(RUNS / name)


@pytest.fixture(params=NAMES)
def record(request: pytest.FixtureRequest) -> RunRecord:
    return load(request.param)


# ----------------------------------------------------------------------------- the recorded runs


def test_the_recorded_runs_cover_every_outcome_and_profile() -> None:
    outcomes = {r.outcome for name in NAMES for r in load(name).results}
    assert outcomes == set(OUTCOMES)
    profiles = {r.profile for name in NAMES for r in load(name).results}
    assert profiles == {"scheduler", "node", "stack", "probe"}
    # a real sandbox run whole (sandbox-scheduler, for certification) is most of it: about 450 KB of
    # its 690 KB since the scheduler checks of issue 32 stage more Pods (three not-ready nodes, busy
    # GPUs, one author-named Pod per GPU), each with its timeline
    assert sum(p.stat().st_size for p in RUNS.rglob("*") if p.is_file()) < 800_000


def test_a_moved_run_finds_its_evidence_files() -> None:
    rec = load("bad-scheduler-xdist")
    r = next(r for r in rec.results if r.id == "memory-fit")
    written = r.evidence["files"]["pod-timelines.json"]
    assert written.startswith("/tmp/") and not Path(written).exists()
    assert figures.files(rec, r)["pod-timelines.json"].is_relative_to(RUNS)


def test_write_and_load_round_trip(tmp_path: Path, record: RunRecord) -> None:
    written = write_run(record, tmp_path)
    again = load_run(tmp_path)
    assert [p.name for p in written] == ["run.json", "checks", "junit.xml"]
    assert again.results == record.results
    assert (again.environment, again.catalog, again.source) == (
        record.environment,
        record.catalog,
        record.source,
    )
    assert len(list((tmp_path / "checks").glob("*.json"))) == len(record.results)


def test_a_run_json_of_the_first_release_still_loads() -> None:
    data = json.loads((RUNS / "bad-scheduler-xdist" / "run.json").read_text())
    for key in ("source", "gpuconfVersion", "environment", "catalog", "implementation"):
        data.pop(key, None)
    for r in data["results"]:
        for key in ("rules", "figures", "started", "source"):
            r.pop(key, None)
    data["results"][0]["fieldOfALaterRelease"] = 1
    rec = record_from_dict(data)
    assert rec.source == "run" and rec.implementation == Implementation() and rec.results[0].rules == []


def test_the_environment_is_completed_from_options_preflight_and_target() -> None:
    env = complete(load("bad-scheduler-xdist"))
    assert (env.scheduler_name, env.kubernetes_version, env.gpu_product) == ("bad", "v1.36.3", "NVIDIA-H200")
    assert (env.simulated, env.gpu_count, env.gpu_memory_mib) == (True, 8, 143771)
    given = complete(load("node-stack-handmade"))
    assert (given.node_agent, given.agent_backend, given.driver_version, given.cuda_version) == (
        "gpuconf reference agent",
        "sim",
        "580.95.05",
        "13.4",
    )
    assert load("probe-no-eviction").mode == "probe"


def test_verdict_per_profile() -> None:
    by_name = {p.name: p.result for p in profile_results(load("node-stack-handmade"))}
    assert by_name == {"node": "partial", "stack": "failure"}  # node: an error; stack: a failure and a skip
    assert {p.result for p in profile_results(load("bad-scheduler-xdist"))} == {"failure"}
    assert {p.result for p in profile_results(load("reference-error-skips"))} == {"partial"}


# ----------------------------------------------------------------------------- ConformanceReport


def test_conformance_report_is_valid_against_its_schema(record: RunRecord) -> None:
    data = yaml.safe_load(conformance.render_yaml(record, SUBMITTER))
    assert conformance.validate(data) == []
    assert (data["apiVersion"], data["kind"]) == ("gpuconf.io/v1alpha2", "ConformanceReport")
    assert data["implementation"]["contact"] == ["@example/gpu-team"]
    for profile in data["profiles"]:
        stats = profile["statistics"]
        assert len(profile["failedChecks"]) == stats["failed"]
        assert len(profile["skippedChecks"]) == stats["skipped"]


def test_conformance_report_without_the_submitter_is_not_a_submission() -> None:
    text = conformance.render_yaml(load("reference-error-skips"))
    assert text.startswith(
        "# Not yet a submission: give --organization, --project, --url, --version, --contact"
    )
    errors = conformance.validate(yaml.safe_load(text))
    assert any(e.startswith("implementation/organization") for e in errors)


def test_conformance_report_results_and_features() -> None:
    data = conformance.report(load("reference-error-skips"), SUBMITTER)
    (scheduler,) = data["profiles"]
    assert scheduler["result"] == "partial" and scheduler["statistics"]["error"] == 1
    assert scheduler["erroredChecks"] == ["scheduler/release-on-completion"]
    assert {s["name"] for s in scheduler["skippedChecks"]} == {
        "scheduler/annotations-at-bind[gpu-fraction]",
        "scheduler/multi-device",
        "scheduler/portion-conversion",
    }
    assert all("does not support" in s["reason"] for s in scheduler["skippedChecks"])
    assert data["unsupportedFeatures"] == ["gpu-fraction", "multi-device"]
    # that run skipped preflight: what the nodes are is unknown, and the report says no more
    assert data["target"] == "cluster" and data["cluster"]["gpus"]["simulated"] is None


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("kind",), "ConformanceRun"),
        (("profiles", 0, "result"), "passed"),
        (("target",), "kind"),
        (("implementation", "url"), "not a url"),
        (("profiles", 0, "statistics", "failed"), -1),
    ],
)
def test_the_schema_rejects_a_broken_report(path: tuple[str | int, ...], value: object) -> None:
    data = conformance.report(load("bad-scheduler-xdist"), SUBMITTER)
    target = data
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    assert conformance.validate(data)


def test_the_schema_rejects_a_success_that_skipped() -> None:
    data = conformance.report(load("reference-error-skips"), SUBMITTER)
    data["profiles"][0]["result"] = "success"
    assert conformance.validate(data)


# ----------------------------------------------------------------------------- JUnit


def test_junit_has_one_testcase_per_check_with_party_and_statement(record: RunRecord) -> None:
    root = junit.junit_tree(record).getroot()
    cases = list(root.iter("testcase"))
    assert len(cases) == len(record.results) == int(root.get("tests", "0"))
    by_name = {c.get("name"): c for c in cases}
    for r in record.results:
        case = by_name[r.key]
        props = {p.get("name"): p.get("value") for p in case.iter("property")}
        assert props["party"] == r.party and props["statement"] == r.statement
        tag = {"failed": "failure", "error": "error", "skipped": "skipped", "passed": None}[r.outcome]
        children = {c.tag for c in case} - {"properties", "system-out"}
        assert children == ({tag} if tag else set())
    counts = record.counts()
    assert (root.get("failures"), root.get("errors"), root.get("skipped")) == (
        str(counts["failed"]),
        str(counts["error"]),
        str(counts["skipped"]),
    )


def test_junit_error_is_not_a_failure() -> None:
    root = junit.junit_tree(load("reference-error-skips")).getroot()
    (errored,) = [c for c in root.iter("testcase") if c.find("error") is not None]
    assert errored.get("name") == "scheduler/release-on-completion" and errored.find("failure") is None
    assert "timed out" in (errored.find("error").get("message") or "")  # type: ignore[union-attr]


# ----------------------------------------------------------------------------- HTML


def test_html_renders_every_recorded_run(record: RunRecord) -> None:
    page = html.render_html(record, SUBMITTER)
    for anchor in ('id="verdict"', 'id="checklist"', 'id="thresholds"', 'id="modes"', 'id="rollout"'):
        assert anchor in page
    for r in record.results:
        assert f'id="{html.anchor(r.key)}"' in page
    assert "Example GPU Co" in page
    for external in ('src="http', "src='http", 'href="http', "url(http", "@import"):
        assert external not in page


def test_html_failed_checks_show_evidence_and_the_party() -> None:
    rec = load("bad-scheduler-xdist")
    page = html.render_html(rec)
    view = html.check_view(rec, next(r for r in rec.results if r.id == "limit-and-mode-at-bind"))
    assert view.broken_by == "scheduler"
    assert any(a.key.endswith(".gpu-memory.request") for t in view.timelines for a in t.keys)
    assert "Rule broken by: <b>scheduler</b>" in page
    assert "Annotations, relative to the binding" in page and "Events" in page


def test_html_a_stack_failure_whose_node_twin_passed_is_the_schedulers() -> None:
    rec = load("node-stack-handmade")
    failed = next(r for r in rec.results if r.key == "stack/pressure-eviction")
    assert html.broken_by(rec, failed).startswith("scheduler")
    page = html.render_html(rec)
    assert "log-guaranteed-main.txt" in page and "alloc 70000 MiB: refused" in page
    assert "nvidia-smi --query-gpu" in page  # the visibility check's nvidia-smi output


def test_html_the_four_deliverables_from_the_node_and_stack_run() -> None:
    pytest.importorskip("matplotlib")
    ctx = html.context(load("node-stack-handmade"))
    assert {row.view.result.key for row in ctx["thresholds"]} >= {"node/hard-limit", "node/pressure-eviction"}
    assert all(
        row.plot and row.plot.startswith("data:image/svg+xml;base64,")
        for row in ctx["thresholds"]
        if row.view.result.key == "node/hard-limit"
    )
    (modes,) = ctx["modes"]
    assert modes.modes["time-slicing"].overlap == 0.0 and modes.modes["sm-sharing"].overlap > 0.5
    assert modes.plot is not None
    assert [v.result.key for v in ctx["rollout"].restart] == ["node/agent-restart"]
    (_view, ramp, plot) = ctx["rollout"].density[0]
    assert len(ramp) == 5 and plot is not None


def test_html_without_matplotlib_renders_tables_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("reports.plots.available", lambda: False)
    page = html.render_html(load("node-stack-handmade"))
    assert "plots need matplotlib" in page and "data:image/svg+xml" not in page
    assert "35968 MiB" in page  # the boundary found, as a table


def test_checklist_rows_are_the_rule_table_with_this_runs_verdict() -> None:
    from enforcement.rules import RULES

    assert {r for rules in DEFAULT_RULES.values() for r in rules} <= set(RULES)
    record = load("bad-scheduler-xdist")
    # Findings name the rule they found broken (as the checks write them now); a failed check
    # whose finding names none marks none of its rules failed.
    for result in record.results:
        if result.id in ("memory-fit", "limit-and-mode-at-bind"):
            result.reason += " [gpu-overcommit]" if result.id == "memory-fit" else " [limit-missing]"
    items = {i.rule.id: i for _title, rows in checklist(record) for i in rows}
    assert set(items) == set(RULES)
    assert items["gpu-overcommit"].status == "failed"  # memory-fit failed (overcommit fault)
    assert items["limit-missing"].status == "failed"  # omit-limit fault
    assert items["mode-mixing"].status == "not judged"  # mode-separation's finding names no rule
    assert items["devices-missing"].status == "passed"
    # a scheduler that writes no annotations breaks memory-missing, not the author-side rules
    for rule in ("unknown-container", "multiple-fractional-containers", "container-mismatch"):
        assert items[rule].status != "failed"
    clean = {i.rule.id: i.status for _t, rows in checklist(load("reference-error-skips")) for i in rows}
    assert clean["gpu-overcommit"] == "passed" and clean["devices-count"] == "skipped"  # multi-device
    assert items["fraction-value"].status == "not judged"


def test_against_the_upstream_scheduler_the_checklist_fails_only_the_rules_a_finding_names() -> None:
    """The upstream kube-scheduler writes no annotations: its findings name memory-missing and
    devices-missing (and the SHOULD limit-missing, and the overcommit memory-fit found); the
    author-side rules its failing checks also cover are not failed by them."""
    record = load("upstream-scheduler")
    assert {r.id for r in record.results if r.outcome == "failed"} >= {
        "annotations-at-bind",
        "annotations-name-the-container",
        "devices-scheduler-owned",
    }
    items = {i.rule.id: i for _title, rows in checklist(record) for i in rows}
    failed = {rule for rule, item in items.items() if item.status == "failed"}
    assert failed == {"memory-missing", "devices-missing", "limit-missing", "gpu-overcommit"}
    for rule in (
        "unknown-container",
        "multiple-fractional-containers",
        "container-mismatch",
        "devices-set-by-author",
    ):
        assert items[rule].status == "not judged", rule
    assert "annotations-name-the-container" in {r.id for r in items["memory-missing"].failing}


# ----------------------------------------------------------------------------- Allure


def test_allure_results_from_a_recorded_run(tmp_path: Path) -> None:
    rec = load("node-stack-handmade")
    out = allure.write_results(rec, tmp_path / "allure-results")
    results = [json.loads(p.read_text()) for p in out.glob("*-result.json")]
    assert len(results) == len(rec.results)
    by_name = {r["name"]: r for r in results}
    failed = by_name["stack/pressure-eviction"]
    labels = {(label["name"], label["value"]) for label in failed["labels"]}
    assert {
        ("epic", "stack"),
        ("feature", "memory"),
        ("story", "pressure-eviction"),
        ("tag", "stack"),
    } <= labels
    assert ("severity", "critical") in labels and failed["status"] == "failed"
    assert by_name["node/fault-isolation"]["status"] == "broken"  # error: not judged
    assert by_name["stack/multi-device-eviction"]["status"] == "skipped"
    assert ("severity", "normal") in {
        (x["name"], x["value"]) for x in by_name["stack/density-ramp"]["labels"]
    }
    for r in results:
        for a in r.get("attachments", []):
            assert (out / a["source"]).is_file()
    names = {a["name"] for a in failed["attachments"]}
    assert {"Events", "evidence: log-guaranteed-main.txt", "Pods (annotations at binding)"} <= names
    assert any(a["name"] == "workload result: capped" for a in by_name["node/hard-limit"]["attachments"])
    props = (out / "environment.properties").read_text()
    assert "scheduler=gpuconf-reference 0.1.0" in props and "cuda=13.4" in props
    assert json.loads((out / "executor.json").read_text())["buildName"] == rec.run_id


def test_allure_attaches_plots_when_matplotlib_is_there(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = allure.write_results(load("node-stack-handmade"), tmp_path / "r")
    svgs = list(out.glob("*-attachment.svg"))
    assert len(svgs) >= 4 and all(p.read_text().lstrip().startswith(("<?xml", "<svg")) for p in svgs)


# ----------------------------------------------------------------------------- terminal, render_all, CLI


def test_terminal_summary_from_the_model() -> None:
    text = terminal.summary(load("node-stack-handmade"))
    assert text.splitlines()[0].split() == ["CHECK", "LEVEL", "PARTY", "OUTCOME", "SECONDS", "REASON"]
    assert "profile stack: FAILURE (2 passed, 1 failed, 1 skipped)" in text
    *_, verdict, level = text.rstrip().splitlines()
    assert verdict.endswith("in 312 s")
    assert level.startswith("LEVEL: NOT CONFORMANT (sandbox-verified, simulated GPUs; reference components)")


def test_render_all_writes_every_format(tmp_path: Path) -> None:
    shutil.copytree(RUNS / "reference-error-skips", tmp_path / "run")
    rec = load_run(tmp_path / "run")
    written = render_all(rec, tmp_path / "run", implementation=SUBMITTER)
    assert [p.name for p in written] == [FILES[f] for f in ("yaml", "html", "junit", "allure")]
    assert conformance.validate(yaml.safe_load((tmp_path / "run" / "report.yaml").read_text())) == []
    ET.parse(tmp_path / "run" / "junit.xml")


def test_gpuconf_report_render_and_diff(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from conformance.cli import main

    rc = main(
        ["report", "render", str(RUNS / "bad-scheduler-xdist"), "--format", "yaml", "--output", str(tmp_path)]
        + ["--organization", "O", "--project", "P", "--url", "https://example.com", "--version", "1"]
        + ["--contact", "a,b"]
    )
    assert rc == 0
    data = yaml.safe_load((tmp_path / "report.yaml").read_text())
    assert data["implementation"]["contact"] == ["a", "b"] and conformance.validate(data) == []
    assert main(["report", "render", str(RUNS / "probe-no-eviction"), "--format", "text"]) == 0
    assert "probe/pressure-eviction" in capsys.readouterr().out
    before, after = str(RUNS / "reference-error-skips"), str(RUNS / "bad-scheduler-xdist")
    assert main(["report", "diff", before, after]) == 1
    assert "REGRESSED      scheduler/memory-fit: passed -> failed" in capsys.readouterr().out
    assert main(["report", "diff", after, before]) == 0
    assert main(["report", "diff", str(tmp_path / "nothing"), before]) == 2

"""The result model is whole under pytest-xdist: worker reports reach the controller with their
``user_properties`` (the check's declaration, its outcome, its evidence summary), and the controller
alone builds the run from them with the plugin's own ``result_from_reports`` and writes it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

CONFTEST = """
import os
from pathlib import Path

import pytest

from fixtures.suite.outcomes import PROP_CHECK, PROP_EVIDENCE, PROP_OUTCOME
from fixtures.suite.results import result_from_reports
from reports.model import RunRecord
from reports.records import write_run

PHASES = {}
RESULTS = []


def pytest_runtest_setup(item):
    meta = {"key": f"node/{item.name}", "id": item.name, "profile": "node", "party": "node"}
    meta.update(level="MUST", statement=f"{item.name} MUST hold.", capability="merge")
    meta.update(features=[], seed="", form=None)
    item.user_properties.append((PROP_CHECK, meta))


@pytest.fixture
def evidence(request):
    facts = {}
    yield facts
    facts["worker"] = os.environ.get("PYTEST_XDIST_WORKER", "controller")
    pods = {"p": {"annotationsAtBind": {"k": "v"}}}
    request.node.user_properties.append((PROP_EVIDENCE, {"facts": facts, "pods": pods}))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    outcome = None
    if report.skipped:
        outcome = "skipped"
    elif report.when == "call":
        outcome = "passed" if report.passed else "failed"
    if outcome:
        reason = "" if outcome == "passed" else "why"
        props = [(PROP_OUTCOME, {"when": report.when, "outcome": outcome, "reason": reason, "detail": ""})]
        item.user_properties.extend(props)
        report.user_properties.extend(props)
    return report


def pytest_runtest_logreport(report):
    PHASES.setdefault(report.nodeid, {})[report.when] = report
    if report.when == "teardown":
        result = result_from_reports(PHASES.pop(report.nodeid))
        if result is not None:
            RESULTS.append(result)


def pytest_sessionfinish(session):
    if hasattr(session.config, "workerinput"):
        return
    results = sorted(RESULTS, key=lambda r: r.key)
    record = RunRecord("merge", 0.0, 1.0, {"kind": "test"}, {"profiles": ["node"]}, results)
    write_run(record, Path(os.environ["MERGE_OUT"]))
"""

TESTS = """
import pytest

@pytest.mark.parametrize("n", range(8))
def test_item(evidence, n):
    evidence["boundary"] = {"limitMiB": 100 + n, "foundMiB": 100 + n}
    assert n != 5, "five breaks the rule"

def test_skipped(evidence):
    pytest.skip("needs feature(s) multi-device")
"""


def test_results_and_evidence_from_two_workers_reach_one_run(
    pytester: pytest.Pytester, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("xdist")
    out = tmp_path / "run"
    monkeypatch.setenv("MERGE_OUT", str(out))
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_merge=TESTS)
    result = pytester.runpytest_subprocess("-n", "2", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=7, failed=1, skipped=1)
    from reports.figures import boundaries
    from reports.model import load_run

    record = load_run(out)
    by_key = {r.key: r for r in record.results}
    assert len(by_key) == 9
    assert by_key["node/test_skipped"].outcome == "skipped"
    workers = {r.evidence["facts"]["worker"] for r in record.results}
    assert workers == {"gw0", "gw1"}
    assert by_key["node/test_item[5]"].outcome == "failed"
    assert [b.limit_mib for b in boundaries(record, by_key["node/test_item[3]"])] == [103]
    assert json.loads((out / "run.json").read_text())["statistics"] == {
        "passed": 7,
        "failed": 1,
        "skipped": 1,
        "error": 0,
    }


def test_only_the_checks_judgement_fails_a_check_a_bare_assert_is_an_error() -> None:
    from fixtures.suite.frame import fail
    from fixtures.suite.outcomes import classify, reason_of

    def info(exc: BaseException) -> pytest.ExceptionInfo[BaseException]:
        with pytest.raises(type(exc)) as raised:
            raise exc
        return raised  # type: ignore[return-value]

    assert classify(info(fail("the limit was not enforced"))) == "failed"
    bare = info(AssertionError("written is not None"))
    assert classify(bare) == "error"
    assert reason_of(bare, "error").startswith("a check's own assumption did not hold (a suite bug")
    assert classify(info(RuntimeError("boom"))) == "error"

"""Who is to blame: a check fails only through its judgement, and what the suite could not judge is an
error, never a failure of the implementation (docs/architecture.md §5).

- a bare ``assert`` escaping a check is the suite's own bug: outcome ``error``, saying so;
- a workload that reports ``plan-error`` or ``backend-unavailable`` never ran its plan: an error, and
  preflight stops on it with the reason;
- release-on-exit's next workload that neither ran nor was refused in time: an error (not judged);
- a node that refuses a valid placement fails at once (not an error once a wait runs out), in the
  suite as in ``gpuconf probe``; in the scheduler profile, which does not judge the node, an error;
- a binding the Pod watch saw only in a relist cannot prove the annotations at binding: an error.

The Suite runs on a Pod watch whose events the test writes, and on a cluster stand-in that answers
reads with recorded Pods: no API server, no waiting out timeouts.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from types import SimpleNamespace
from typing import Any

import pytest

from conformance import test_release
from conformance.expect import limit_and_mode_present, placement_must_be_complete
from enforcement.contract import SUFFIX_DEVICES, SUFFIX_LIMIT, SUFFIX_MODE, SUFFIX_REQUEST, nvidia_key
from fixtures.suite import preflight
from fixtures.suite.checks import Check
from fixtures.suite.evidence import Evidence
from fixtures.suite.frame import (
    CheckFailed,
    NodeRefused,
    RunOptions,
    Suite,
    WorkloadNotRun,
    workload_must_have_run,
)
from fixtures.suite.outcomes import classify, reason_of
from fixtures.suite.podwatch import PodWatch, WatchGap, _snapshot
from fixtures.suite.scenario import NotJudged, Stage
from fixtures.suite.waiting import WaitTimeout

pytest_plugins = ["pytester"]

# ----------------------------------------------------------------------------- a Suite without a cluster


def options(**kw: Any) -> RunOptions:
    return RunOptions(
        scheduler_name="s", profiles=("node",), supported_features=frozenset(), run_id="r", **kw
    )


def suite(profile: str = "node", pods: Mapping[str, Any] | None = None, **kw: Any) -> tuple[Suite, PodWatch]:
    watch = PodWatch.__new__(PodWatch)
    watch._events, watch._cond, watch.gaps = [], threading.Condition(), []
    check = Check(id="x", level="MUST", statement="x MUST hold", profiles=(profile,), capability="t")  # type: ignore[arg-type]
    recorded = dict(pods or {})
    cluster = SimpleNamespace(
        read_pod=lambda _ns, name: recorded.get(name),
        events=lambda _ns, _name=None: [],
        read_node=lambda _name: {},
    )
    box = Suite(
        cluster=cluster,  # type: ignore[arg-type]
        options=options(**kw),
        check=check,
        profile=profile,
        form=None,
        namespace="ns",
        nodes=[],
        evidence=Evidence(f"{profile}/x", None),
        watch=watch,
    )
    return box, watch


def waiting(name: str, reason: str, message: str = "") -> dict[str, Any]:
    """A Pod bound to node-1 whose container waits for ``reason``."""
    return {
        "metadata": {"name": name, "resourceVersion": "2", "annotations": {}},
        "spec": {"nodeName": "node-1"},
        "status": {
            "phase": "Pending",
            "containerStatuses": [
                {"name": "main", "state": {"waiting": {"reason": reason, "message": message}}}
            ],
        },
    }


def info(exc: BaseException) -> pytest.ExceptionInfo[BaseException]:
    with pytest.raises(type(exc)) as raised:
        raise exc
    return raised  # type: ignore[return-value]


# ----------------------------------------------------------------------------- a bare assert

CONFTEST = """
import pytest

from fixtures.suite.outcomes import PROP_CHECK, record_outcome
from fixtures.suite.results import result_from_reports

PHASES = {}
RESULTS = {}


def pytest_runtest_setup(item):
    meta = {"key": f"node/{item.name}", "id": item.name, "profile": "node", "party": "node"}
    meta.update(level="MUST", statement=f"{item.name} MUST hold.", capability="t", features=[])
    item.user_properties.append((PROP_CHECK, meta))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    record_outcome(item, call, report)  # the plugin's own
    return report


def pytest_runtest_logreport(report):
    PHASES.setdefault(report.nodeid, {})[report.when] = report
    if report.when == "teardown":
        result = result_from_reports(PHASES.pop(report.nodeid))
        RESULTS[result.id] = result


def pytest_sessionfinish(session):
    for result in RESULTS.values():
        print(f"RESULT {result.id} {result.outcome} {result.reason}")
"""

CHECKS = """
from fixtures.suite.frame import fail


def test_bare_assert():
    written = None
    assert written is not None, "the suite wrote no placement"


def test_judged():
    raise fail("the limit was not enforced")
"""


def test_a_bare_assert_escaping_a_check_is_an_error_that_says_it_is_a_suite_bug(
    pytester: pytest.Pytester,
) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_checks=CHECKS)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-s")
    said = [line[line.index("RESULT ") :] for line in result.outlines if "RESULT " in line]
    lines = {line.split()[1]: line for line in said}
    assert lines["test_bare_assert"].startswith(
        "RESULT test_bare_assert error a check's own assumption did not hold (a suite bug, not a verdict): "
        "AssertionError: the suite wrote no placement"
    )
    assert lines["test_judged"] == "RESULT test_judged failed the limit was not enforced"


def test_the_checks_and_their_helpers_hold_no_bare_assert() -> None:
    """Swept: a check states what it relies on as an error of its own (a ``RuntimeError``, a wait),
    and judges only through ``CheckFailed``."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    files = [*root.glob("conformance/test_*.py"), *root.glob("fixtures/suite/*.py")]
    files += [root / "conformance" / "judgements.py", root / "conformance" / "expect.py"]
    found = [
        f"{path.relative_to(root)}:{node.lineno}"
        for path in files
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.Assert)
    ]
    assert found == []


# ----------------------------------------------------------------------------- a workload that never ran


@pytest.mark.parametrize("status", ["plan-error", "backend-unavailable"])
def test_a_workload_that_never_ran_its_plan_is_an_error_never_a_failure(status: str) -> None:
    result = {"gpuconf_workload": 1, "status": status, "error": {"type": status, "message": "no sim socket"}}
    with pytest.raises(
        WorkloadNotRun, match=rf"^w: container main's workload reported {status} \(no sim socket\)"
    ):
        workload_must_have_run("w", result)
    raised = info(WorkloadNotRun("w: ..."))
    assert classify(raised) == "error" and reason_of(raised, "error") == "w: ..."
    for fine in ("ok", "unexpected-oom", "client-gone", "terminated", ""):
        workload_must_have_run("w", {"status": fine})
    workload_must_have_run("w", None)  # no result: the check says what that means


def test_a_scenario_outcome_of_a_workload_that_never_ran_is_an_error() -> None:
    """Every scenario judgement reads ``Stage.outcome``: a plan error never reaches ``require``."""
    box, watch = suite()
    stage = Stage.__new__(Stage)
    stage.suite = box
    message = '{"gpuconf_workload": 1, "status": "backend-unavailable", "exit_code": 3}'
    pod = waiting("w", "x")
    pod["status"]["containerStatuses"][0]["state"] = {"terminated": {"exitCode": 3, "message": message}}
    watch._add(_snapshot("MODIFIED", pod))
    with pytest.raises(WorkloadNotRun, match="backend-unavailable"):
        stage.outcome("w")
    assert box.evidence.workloads["w"]["status"] == "backend-unavailable"  # the evidence is kept


class Probe:
    """The preflight Pod as a cluster stand-in shows it: terminated with ``result``."""

    def __init__(self, result: str, annotations: Mapping[str, str]) -> None:
        self.pod = {
            "metadata": {"annotations": dict(annotations)},
            "spec": {"containers": [{"name": "main"}], "nodeName": "n"},
            "status": {
                "containerStatuses": [
                    {"name": "main", "state": {"terminated": {"exitCode": 3, "message": result}}}
                ]
            },
        }

    def read_pod(self, _namespace: str, _name: str) -> dict[str, Any]:
        return self.pod


PLACED = {
    nvidia_key("main", SUFFIX_REQUEST): "256Mi",
    nvidia_key("main", SUFFIX_DEVICES): "0",
}
UNAVAILABLE = (
    '{"gpuconf_workload": 1, "status": "backend-unavailable", "error": {"message": "no GPU backend"}}'
)


def test_preflight_stops_on_a_fenced_workload_that_found_no_backend_and_says_why() -> None:
    with pytest.raises(
        preflight.PreflightError, match=r"found no GPU backend on the node \(no GPU backend\)"
    ):
        preflight._image_starts(Probe(UNAVAILABLE, PLACED), "ns", options())  # type: ignore[arg-type]
    bad_plan = '{"gpuconf_workload": 1, "status": "plan-error", "error": {"message": "unknown op"}}'
    with pytest.raises(preflight.PreflightError, match=r"refused the suite's plan \(unknown op\)"):
        preflight._image_starts(Probe(bad_plan, {}), "ns", options())  # type: ignore[arg-type]
    ok = '{"gpuconf_workload": 1, "status": "ok"}'
    assert preflight._image_starts(Probe(ok, PLACED), "ns", options())["workload"]["status"] == "ok"  # type: ignore[arg-type]


def test_preflight_leaves_an_unplaced_probe_to_the_scheduler_checks() -> None:
    """A scheduler that wrote no placement (the upstream kube-scheduler) leaves the Pod unfenced: that
    it found no GPU there is the scheduler's to answer for, judged by its checks, not a stop."""
    out = preflight._image_starts(Probe(UNAVAILABLE, {}), "ns", options())  # type: ignore[arg-type]
    assert out["started"] is True and "no placement" in out["note"]


# ----------------------------------------------------------------------------- a node that refuses


REFUSAL = "CreateContainerConfigError"


def test_a_node_that_refuses_a_valid_placement_fails_at_once() -> None:
    box, _ = suite("node", {"p": waiting("p", REFUSAL, "GPU 0 runs time-slicing")})
    started = time.monotonic()
    with pytest.raises(
        CheckFailed, match=r"^the node refused to start p's container, whose placement is valid"
    ):
        box.wait_running("p", timeout=60)
    assert time.monotonic() - started < 5  # at once, not when the wait runs out
    assert box.evidence.pods["p"]["refusedByNode"].startswith(REFUSAL)


def test_a_refusal_in_the_scheduler_profile_is_an_error() -> None:
    box, _ = suite("scheduler", {"p": waiting("p", REFUSAL, "bad devices")})
    with pytest.raises(NodeRefused, match="the node is not judged in the scheduler profile") as raised:
        box.wait_finished("p", timeout=60)
    assert classify(raised) == "error"  # type: ignore[arg-type]


def test_an_image_the_node_cannot_pull_stays_an_error() -> None:
    box, _ = suite("node", {"p": waiting("p", "ErrImagePull", "not found")}, timeout_scale=0.01)
    with pytest.raises(WaitTimeout, match="refused for"):
        box.wait_running("p", timeout=60)


def test_a_scenario_pod_the_node_refuses_fails_at_once() -> None:
    box, watch = suite("stack")
    stage = Stage.__new__(Stage)
    stage.suite = box
    watch._add(_snapshot("MODIFIED", waiting("p", REFUSAL, "over the GPU's memory")))
    started = time.monotonic()
    with pytest.raises(CheckFailed, match=r"^the stack's node refused to start p's container"):
        stage.wait_ready("p", timeout=60)
    assert time.monotonic() - started < 5


def test_the_probe_says_a_refusal_of_a_valid_placement_at_once() -> None:
    """``gpuconf probe`` asks the agent itself: a refusal is the check's failure, there and then."""
    from conformance.probe.checks import _refused
    from conformance.probe.session import CheckFailed as ProbeFailed

    with pytest.raises(ProbeFailed, match="the agent refused a valid container: no room"):
        _refused(SimpleNamespace(allowed=False, message="no room"))
    _refused(SimpleNamespace(allowed=True, message=""))


# ----------------------------------------------------------------------------- release-on-exit


class SlowStage:
    """release-on-exit's stage, played back: the first workloads end as planned; the next ones are
    neither refused nor done in time (``slow``), or end with ``next_status``."""

    def __init__(self, _suite: Suite, gpus: int = 1, slow: bool = True, next_status: str = "ok") -> None:
        self.slow, self.next_status = slow, next_status

    def mib(self, share: float) -> int:
        return int(share * 1000)

    def place(self, name: str, _plan: Any, **_kw: Any) -> Any:
        return SimpleNamespace(name=name, gpus=("g",))

    def pod(self, name: str, _plan: Any, **_kw: Any) -> str:
        return name

    def placed(self, name: str) -> Any:
        return SimpleNamespace(name=name, gpus=("g",))

    def wait_ended(self, name: str, timeout: float = 0) -> Any:
        if name.startswith("after-"):
            if self.slow:
                raise WaitTimeout(f"{name} to end", timeout, "phase Pending")
            status = self.next_status
        else:
            status = "ok" if name == "exits" else "fault-injected"
        return SimpleNamespace(
            name=name,
            status=status,
            phase="Succeeded",
            exit_code=0,
            reason="",
            result={"status": status},
            as_dict=lambda: {"status": status},
            step=lambda _op: {},
        )


def test_release_on_exits_own_start_timeout_is_an_error_not_a_failure(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    box, _ = suite("node")
    monkeypatch.setattr(test_release, "Stage", SlowStage)
    with pytest.raises(
        NotJudged, match="the next workload did not start in time, so the release was not judged"
    ) as raised:
        test_release.test_release_on_exit(box)
    assert classify(raised) == "error"  # type: ignore[arg-type]
    assert set(box.evidence.facts["notJudged"]) == {
        "the release before after-exits",
        "the release before after-dies",
    }


def test_release_on_exit_still_fails_when_the_next_workload_cannot_take_its_guarantee(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    box, _ = suite("node")
    monkeypatch.setattr(
        test_release, "Stage", lambda s, gpus=2: SlowStage(s, gpus, slow=False, next_status="pressure")
    )
    with pytest.raises(CheckFailed, match="could not take its 600 MiB guarantee"):
        test_release.test_release_on_exit(box)


# ----------------------------------------------------------------------------- a gap in the watch

COMPLETE = {
    nvidia_key("main", SUFFIX_REQUEST): "1000Mi",
    nvidia_key("main", SUFFIX_LIMIT): "2000Mi",
    nvidia_key("main", SUFFIX_MODE): "time-slicing",
    nvidia_key("main", SUFFIX_DEVICES): "0",
}


def bound(kind: str) -> Any:
    pod = {
        "metadata": {"name": "frac", "namespace": "ns", "resourceVersion": "9", "annotations": COMPLETE},
        "spec": {"nodeName": "node-1", "containers": [{"name": "main"}]},
    }
    return _snapshot(kind, pod)


def test_a_binding_seen_only_in_a_relist_is_an_error_never_a_pass_on_the_relisted_state() -> None:
    box, watch = suite("scheduler")
    watch.gaps.append(
        "the watch history was compacted (410 Gone): listed again; changes in between may be missing"
    )
    relisted = bound("RELISTED")
    watch._add(relisted)
    # Complete annotations, but shown by a list after a gap: whether they were there at binding is unknown.
    with pytest.raises(
        WatchGap, match=r"did not see frac being bound: .* relisted state \(the watch history was compacted"
    ) as raised:
        placement_must_be_complete(box, "frac", relisted)
    assert classify(raised) == "error"  # type: ignore[arg-type]
    assert "410 Gone" in reason_of(raised, "error")  # type: ignore[arg-type]
    with pytest.raises(WatchGap):
        limit_and_mode_present(box, "frac", relisted)


def test_a_binding_the_watch_saw_is_judged() -> None:
    box, watch = suite("scheduler")
    seen = bound("MODIFIED")
    watch._add(seen)
    assert placement_must_be_complete(box, "frac", seen).request_mib == 1000
    assert limit_and_mode_present(box, "frac", seen) == []


def test_the_probe_reports_a_workload_that_never_ran_as_an_error() -> None:
    """``gpuconf probe`` holds its workloads to the same rule: ``ERROR``, not ``FAIL``."""
    from conformance.probe import _run_check
    from conformance.probe.checks import ProbeCheck
    from conformance.probe.session import Session

    class Ended:
        pid = 1

        def finish(self, _timeout: float) -> Any:
            return SimpleNamespace(result={"status": "backend-unavailable", "error": {"message": "no CuPy"}})

    def run(session: Any) -> tuple[str, dict[str, Any]]:
        Session.finish(session, Ended(), "release")
        return "released", {}

    session = SimpleNamespace(clean=lambda: None, logs=[])
    result = _run_check(session, ProbeCheck("release-on-exit", run, "", "test_release"))  # type: ignore[arg-type]
    assert result.status == "ERROR"
    assert result.summary.startswith(
        "WorkloadNotRun: release: container main's workload reported backend-unavailable"
    )

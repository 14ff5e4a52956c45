"""The simulated kubelet's Pod status: phase, conditions and container statuses for each situation."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from fixtures.sandbox.noderuntime import status
from fixtures.sandbox.noderuntime.status import (
    ContainerView,
    Running,
    Terminated,
    Waiting,
    build,
    container_status,
    phase,
    render_conditions,
    terminated_from,
)

T0 = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
T1 = T0 + timedelta(seconds=7)


def waiting(
    name: str = "main", reason: str = "ContainerCreating", last: Terminated | None = None
) -> ContainerView:
    return ContainerView(name, "img", Waiting(reason), last_state=last)


def running(name: str = "main", ready: bool = True) -> ContainerView:
    return ContainerView(name, "img", Running(T0), ready=ready, container_id="gpuconf-sim://abc")


def done(name: str = "main", code: int = 0) -> ContainerView:
    reason = "Completed" if code == 0 else "Error"
    return ContainerView(name, "img", Terminated(code, reason, T1, T0), container_id="gpuconf-sim://abc")


def failed_before(code: int = 1) -> Terminated:
    return Terminated(code, "Error", T1, T0)


@pytest.mark.parametrize(
    ("policy", "main", "expected"),
    [
        ("Never", [waiting()], "Pending"),
        ("Never", [running()], "Running"),
        ("Never", [running("a"), done("b")], "Running"),
        ("Never", [done()], "Succeeded"),
        ("Never", [done("a"), done("b", 2)], "Failed"),
        ("OnFailure", [done()], "Succeeded"),
        ("OnFailure", [done(code=1)], "Running"),  # about to restart
        ("OnFailure", [waiting(reason="CrashLoopBackOff", last=failed_before())], "Running"),
        ("Always", [done()], "Running"),
        ("Always", [waiting(reason="CrashLoopBackOff", last=failed_before())], "Running"),
        ("Always", [running("a"), waiting("b")], "Pending"),  # one not started yet
        ("Never", [waiting(reason="CreateContainerConfigError")], "Pending"),
        ("Never", [], "Pending"),
    ],
)
def test_phase_of_regular_containers(policy: str, main: list[ContainerView], expected: str) -> None:
    assert phase(policy, [], main) == expected


@pytest.mark.parametrize(
    ("policy", "init", "expected"),
    [
        ("Always", [waiting("i", "PodInitializing")], "Pending"),
        ("Always", [running("i")], "Pending"),
        ("Always", [done("i"), running("j")], "Pending"),
        ("Never", [done("i", 1)], "Failed"),
        ("OnFailure", [done("i", 1)], "Pending"),
        ("Always", [waiting("i", "CrashLoopBackOff", last=failed_before())], "Pending"),
        ("Never", [waiting("i", "CrashLoopBackOff", last=failed_before())], "Failed"),
    ],
)
def test_phase_while_initialising(policy: str, init: list[ContainerView], expected: str) -> None:
    assert phase(policy, init, [waiting(reason="PodInitializing")]) == expected


def test_phase_after_initialisation_follows_the_main_containers() -> None:
    assert phase("Never", [done("i")], [running()]) == "Running"
    assert phase("Never", [done("i")], [done()]) == "Succeeded"


@pytest.mark.parametrize(
    ("policy", "main", "expected"),
    [
        ("Always", [done(code=143)], "Failed"),  # killed on deletion: nothing restarts it now
        ("Always", [done()], "Succeeded"),
        ("Never", [waiting()], "Failed"),  # deleted before it ever started
        ("Always", [running()], "Running"),  # still stopping
    ],
)
def test_phase_when_terminating(policy: str, main: list[ContainerView], expected: str) -> None:
    assert phase(policy, [], main, terminating=True) == expected


def test_container_status_of_each_state() -> None:
    w = container_status(ContainerView("c", "img:1", Waiting("CreateContainerConfigError", "key x: rule y")))
    assert w["state"] == {"waiting": {"reason": "CreateContainerConfigError", "message": "key x: rule y"}}
    assert (w["ready"], w["started"], w["restartCount"], w["lastState"]) == (False, False, 0, {})
    assert "containerID" not in w

    r = container_status(running())
    assert r["state"] == {"running": {"startedAt": "2026-01-02T03:04:05Z"}}
    assert (r["ready"], r["started"], r["containerID"]) == (True, True, "gpuconf-sim://abc")

    ended = Terminated(137, "Error", T1, T0, "bye", 9)
    t = container_status(
        ContainerView(
            "c", "img", ended, restart_count=2, last_state=failed_before(3), container_id="gpuconf-sim://abc"
        )
    )
    assert t["state"]["terminated"] == {
        "exitCode": 137,
        "reason": "Error",
        "startedAt": "2026-01-02T03:04:05Z",
        "finishedAt": "2026-01-02T03:04:12Z",
        "message": "bye",
        "signal": 9,
        "containerID": "gpuconf-sim://abc",
    }
    assert t["lastState"]["terminated"]["exitCode"] == 3 and t["restartCount"] == 2
    assert t["imageID"] == ""  # recorded, never pulled


def _pod(**spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "namespace": "ns", "uid": "u", "generation": 1},
        "spec": spec,
        "status": {},
    }


def _conditions(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["type"]: c for c in body["conditions"]}


def test_conditions_of_a_running_ready_pod() -> None:
    body = build(_pod(restartPolicy="Always"), [], [running()], now=T1, start_time=T0)
    c = _conditions(body)
    assert {k: v["status"] for k, v in c.items()} == {
        "PodReadyToStartContainers": "True",
        "PodScheduled": "True",
        "Initialized": "True",
        "ContainersReady": "True",
        "Ready": "True",
    }
    assert body["phase"] == "Running" and body["startTime"] == "2026-01-02T03:04:05Z"
    assert body["hostIP"] == body["podIP"] == "127.0.0.1"
    assert body["podIPs"] == [{"ip": "127.0.0.1"}] and body["observedGeneration"] == 1
    assert "initContainerStatuses" not in body


def test_conditions_name_what_is_not_ready() -> None:
    body = build(
        _pod(), [done("i1"), running("i2")], [waiting("a"), running("b", ready=False)], now=T1, start_time=T0
    )
    c = _conditions(body)
    assert (c["Initialized"]["status"], c["Initialized"]["reason"]) == ("False", "ContainersNotInitialized")
    assert c["Initialized"]["message"] == "containers with incomplete status: [i2]"
    assert c["ContainersReady"]["message"] == "containers with unready status: [a b]"
    assert c["Ready"]["reason"] == "ContainersNotReady"
    assert [s["name"] for s in body["initContainerStatuses"]] == ["i1", "i2"]


def test_succeeded_pod_is_not_ready_because_completed() -> None:
    c = _conditions(build(_pod(restartPolicy="Never"), [], [done()], now=T1, start_time=T0))
    assert (c["Ready"]["status"], c["Ready"]["reason"]) == ("False", "PodCompleted")
    assert c["ContainersReady"]["reason"] == "PodCompleted"


def test_readiness_gates_hold_ready_back() -> None:
    pod = _pod(readinessGates=[{"conditionType": "example.com/gate"}])
    c = _conditions(build(pod, [], [running()], now=T1, start_time=T0))
    assert c["ContainersReady"]["status"] == "True"
    assert (c["Ready"]["status"], c["Ready"]["reason"]) == ("False", "ReadinessGatesNotReady")
    pod["status"]["conditions"] = [{"type": "example.com/gate", "status": "True"}]
    assert _conditions(build(pod, [], [running()], now=T1, start_time=T0))["Ready"]["status"] == "True"


def test_transition_time_is_kept_while_the_status_stays() -> None:
    first = render_conditions([status.Condition("Ready", False, "ContainersNotReady")], {}, T0)
    before = {c["type"]: c for c in first}
    same = render_conditions([status.Condition("Ready", False, "ContainersNotReady")], before, T1)
    assert same[0]["lastTransitionTime"] == "2026-01-02T03:04:05Z"
    flipped = render_conditions([status.Condition("Ready", True)], before, T1)
    assert flipped[0]["lastTransitionTime"] == "2026-01-02T03:04:12Z"


def test_build_takes_transition_times_from_the_pod_when_none_are_given() -> None:
    pod = _pod()
    pod["status"]["conditions"] = [
        {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2020-01-01T00:00:00Z"}
    ]
    c = _conditions(build(pod, [], [running()], now=T1, start_time=T0))
    assert c["PodScheduled"]["lastTransitionTime"] == "2020-01-01T00:00:00Z"
    assert c["Ready"]["lastTransitionTime"] == "2026-01-02T03:04:12Z"


def test_terminated_state_reads_back_from_the_api() -> None:
    data = container_status(ContainerView("c", "i", Terminated(3, "Error", T1, T0, "m", None)))["state"][
        "terminated"
    ]
    assert terminated_from(data) == Terminated(3, "Error", T1, T0, "m", None)

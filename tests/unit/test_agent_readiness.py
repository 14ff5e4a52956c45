"""The agent-readiness check's parts: its judgements (``conformance.judgements``), the simulated
device's outage hook (``enforcement.sim.outage``) with its identity checks, the suite's outage
(``fixtures.suite.simoutage``: resumed however it ends, and by the run's cleanup), and the agent's
two seeded faults."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_pods import make_pod, placement

from conformance.judgements import container_started, judge_condition_turn, judge_held, waiting_reason
from enforcement.agent.agent import HealthLoop
from enforcement.agent.options import AgentOptions
from enforcement.agent.testing import sim_agent
from enforcement.backends import Health
from enforcement.localprocess import LocalProcess, process_start_ticks
from enforcement.sim.outage import (
    ANNOTATION,
    SimulatedOutageHook,
    read_hook_file,
    this_process,
    write_hook_file,
)
from fixtures.suite import simoutage
from fixtures.suite.simoutage import OutageError, outage_hook, resume_abandoned, simulated_outage
from workloads.simwire import SIM_TOKEN_ENV

# ---- judgements


def test_a_condition_that_turned_within_the_window_passes_and_a_late_or_missing_one_fails() -> None:
    assert judge_condition_turn("X/Ready", False, 3.0, 10.0, "its backend went away") is None
    late = judge_condition_turn("X/Ready", False, 12.5, 10.0, "its backend went away")
    assert late is not None and "12.5 s" in late and "later than 10 s" in late
    never = judge_condition_turn("X/Ready", True, None, 10.0, "its backend came back")
    assert never is not None and "did not turn True" in never


def pod(state: dict[str, Any], name: str = "main") -> dict[str, Any]:
    return {"status": {"containerStatuses": [{"name": name, "state": state}]}}


WAITING = pod({"waiting": {"reason": "CreateContainerError", "message": "GPU backend sim unavailable"}})


def test_a_container_only_ever_waiting_is_held_and_says_why() -> None:
    history = [{"status": {"phase": "Pending"}}, WAITING, WAITING]
    assert container_started(history, "main") is None
    assert judge_held("held", history, "main", 5.0, "the backend was gone") is None
    assert waiting_reason(history, "main") == "CreateContainerError: GPU backend sim unavailable"


@pytest.mark.parametrize(
    "seen, words",
    [
        (pod({"running": {"startedAt": "2026-01-01T00:00:00Z"}}), "running since"),
        (pod({"terminated": {"reason": "Error", "exitCode": 3}}), "ran and ended (Error 3)"),
    ],
)
def test_a_container_seen_running_or_ended_once_started_unfenced(seen: dict[str, Any], words: str) -> None:
    # Once is enough: a later snapshot that shows it waiting again does not undo that it ran.
    problem = judge_held("held", [WAITING, seen, WAITING], "main", 5.0, "the backend was gone")
    assert problem is not None and words in problem and "unfenced" in problem


def test_another_container_running_is_not_the_held_one() -> None:
    assert container_started([pod({"running": {}}, name="sidecar")], "main") is None


# ---- the hook and its identity


def node_with(text: str | None) -> dict[str, Any]:
    return {"metadata": {"name": "n", "annotations": {ANNOTATION: text} if text else {}}}


def test_the_hook_round_trips_and_a_malformed_one_is_refused(tmp_path: Path) -> None:
    write_hook_file(tmp_path)
    text = read_hook_file(tmp_path)
    assert text is not None
    hook = SimulatedOutageHook.from_json(text)
    assert (hook.stop, hook.resume) == ("SIGSTOP", "SIGCONT")
    assert hook.process == LocalProcess.current()
    assert SimulatedOutageHook.of_node(node_with(text)) == hook
    assert SimulatedOutageHook.of_node(node_with(None)) is None
    for bad in ("[]", '{"stop": "SIGSTOP"}', this_process().to_json().replace("SIGCONT", "SIGNOPE")):
        with pytest.raises(ValueError):
            SimulatedOutageHook.of_node(node_with(bad))
    (tmp_path / "outage-hook.json").write_text("{not json")
    assert read_hook_file(tmp_path) is None


class FakeCoordination:
    def __init__(self, leases: list[Any]) -> None:
        self.leases = leases

    def list_namespaced_lease(self, namespace: str, label_selector: str = "") -> Any:
        wanted = label_selector.split("=", 1)
        items = [
            lease
            for lease in self.leases
            if not label_selector or (lease.metadata.labels or {}).get(wanted[0]) == wanted[1]
        ]
        return type("List", (), {"items": items})()


class FakeCluster:
    def __init__(self, node: dict[str, Any], leases: list[Any] | None = None) -> None:
        self.node = node
        self.coordination = FakeCoordination(leases or [])

    def read_node(self, name: str) -> dict[str, Any]:
        return self.node

    def nodes(self, label_selector: str = "") -> list[dict[str, Any]]:
        return [self.node]


@pytest.fixture
def device() -> Iterator[subprocess.Popen[bytes]]:
    """A process standing in for a simulated device server."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    deadline = time.monotonic() + 5
    while process_start_ticks(child.pid) is None and time.monotonic() < deadline:
        time.sleep(0.01)
    try:
        yield child
    finally:
        child.send_signal(signal.SIGCONT)
        child.kill()
        child.wait()


def hook_of(
    child: subprocess.Popen[bytes], ticks_off: int = 0, host: str | None = None
) -> SimulatedOutageHook:
    me = this_process()
    return SimulatedOutageHook(
        me.stop,
        me.resume,
        child.pid,
        (process_start_ticks(child.pid) or 0) + ticks_off,
        host or me.host,
        me.boot_id,
        "t",
    )


def stopped(child: subprocess.Popen[bytes]) -> bool:
    process = LocalProcess(
        child.pid, process_start_ticks(child.pid) or 0, this_process().host, this_process().boot_id
    )
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        if process.stopped():
            return True
        time.sleep(0.01)
    return False


def test_the_outage_freezes_the_device_and_resumes_it_however_the_block_ends(
    device: subprocess.Popen[bytes],
) -> None:
    hook = hook_of(device)
    assert outage_hook(FakeCluster(node_with(hook.to_json())), "n") == hook  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="inside"):
        with simulated_outage("n", hook) as outage:
            assert stopped(device)
            raise RuntimeError("inside")
    assert outage.ended is not None and not hook.process.stopped()
    with simulated_outage("n", hook) as outage:
        assert stopped(device)
        assert simoutage.resume(outage) is None and not hook.process.stopped()
        assert simoutage.resume(outage) is None  # once only


def test_a_hook_of_another_machine_or_a_reused_pid_is_never_signalled(
    device: subprocess.Popen[bytes],
) -> None:
    for hook, words in (
        (hook_of(device, host="elsewhere"), "only be sent from that machine"),
        (hook_of(device, 1), "no longer runs"),
    ):
        with pytest.raises(OutageError, match=words):
            with simulated_outage("n", hook):
                pass
        assert not LocalProcess(
            device.pid, process_start_ticks(device.pid) or 0, hook.host, hook.boot_id
        ).stopped()
    with pytest.raises(OutageError, match="malformed"):
        outage_hook(FakeCluster(node_with("{}")), "n")  # type: ignore[arg-type]


def lease(name: str, run: str, kind: str = "node") -> Any:
    from datetime import UTC, datetime

    meta = type("Meta", (), {"name": name, "labels": {"gpuconf.io/lease": kind, "gpuconf.io/run": run}})()
    spec = type(
        "Spec",
        (),
        {
            "holder_identity": "h",
            "renew_time": datetime.now(UTC),
            "acquire_time": None,
            "lease_duration_seconds": 60,
        },
    )()
    return type("Lease", (), {"metadata": meta, "spec": spec})()


def test_the_cleanup_resumes_a_device_left_stopped_unless_a_live_run_holds_its_node(
    device: subprocess.Popen[bytes],
) -> None:
    hook = hook_of(device)
    device.send_signal(signal.SIGSTOP)
    assert stopped(device)
    held = FakeCluster(
        node_with(hook.to_json()), [lease("run-other", "other", "run"), lease("node-n", "other")]
    )
    assert resume_abandoned(held) == []  # type: ignore[arg-type]
    assert hook.process.stopped()
    # The run that froze it is the one cleaning up: its outage is over.
    assert resume_abandoned(held, finished_run="other") == ["n"]  # type: ignore[arg-type]
    assert not stopped(device)
    device.send_signal(signal.SIGSTOP)
    assert stopped(device)
    assert resume_abandoned(FakeCluster(node_with(hook.to_json()))) == ["n"]  # type: ignore[arg-type]
    assert not stopped(device)


# ---- the agent, and its two seeded faults


def gone_backend(agent: Any) -> dict[str, bool]:
    """Make ``agent``'s backend report itself unavailable while ``state['ok']`` is False."""
    state = {"ok": True}
    real = agent.backend.health

    def health() -> Health:
        return real() if state["ok"] else Health(False, "SimulatedDeviceUnavailable", "frozen")

    agent.backend.health = health
    return state


@pytest.mark.parametrize("fault", [None, "ready-without-backend"])
def test_the_condition_follows_the_backend_unless_the_fault_keeps_it_true(fault: str | None) -> None:
    agent = sim_agent(options=AgentOptions(node="node-a", faults=frozenset({fault} if fault else set())))
    state = gone_backend(agent)
    loop = HealthLoop(agent.core, lambda: None)
    loop.run_once()
    state["ok"] = False
    loop.run_once()
    written = [ok for ok, _r, _m in agent.kube.conditions]
    assert written[-1] is (fault is not None)
    assert agent.core.backend_down == "frozen"  # the agent knows, whatever the condition says
    state["ok"] = True
    loop.run_once()
    assert agent.core.backend_down is None and agent.kube.conditions[-1][0] is True


@pytest.mark.parametrize("fault", [None, "start-while-unfenced"])
def test_a_container_created_while_the_backend_is_gone_is_refused_unless_the_fault_starts_it(
    fault: str | None,
) -> None:
    agent = sim_agent(options=AgentOptions(node="node-a", faults=frozenset({fault} if fault else set())))
    state = gone_backend(agent)
    loop = HealthLoop(agent.core, lambda: None)
    state["ok"] = False
    loop.run_once()
    adj = agent.core.create_container(make_pod("held", placement("main", 256, 256, devices=("0",))), "main")
    if fault is None:
        assert not adj.allowed and "unavailable" in adj.message
    else:
        assert adj.allowed and SIM_TOKEN_ENV not in adj.env  # started, and fenced by nothing

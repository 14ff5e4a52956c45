"""The restart hook an agent run as a local process announces (``enforcement.agent.restart``), and
``fixtures.suite.agentcontrol`` choosing how to restart an agent from what the cluster shows."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Any

import pytest

from enforcement.agent import restart
from enforcement.agent.restart import ANNOTATION, RestartHook, process_start_ticks, this_process
from fixtures.suite import localsignal
from fixtures.suite.agentcontrol import AgentControlError, restart_agent
from fixtures.suite.frame import RunOptions


def node_with(hook: RestartHook | str | None, ready: bool = True) -> dict[str, Any]:
    annotations = {} if hook is None else {ANNOTATION: hook if isinstance(hook, str) else hook.to_json()}
    status = "True" if ready else "False"
    return {
        "metadata": {"name": "n", "annotations": annotations},
        "status": {"conditions": [{"type": "gpu-fractioning.nvidia.com/Ready", "status": status}]},
    }


def test_the_hook_of_this_process_round_trips_through_the_node_annotation() -> None:
    hook = this_process()
    assert hook.signal == "SIGHUP" and hook.pid == os.getpid()
    assert RestartHook.of_node(node_with(hook)) == hook
    assert hook.on_this_machine() and hook.process_alive()
    assert this_process().incarnation != hook.incarnation


def test_a_node_without_the_annotation_announces_nothing_and_a_malformed_one_is_an_error() -> None:
    assert RestartHook.of_node(node_with(None)) is None
    for text in (
        "{",
        "[]",
        '{"signal": "SIGHUP"}',
        RestartHook("SIGNOPE", 1, 1, "h", "b", "i", "t").to_json(),
    ):
        with pytest.raises(ValueError):
            RestartHook.of_node(node_with(text))


def test_a_reused_pid_is_not_the_announced_process() -> None:
    hook = this_process()
    assert process_start_ticks(hook.pid) == hook.start_ticks
    stale = RestartHook(hook.signal, hook.pid, hook.start_ticks + 1, hook.host, hook.boot_id, "x", "t")
    assert not stale.process_alive()
    assert process_start_ticks(2**22 + 12345) is None


class FakeCluster:
    """Just what ``restart_agent`` reads and writes."""

    def __init__(self, node: dict[str, Any], pods: list[dict[str, Any]] | None = None) -> None:
        self.node = node
        self.agent_pods = pods or []
        self.deleted: list[str] = []

    def pods(
        self, namespace: str | None = None, *, label_selector: str = "", field_selector: str = ""
    ) -> Any:
        return list(self.agent_pods)

    def delete_pod(self, namespace: str, name: str, grace_seconds: int | None = 0) -> None:
        self.deleted.append(name)
        self.agent_pods = [
            {
                "metadata": {"name": f"{name}-new", "uid": "uid-new"},
                "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]},
            }
        ]

    def read_node(self, name: str) -> dict[str, Any]:
        return self.node


OPTIONS = RunOptions(scheduler_name="s", profiles=("node",), supported_features=frozenset(), run_id="r")


def test_an_agent_that_runs_as_a_pod_is_restarted_through_its_daemonset() -> None:
    old = {"metadata": {"name": "agent-x", "uid": "uid-old"}, "status": {"phase": "Running"}}
    cluster = FakeCluster(node_with(None), [old])
    done = restart_agent(cluster, "n", OPTIONS)  # type: ignore[arg-type]
    assert cluster.deleted == ["agent-x"]
    assert done.how == "pod" and "uid-old" in done.before and "uid-new" in done.after


def test_with_no_pod_and_no_hook_the_restart_cannot_be_judged() -> None:
    with pytest.raises(AgentControlError, match="announces no restart hook"):
        restart_agent(FakeCluster(node_with(None)), "n", OPTIONS)  # type: ignore[arg-type]


def test_a_hook_of_another_machine_or_a_dead_process_is_never_signalled() -> None:
    hook = this_process()
    elsewhere = RestartHook(hook.signal, hook.pid, hook.start_ticks, "other-host", "other-boot", "i", "t")
    with pytest.raises(AgentControlError, match="only be sent from that machine"):
        restart_agent(FakeCluster(node_with(elsewhere)), "n", OPTIONS)  # type: ignore[arg-type]
    gone = RestartHook(hook.signal, hook.pid, hook.start_ticks + 1, hook.host, hook.boot_id, "i", "t")
    with pytest.raises(AgentControlError, match="no longer runs"):
        restart_agent(FakeCluster(node_with(gone)), "n", OPTIONS)  # type: ignore[arg-type]


def test_the_announced_process_gets_the_signal_and_the_new_incarnation_ends_the_restart(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        ticks = process_start_ticks(child.pid) or 0
        hook = RestartHook("SIGTERM", child.pid, ticks, this_process().host, restart.boot_id(), "first", "t")
        cluster = FakeCluster(node_with(hook))
        sent: list[int] = []
        real_kill = os.kill

        def kill(pid: int, sig: int) -> None:
            sent.append(sig)
            real_kill(pid, sig)
            renewed = RestartHook(
                hook.signal, hook.pid, hook.start_ticks, hook.host, hook.boot_id, "second", "t"
            )
            cluster.node = node_with(renewed)

        with monkeypatch.context() as patched:
            patched.setattr(localsignal.os, "kill", kill)
            done = restart_agent(cluster, "n", OPTIONS)  # type: ignore[arg-type]
        assert sent == [signal.SIGTERM] and done.how == "signal"
        assert "first" in done.before and "second" in done.after
    finally:
        child.kill()
        child.wait()

"""The runtime's hook link: Synchronize before anything else, again after the agent was lost or restarted."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from enforcement.hook import Adjustment, AgentUnavailable, ContainerRef, HookServer, RunningContainer
from enforcement.sim.testing import short_tempdir
from fixtures.sandbox.noderuntime.agentlink import AgentLink

REF = ContainerRef("ns", "p", "uid-1", "main")
POD = {
    "metadata": {"name": "p", "namespace": "ns", "uid": "uid-1"},
    "spec": {"containers": [{"name": "main"}]},
}


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def create_container(self, pod: Mapping[str, Any], container: str) -> Adjustment:
        self.calls.append(("create", container))
        return Adjustment(True)

    def stop_container(self, ref: ContainerRef, exit_code: int | None) -> None:
        self.calls.append(("stop", exit_code))

    def synchronize(self, running: list[RunningContainer]) -> None:
        self.calls.append(("sync", [r.ref.container for r in running]))


@pytest.fixture
def sock() -> Iterator[Path]:
    with short_tempdir("gnrl-") as directory:
        yield directory / "hook.sock"


def link_for(sock: Path, running: list[RunningContainer] | None = None) -> tuple[AgentLink, list[str]]:
    logs: list[str] = []
    return AgentLink(str(sock), lambda: list(running or []), logs.append, timeout_s=5), logs


def test_first_call_is_preceded_by_synchronize(sock: Path) -> None:
    agent = Recorder()
    with HookServer(sock, agent):
        link, _ = link_for(sock, [RunningContainer(REF, 42)])
        assert link.create_container(POD, "main").allowed
        link.create_container(POD, "main")
    assert agent.calls == [("sync", ["main"]), ("create", "main"), ("create", "main")]


def test_unreachable_agent_raises_and_is_synchronized_when_back(sock: Path) -> None:
    link, logs = link_for(sock)
    with pytest.raises(AgentUnavailable):
        link.create_container(POD, "main")
    assert not link.reachable and any("unreachable" in line for line in logs)
    back: list[bool] = []
    link.on_reachable = lambda: back.append(True)
    agent = Recorder()
    with HookServer(sock, agent):
        link.check()
        assert link.reachable and back == [True]
        link.create_container(POD, "main")
    assert agent.calls == [("sync", []), ("create", "main")]


def test_a_restarted_agent_is_noticed_by_its_new_socket(sock: Path) -> None:
    first, second = Recorder(), Recorder()
    link, logs = link_for(sock, [RunningContainer(REF, 42)])
    with HookServer(sock, first):
        link.check()
        link.check()  # same agent: nothing to do
    assert first.calls == [("sync", ["main"])]
    with HookServer(sock, second):
        link.check()
    assert second.calls == [("sync", ["main"])]
    assert any("restarted" in line for line in logs)


def test_stop_is_best_effort_and_forces_a_synchronize_later(sock: Path) -> None:
    agent = Recorder()
    link, _ = link_for(sock)
    with HookServer(sock, agent):
        link.check()
    link.stop_container(REF, 0)  # the agent is gone: no exception
    assert not link.reachable
    with HookServer(sock, agent):
        link.create_container(POD, "main")
    assert agent.calls == [("sync", []), ("sync", []), ("create", "main")]

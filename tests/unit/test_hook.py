"""The runtime <-> agent hook: typed calls over a Unix socket, and failure that never runs unfenced."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from enforcement.hook import (
    REASON_CONFIG_ERROR,
    Adjustment,
    AgentUnavailable,
    ContainerRef,
    HookClient,
    HookServer,
    RunningContainer,
)


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def create_container(self, pod: Mapping[str, Any], container: str) -> Adjustment:
        self.calls.append(("create", (pod["metadata"]["name"], container)))
        if container == "bad":
            return Adjustment(False, reason=REASON_CONFIG_ERROR, message="key x: rule y")
        if container == "boom":
            raise RuntimeError("handler bug")
        return Adjustment(True, env={"NVIDIA_GPU_MEMORY_LIMIT": "4096"})

    def stop_container(self, ref: ContainerRef, exit_code: int | None) -> None:
        self.calls.append(("stop", (ref, exit_code)))

    def synchronize(self, running: list[RunningContainer]) -> None:
        self.calls.append(("sync", running))


POD = {"metadata": {"name": "p", "namespace": "ns", "uid": "u1"}, "spec": {"containers": [{"name": "app"}]}}


def test_calls_round_trip(tmp_path: Path) -> None:
    handler = Recorder()
    with HookServer(tmp_path / "hook.sock", handler):
        client = HookClient(tmp_path / "hook.sock")
        adj = client.create_container(POD, "app")
        assert adj == Adjustment(True, env={"NVIDIA_GPU_MEMORY_LIMIT": "4096"})
        refused = client.create_container(POD, "bad")
        assert (
            not refused.allowed
            and refused.reason == REASON_CONFIG_ERROR
            and refused.message == "key x: rule y"
        )
        ref = ContainerRef("ns", "p", "u1", "app")
        client.stop_container(ref, 0)
        client.synchronize([RunningContainer(ref, 1234)])
    assert handler.calls == [
        ("create", ("p", "app")),
        ("create", ("p", "bad")),
        ("stop", (ref, 0)),
        ("sync", [RunningContainer(ref, 1234)]),
    ]
    assert not (tmp_path / "hook.sock").exists()


def test_socket_is_owner_only(tmp_path: Path) -> None:
    with HookServer(tmp_path / "hook.sock", Recorder()):
        assert (tmp_path / "hook.sock").stat().st_mode & 0o777 == 0o600


def test_agent_down_is_agent_unavailable(tmp_path: Path) -> None:
    with pytest.raises(AgentUnavailable, match="did not answer"):
        HookClient(tmp_path / "none.sock", timeout=1).create_container(POD, "app")


def test_handler_error_reaches_the_runtime_and_the_server_survives(tmp_path: Path) -> None:
    with HookServer(tmp_path / "hook.sock", Recorder()):
        client = HookClient(tmp_path / "hook.sock")
        with pytest.raises(AgentUnavailable, match="RuntimeError: handler bug"):
            client.create_container(POD, "boom")
        assert client.create_container(POD, "app").allowed


def test_stale_socket_file_of_a_killed_agent_is_replaced(tmp_path: Path) -> None:
    (tmp_path / "hook.sock").write_text("left behind")
    with HookServer(tmp_path / "hook.sock", Recorder()):
        assert HookClient(tmp_path / "hook.sock").create_container(POD, "app").allowed

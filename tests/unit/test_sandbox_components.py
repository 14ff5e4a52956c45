"""The control plane knows its components only as sources: checked first, asked for processes, in order."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from fixtures.sandbox import topology
from fixtures.sandbox.components import Component, ComponentSource, Host
from fixtures.sandbox.config import SandboxConfig
from fixtures.sandbox.controlplane import Sandbox
from fixtures.sandbox.errors import SandboxError
from fixtures.sandbox.noderuntime.component import SOURCE as NODE_RUNTIMES
from fixtures.sandbox.registry import default_sources
from fixtures.sandbox.scheduler.command import SOURCE as SCHEDULER_COMMANDS
from fixtures.sandbox.scheduler.component import SOURCE as SCHEDULERS


class Refuses:
    name = "refuses"

    def __init__(self) -> None:
        self.asked = 0

    def check(self, config: SandboxConfig, topo: topology.Topology) -> None:
        raise SandboxError(f"no, not with {len(topo.nodes())} nodes")

    def components(self, host: Host, topo: topology.Topology) -> list[Component]:
        self.asked += 1
        return []


class Echo:
    name = "echo"

    def check(self, config: SandboxConfig, topo: topology.Topology) -> None:
        pass

    def components(self, host: Host, topo: topology.Topology) -> list[Component]:
        return [Component(f"echo/{n.name}", ("echo", n.name)) for n in topo.nodes()]


def test_default_sources_are_schedulers_then_node_runtimes() -> None:
    assert default_sources() == (SCHEDULERS, SCHEDULER_COMMANDS, NODE_RUNTIMES)
    sources: tuple[ComponentSource, ...] = default_sources()  # all satisfy the protocol (mypy)
    assert [s.name for s in sources] == ["schedulers", "scheduler commands", "node runtime"]


def test_a_source_that_refuses_stops_up_before_anything_starts(tmp_path: Path) -> None:
    source = Refuses()
    box = Sandbox(SandboxConfig(state_dir=tmp_path / "sb"), sources=[source])
    with pytest.raises(SandboxError, match="no, not with 2 nodes"):
        box.up(log=lambda _m: None)
    assert not (tmp_path / "sb").exists() and source.asked == 0


def test_the_node_runtime_refuses_a_topology_too_large_for_it(tmp_path: Path) -> None:
    box = Sandbox(SandboxConfig(state_dir=tmp_path / "sb", topology="scale", node_runtime=True))
    with pytest.raises(SandboxError, match=r"64 nodes.*limited to 16 nodes: start it with --no-node-runtime"):
        box.up(log=lambda _m: None)
    assert not (tmp_path / "sb").exists()
    # Without the node runtime the same topology is fine for it.
    NODE_RUNTIMES.check(SandboxConfig(topology="scale"), topology.load("scale"))


def test_components_come_from_every_source_in_order(tmp_path: Path) -> None:
    box = Sandbox(SandboxConfig(state_dir=tmp_path / "sb"), sources=[Echo(), Refuses()])
    wanted = box._desired_components(topology.load("default"))
    assert [c.name for c in wanted] == ["echo/gpu-a-0", "echo/gpu-a-1"]


def test_sources_not_asked_for_give_nothing(tmp_path: Path) -> None:
    box = Sandbox(SandboxConfig(state_dir=tmp_path / "sb"))  # no scheduler, no node runtime
    topo = topology.load("default")
    assert SCHEDULERS.components(box, topo) == [] and NODE_RUNTIMES.components(box, topo) == []


def test_recorded_argv_reads_the_state_file(tmp_path: Path) -> None:
    box = Sandbox(SandboxConfig(state_dir=tmp_path))
    assert box.recorded_argv("scheduler/x") is None
    state: dict[str, Any] = {"processes": {"scheduler/x": {"argv": ["kube-scheduler", "--secure-port=4242"]}}}
    box.state_file.write_text(json.dumps(state))
    assert box.recorded_argv("scheduler/x") == ("kube-scheduler", "--secure-port=4242")
    assert box.recorded_argv("scheduler/y") is None
    box.state_file.write_text("{not json")
    assert box.recorded_argv("scheduler/x") is None


def test_reconcile_needs_a_running_sandbox(tmp_path: Path) -> None:
    box = Sandbox(SandboxConfig(state_dir=tmp_path / "sb"), sources=[Echo()])
    with pytest.raises(SandboxError, match=r"no running sandbox in .*sb"):
        box.reconcile(log=lambda _m: None)


def test_reconcile_changes_the_components_and_nothing_else(tmp_path: Path) -> None:
    """A running sandbox (its control plane recorded as this live process): reconcile starts the
    components wanted, stops one no longer wanted, and never asks the API server anything (``up``
    would put the Nodes back; a run may own one)."""
    import os

    from fixtures.sandbox import processes

    me = {
        "pid": os.getpid(),
        "start_ticks": processes.start_ticks(os.getpid()),
        "argv": ["python"],
        "log": str(tmp_path / "log"),
    }
    gone = {
        "name": "old/x",
        "pid": 2**22 + 1,
        "start_ticks": 1,
        "argv": ["old"],
        "log": str(tmp_path / "old"),
    }
    state = {
        "running": True,
        "processes": {
            **{name: {"name": name, **me} for name in ("etcd", "kube-apiserver", "kube-controller-manager")},
            "old/x": gone,
        },
    }
    box = Sandbox(SandboxConfig(state_dir=tmp_path / "sb"), sources=[Echo()])
    box.dir.mkdir(parents=True)
    box.state_file.write_text(json.dumps(state))
    said: list[str] = []

    def no_api(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("reconcile must not talk to the API server")

    box.core_v1 = no_api  # type: ignore[method-assign]
    box.api_client = no_api  # type: ignore[method-assign]
    box.reconcile(log=said.append)
    recorded = json.loads(box.state_file.read_text())["processes"]
    assert "old/x" not in recorded and {"echo/gpu-a-0", "echo/gpu-a-1"} <= set(recorded)
    assert recorded["echo/gpu-a-0"]["argv"] == ["echo", "gpu-a-0"]
    assert any("stopped old/x" in line for line in said)

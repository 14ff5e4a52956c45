"""The sandbox wiring of the node side: stable argv, the topology's GPUs, short socket paths, the token."""

from __future__ import annotations

import json
import socket
import stat
from pathlib import Path
from typing import Any

import pytest

from enforcement.sim import ADMIN_TOKEN_ENV
from fixtures.sandbox import topology
from fixtures.sandbox.config import SandboxConfig
from fixtures.sandbox.noderuntime import component as wiring
from fixtures.sandbox.noderuntime import rbac
from fixtures.sandbox.noderuntime.component import (
    MAX_SOCKET_PATH,
    NodeDirs,
    accepts,
    admin_token,
    components,
    gpu_file,
)


class StubSandbox:
    """A ``fixtures.sandbox.components.Host`` without an API server."""

    def __init__(self, directory: Path) -> None:
        self.config = SandboxConfig(state_dir=directory, node_runtime=True)
        self.dir = directory
        self.server = "https://127.0.0.1:1"
        self.ca_file = directory / "ca.crt"
        self.ca_file.write_text("ca")
        self.issued: list[tuple[str, str, tuple[str, ...]]] = []

    def recorded_argv(self, component: str) -> tuple[str, ...] | None:
        return None

    def issue_kubeconfig(self, name: str, user: str, groups: tuple[str, ...] = ()) -> Path:
        self.issued.append((name, user, groups))
        path = self.dir / f"{name}.kubeconfig"
        path.write_text("issued")
        return path

    def api_client(self, kubeconfig: Path | None = None) -> Any:
        return None


@pytest.fixture
def stub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> StubSandbox:
    monkeypatch.setattr(rbac, "ensure", lambda api, objects=None: None)
    monkeypatch.setattr(rbac, "ensure_agents", lambda api, users: None)
    monkeypatch.setattr(wiring, "agent_available", lambda: True)
    return StubSandbox(tmp_path)


def test_each_node_gets_device_agent_runtime_in_order(stub: StubSandbox) -> None:
    topo = topology.load("default")
    comps = components(stub, topo)
    assert [c.name for c in comps] == [
        f"{kind}/{node}" for node in ("gpu-a-0", "gpu-a-1") for kind in ("sim", "agent", "runtime")
    ]
    by_name = {c.name: c for c in comps}
    runtime = by_name["runtime/gpu-a-0"].argv
    assert runtime[1:3] == ("-m", "fixtures.sandbox.noderuntime")
    args = dict(zip(runtime[3::2], runtime[4::2], strict=True))
    dirs = NodeDirs.of(stub.dir, "gpu-a-0")
    assert args == {
        "--node": "gpu-a-0",
        "--kubeconfig": str(stub.dir / "runtime-gpu-a-0.kubeconfig"),
        "--hook-socket": str(dirs.hook),
        "--work-dir": str(dirs.work),
        "--sim-dir": str(dirs.sim),
        # the simulated device plugin gets the same GPU file as the device server
        "--gpus": args["--gpus"],
    }
    assert args["--gpus"] in by_name["sim/gpu-a-0"].argv
    agent = by_name["agent/gpu-a-0"].argv
    assert agent[1:3] == ("-m", "enforcement.agent") and "--backend" in agent and "sim" in agent
    assert ("runtime-gpu-a-0", "gpuconf:runtime:gpu-a-0", (rbac.RUNTIME_GROUP,)) in stub.issued
    assert ("agent-gpu-a-0", "gpuconf:agent:gpu-a-0", ()) in stub.issued
    # The device admin token reaches the device server and the agent, never an argv.
    token = (stub.dir / "nodes" / "sim-admin.token").read_text().strip()
    assert dict(by_name["sim/gpu-a-0"].env)[ADMIN_TOKEN_ENV] == token
    assert dict(by_name["agent/gpu-a-0"].env)[ADMIN_TOKEN_ENV] == token
    assert ADMIN_TOKEN_ENV not in dict(by_name["runtime/gpu-a-0"].env)
    assert all(token not in " ".join(c.argv) for c in comps)


def test_argv_is_stable_for_an_unchanged_sandbox(stub: StubSandbox) -> None:
    topo = topology.load("default")
    first = [c.argv for c in components(stub, topo)]
    issued = len(stub.issued)
    second = [c.argv for c in components(stub, topo)]
    assert first == second
    assert len(stub.issued) == issued * 2  # stub kubeconfigs never match the CA: reissued, same paths


def test_agent_is_skipped_with_a_warning_when_not_importable(
    stub: StubSandbox, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(wiring, "agent_available", lambda: False)
    names = [c.name for c in components(stub, topology.load("default"))]
    assert not [n for n in names if n.startswith("agent/")]
    assert "enforcement.agent is not importable" in capsys.readouterr().err


def test_gpu_file_has_the_nodes_uuids_and_its_name_follows_its_content(tmp_path: Path) -> None:
    spec = topology.load("default").nodes()[0]
    dirs = NodeDirs.of(tmp_path, spec.name)
    path = gpu_file(dirs, spec)
    data = json.loads(path.read_text())
    assert data["node"] == spec.name
    assert [g["uuid"] for g in data["gpus"]] == [topology.gpu_uuid(spec.name, i) for i in range(4)]
    assert {(g["memory_mib"], g["product"]) for g in data["gpus"]} == {(143771, "NVIDIA-H200")}
    assert gpu_file(dirs, spec) == path
    smaller = topology.NodeSpec(spec.name, spec.pool, spec.gpus[:2])
    assert gpu_file(dirs, smaller) != path


def test_sockets_move_to_a_short_path_when_the_sandbox_is_deep(tmp_path: Path) -> None:
    shallow = NodeDirs.of(Path("/s"), "gpu-a-0")
    assert shallow.hook == Path("/s/nodes/gpu-a-0/hook.sock") and shallow.sim == Path("/s/nodes/gpu-a-0/sim")
    deep_dir = tmp_path / ("d" * 80)
    deep = NodeDirs.of(deep_dir, "gpu-a-0")
    assert len(str(deep.sim / "admin.sock")) <= MAX_SOCKET_PATH and len(str(deep.hook)) <= MAX_SOCKET_PATH
    assert deep.work == deep_dir / "nodes" / "gpu-a-0" / "runtime"  # only sockets move
    assert NodeDirs.of(deep_dir, "gpu-a-0") == deep and NodeDirs.of(deep_dir, "gpu-a-1").hook != deep.hook


def test_admin_token_is_made_once_and_private(tmp_path: Path) -> None:
    token = admin_token(tmp_path)
    assert len(token) >= 32 and admin_token(tmp_path) == token
    assert stat.S_IMODE((tmp_path / "sim-admin.token").stat().st_mode) == 0o600


def test_accepts_tells_a_live_socket_from_a_stale_file(tmp_path: Path) -> None:
    path = tmp_path / "s.sock"
    assert not accepts(path)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    assert accepts(path)
    server.close()
    assert path.exists() and not accepts(path)


def test_agent_faults_reach_every_agent_or_one_nodes_and_the_hook_is_announced(stub: StubSandbox) -> None:
    from dataclasses import replace

    stub.config = replace(stub.config, agent_faults=("no-eviction", "gpu-a-1:fail-open"))
    by_name = {c.name: c for c in components(stub, topology.load("default"))}
    first, second = by_name["agent/gpu-a-0"].argv, by_name["agent/gpu-a-1"].argv
    assert "--announce-restart-hook" in first and "--announce-restart-hook" in second
    faults = [[argv[i + 1] for i, a in enumerate(argv) if a == "--fault"] for argv in (first, second)]
    assert faults == [["no-eviction"], ["fail-open", "no-eviction"]]


def test_an_earlier_agent_fault_name_reaches_the_agent_as_its_new_one(stub: StubSandbox) -> None:
    from dataclasses import replace

    from fixtures.sandbox.noderuntime.component import SOURCE

    stub.config = replace(
        stub.config, agent_faults=("no-release", "gpu-a-1:no-borrowing", "gpu-a-1:leak-on-exit")
    )
    SOURCE.check(stub.config, topology.load("default"))
    by_name = {c.name: c for c in components(stub, topology.load("default"))}
    argvs = (by_name["agent/gpu-a-0"].argv, by_name["agent/gpu-a-1"].argv)
    faults = [[argv[i + 1] for i, a in enumerate(argv) if a == "--fault"] for argv in argvs]
    assert faults == [["leak-on-exit"], ["leak-on-exit", "limit-from-request"]]


@pytest.mark.parametrize(
    ("entry", "message"), [("no-such", "unknown fault"), ("gpu-z-9:no-eviction", "no node 'gpu-z-9'")]
)
def test_an_unknown_agent_fault_or_node_is_refused_before_anything_starts(entry: str, message: str) -> None:
    from fixtures.sandbox.errors import SandboxError
    from fixtures.sandbox.noderuntime.component import SOURCE

    config = SandboxConfig(node_runtime=True, agent_faults=(entry,))
    with pytest.raises(SandboxError, match=message):
        SOURCE.check(config, topology.load("default"))

"""`up`, `down` and their failure paths, each on a sandbox of its own beside the shared one."""

from __future__ import annotations

import os
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from fixtures.sandbox import processes
from fixtures.sandbox.controlplane import Ports, Sandbox, SandboxConfig
from fixtures.sandbox.errors import SandboxError

pytestmark = pytest.mark.sandbox


@pytest.fixture
def own_sandbox(tmp_path: Path) -> Iterator[Sandbox]:
    box = Sandbox(SandboxConfig(state_dir=tmp_path / "sandbox", ports=Ports.free()))
    try:
        yield box
    finally:
        box.down()


def recorded(box: Sandbox) -> dict[str, processes.ProcessRecord]:
    import json

    state = json.loads(box.state_file.read_text())
    return {n: processes.ProcessRecord.from_json(r) for n, r in state["processes"].items()}


def assert_nothing_left(box: Sandbox, records: dict[str, processes.ProcessRecord], ports: Ports) -> None:
    for rec in records.values():
        assert not rec.alive(), f"{rec.name} (pid {rec.pid}) still runs"
    for what, port in ports.named().items():
        assert processes.port_free("127.0.0.1", port), f"{what} port {port} still taken"


def test_up_twice_reuses_and_down_leaves_nothing(own_sandbox: Sandbox) -> None:
    first = own_sandbox.up(log=print)
    assert not first.reused
    before = recorded(own_sandbox)
    assert set(before) == {"etcd", "kube-apiserver", "kube-controller-manager"}
    assert all(r.alive() for r in before.values())

    second = own_sandbox.up(log=print)
    assert second.reused
    assert {n: r.pid for n, r in recorded(own_sandbox).items()} == {n: r.pid for n, r in before.items()}
    assert own_sandbox.status().state == "running"

    stopped = own_sandbox.down()
    assert len(stopped) == 3
    assert_nothing_left(own_sandbox, before, own_sandbox.config.ports)
    assert not own_sandbox.dir.exists()
    assert own_sandbox.status().state == "absent"


def test_up_again_drops_its_own_unlisted_nodes_and_leaves_nodes_others_added(own_sandbox: Sandbox) -> None:
    from fixtures.sandbox.nodes import NODE_INFO

    own_sandbox.up(log=print)
    core = own_sandbox.core_v1()
    listed = {n.metadata.name for n in core.list_node().items}
    # What the suite's node-readiness check adds for a while: the simulated label, no runtime of ours.
    core.create_node({"metadata": {"name": "added-by-a-check", "labels": {"gpuconf.io/simulated": "true"}}})
    # What an earlier topology of this sandbox left: a Node that says it runs the sandbox's runtime.
    core.create_node({"metadata": {"name": "gpu-from-an-old-topology"}})
    core.patch_node_status("gpu-from-an-old-topology", {"status": {"nodeInfo": NODE_INFO}})

    own_sandbox.up(log=print)
    after = {n.metadata.name for n in core.list_node().items}
    assert after == listed | {"added-by-a-check"}


def test_down_keep_restarts_the_same_cluster(own_sandbox: Sandbox) -> None:
    own_sandbox.up(log=print)
    own_sandbox.core_v1().create_namespace({"metadata": {"name": "kept"}})
    own_sandbox.down(keep=True)
    assert own_sandbox.status().state == "stopped"
    own_sandbox.up(log=print)
    assert own_sandbox.core_v1().read_namespace("kept").status.phase == "Active"


def test_crashed_run_is_cleaned_and_replaced(own_sandbox: Sandbox) -> None:
    own_sandbox.up(log=print)
    old = recorded(own_sandbox)
    os.kill(old["kube-apiserver"].pid, signal.SIGKILL)  # a crash: etcd and the controller manager linger
    processes.stop(old["kube-apiserver"], grace=5)
    assert own_sandbox.status().state == "stale"

    messages: list[str] = []
    result = own_sandbox.up(log=messages.append)
    assert not result.reused
    assert any("did not shut down cleanly" in m for m in messages)
    assert all(not r.alive() for r in old.values()), "a process of the crashed run was left running"
    new = recorded(own_sandbox)
    assert all(r.alive() for r in new.values())
    assert {r.pid for r in new.values()}.isdisjoint({r.pid for r in old.values()})


def test_taken_port_is_a_clear_error(own_sandbox: Sandbox) -> None:
    with socket.socket() as squatter:
        squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        squatter.bind(("127.0.0.1", own_sandbox.config.ports.api))
        squatter.listen()
        with pytest.raises(SandboxError) as err:
            own_sandbox.up(log=print)
    message = str(err.value)
    assert f"127.0.0.1:{own_sandbox.config.ports.api} (kube-apiserver) is in use" in message
    assert f"pid {os.getpid()}" in message
    assert "--api-port" in message
    assert own_sandbox.status().state in ("absent", "stopped")

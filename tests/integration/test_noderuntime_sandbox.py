"""``node_runtime=True``: `up` starts a device server, agent and runtime per node; `down` leaves nothing.

A sandbox of its own (fresh ports, a pytest folder deep enough that the sockets must take the short
path under /tmp). Where the reference agent (``enforcement.agent``) is not importable yet, the
sandbox runs none, and the test serves an allow-all hook on the agent's socket path itself, so the
runtime's containers can start either way.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from enforcement.hook import Adjustment, ContainerRef, HookServer, RunningContainer
from enforcement.sim.admin import AdminClient
from fixtures.sandbox import processes
from fixtures.sandbox.controlplane import Ports, Sandbox, SandboxConfig
from fixtures.sandbox.noderuntime.component import NODES_DIR, TOKEN_FILE, NodeDirs, agent_available
from fixtures.sandbox.noderuntime.containers import container_processes
from fixtures.sandbox.noderuntime.runtime import RESTARTED_MESSAGE
from fixtures.sandbox.topology import gpu_uuid
from fixtures.suite.waiting import wait_until

pytestmark = pytest.mark.sandbox
WAIT_S = 90.0  # a node's processes start on a loaded 2-core runner

NODES = ("gpu-a-0", "gpu-a-1")


class AllowAll:
    def create_container(self, pod: Mapping[str, Any], container: str) -> Adjustment:
        return Adjustment(True)

    def stop_container(self, ref: ContainerRef, exit_code: int | None) -> None:
        pass

    def synchronize(self, running: list[RunningContainer]) -> None:
        pass


def records(box: Sandbox) -> dict[str, processes.ProcessRecord]:
    state = json.loads(box.state_file.read_text())
    return {n: processes.ProcessRecord.from_json(r) for n, r in state["processes"].items()}


@pytest.fixture
def box(tmp_path: Path) -> Iterator[Sandbox]:
    sandbox = Sandbox(SandboxConfig(state_dir=tmp_path / "sandbox", ports=Ports.free(), node_runtime=True))
    try:
        yield sandbox
    finally:
        sandbox.down()


def running_container(
    box: Sandbox, namespace: str, name: str, not_cid: str = ""
) -> tuple[dict[str, Any], str]:
    """The Pod once its container runs (a container other than ``not_cid``), and the container's id."""
    core = box.core_v1()

    def probe() -> dict[str, Any] | None:
        pod = json.loads(core.read_namespaced_pod(name, namespace, _preload_content=False).data)
        cs = (pod["status"].get("containerStatuses") or [{}])[0]
        fresh = not not_cid or not cs.get("containerID", "").endswith(not_cid)
        return pod if "running" in cs.get("state", {}) and fresh else None

    pod = wait_until(probe, f"{namespace}/{name} to run", timeout=WAIT_S)
    cid = pod["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
    wait_until(lambda: container_processes([cid]), "its process", timeout=WAIT_S)
    return pod, cid


def test_up_runs_the_node_side_and_down_leaves_no_process(box: Sandbox) -> None:
    box.up(log=print)
    wanted = {f"sim/{n}" for n in NODES} | {f"runtime/{n}" for n in NODES}
    if agent_available():
        wanted |= {f"agent/{n}" for n in NODES}
    first = records(box)
    assert wanted <= set(first)
    assert all(first[name].alive() for name in wanted)
    names = list(first)
    for node in NODES:  # each node's parts start in order: device, agent, runtime
        assert names.index(f"sim/{node}") < names.index(f"runtime/{node}")

    # The device server has exactly the topology's GPUs, under the Node's UUIDs.
    token = (box.dir / NODES_DIR / TOKEN_FILE).read_text().strip()
    assert oct((box.dir / NODES_DIR / TOKEN_FILE).stat().st_mode & 0o777) == "0o600"
    dirs = NodeDirs.of(box.dir, "gpu-a-0")
    assert len(str(dirs.sim / "admin.sock")) <= 107
    with AdminClient.from_dir(dirs.sim, token) as admin:
        gpus = admin.hello.gpus
    assert [g.uuid for g in gpus] == [gpu_uuid("gpu-a-0", i) for i in range(4)]
    assert {(g.product, g.memory_mib) for g in gpus} == {("NVIDIA-H200", 143771)}

    # A second `up` reuses everything: the argv of every component is stable.
    box.up(log=print)
    assert {n: r.pid for n, r in records(box).items()} == {n: r.pid for n, r in first.items()}

    hook = None if agent_available() else HookServer(dirs.hook, AllowAll()).start()
    try:
        core = box.core_v1()
        pod = {
            "metadata": {"name": "sleeper"},
            "spec": {
                "nodeName": "gpu-a-0",
                "containers": [
                    {"name": "main", "image": "busybox", "command": ["sh", "-c", "sleep 300 & sleep 300"]}
                ],
            },
        }
        core.create_namespaced_pod("default", pod)
        _, cid = running_container(box, "default", "sleeper")

        # A runtime killed outright takes its containers with it (the parent-death signal) ...
        runtime = records(box)["runtime/gpu-a-0"]
        main_pid = next(
            pid
            for pid in container_processes([cid])
            if Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"sh")
        )
        os.kill(runtime.pid, signal.SIGKILL)
        wait_until(
            lambda: main_pid not in container_processes([cid]),
            "the container to die with its runtime",
            timeout=WAIT_S,
        )
        # ... and the next `up` restarts the runtime: it reaps what escaped and restarts the container.
        box.up(log=print)
        assert records(box)["runtime/gpu-a-0"].pid != runtime.pid
        wait_until(
            lambda: not container_processes([cid]),
            "leftovers of the old container to be reaped",
            timeout=WAIT_S,
        )
        pod_now, new_cid = running_container(box, "default", "sleeper", not_cid=cid)
        cs = pod_now["status"]["containerStatuses"][0]
        assert new_cid != cid and cs["restartCount"] == 1
        assert cs["lastState"]["terminated"]["message"] == RESTARTED_MESSAGE

        every = records(box)
        box.down()
    finally:
        if hook is not None:
            hook.close()
    for rec in every.values():
        assert not rec.alive(), f"{rec.name} (pid {rec.pid}) survived down"
    assert not container_processes([new_cid]), "a container survived down"
    assert not container_processes(under=box.dir)
    assert not box.dir.exists()

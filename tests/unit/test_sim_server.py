"""The simulated device across real process boundaries: a server process and client processes.

Each test starts its own ``python -m enforcement.sim.server`` (about a quarter second) so that no
state leaks between tests; clients are separate Python processes running ``workloads.simclient``,
synchronised through their stdin/stdout pipes, never through sleeps.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from enforcement.sim import ADMIN_TOKEN_ENV, ADMIN_TOKEN_FILE_NAME
from enforcement.sim.admin import AdminClient, client_spec
from enforcement.sim.model import SimNode
from enforcement.sim.process import ServerProcess, ServerStartError
from enforcement.sim.server import DeviceServer
from enforcement.sim.testing import REPO_ROOT, SimNodeHarness, short_tempdir
from enforcement.sim.topology import gpu_uuid, make_gpus
from fixtures.suite.waiting import wait_until
from workloads.simclient import DeviceClient
from workloads.simwire import (
    MiB,
    SimDenied,
    SimGone,
    SimModeConflict,
)

WAIT_S = 60.0  # every wait on another process; generous for a loaded 2-core runner

# A scripted client process: runs the JSON command list in argv[1], one JSON line per command on
# stdout. "wait" blocks until the test writes a line on stdin: that is how tests sequence processes.
CLIENT_SCRIPT = r"""
import json, os, sys, time
from workloads.simclient import DeviceClient
from workloads import simwire

socket_path, token, commands = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
client = DeviceClient(socket_path, token)

def emit(**kw):
    print(json.dumps(kw), flush=True)

for cmd in commands:
    op = cmd["op"]
    try:
        if op == "alloc":
            emit(op=op, handle=client.alloc(cmd.get("device", 0), cmd["bytes"]).handle)
        elif op == "fill":  # 1 MiB at a time until refused
            n = 0
            while True:
                try:
                    client.alloc(0, 1 << 20)
                    n += 1
                except (simwire.SimOutOfMemory, simwire.SimPressure) as exc:
                    emit(op=op, mib=n, refused=type(exc).__name__, reason=getattr(exc.reply, "reason", None))
                    break
        elif op == "free":
            emit(op=op, used=client.free(cmd["handle"]).used_bytes)
        elif op == "meminfo":
            emit(op=op, used=[d.used_bytes for d in client.meminfo().devices])
        elif op == "kernels":
            spans = []
            for _ in range(cmd["count"]):
                r = client.kernel(0, cmd["seconds"])
                spans.append([r.start, r.end])
            emit(op=op, spans=spans)
        elif op == "fault":
            emit(op=op, message=client.fault(0).message)
        elif op == "wait":
            emit(op=op, pid=os.getpid())
            sys.stdin.readline()
        elif op == "fork":
            pid = os.fork()
            if pid == 0:
                client.alloc(0, cmd["bytes"])  # in the child: a context of its own
                os._exit(0)
            os.waitpid(pid, 0)
            emit(op=op)
        elif op == "die":
            os._exit(9)
    except simwire.SimError as exc:
        emit(op=op, error=type(exc).__name__, message=str(exc), reply=exc.reply.TYPE)
"""


class ClientProcess:
    def __init__(self, socket_path: str, token: str, commands: list[dict[str, Any]]) -> None:
        env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CLIENT_SCRIPT, socket_path, token, json.dumps(commands)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=str(REPO_ROOT),
        )

    def read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()  # blocks until the client reports; the test's timeout guards it
        if not line:
            raise AssertionError(
                f"client process ended early: {self.proc.stderr.read() if self.proc.stderr else ''}"
            )
        return json.loads(line)

    def go(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def finish(self) -> int:
        if self.proc.stdin:
            self.proc.stdin.close()
        try:
            return self.proc.wait(WAIT_S)
        finally:
            for f in (self.proc.stdout, self.proc.stderr):
                if f:
                    f.close()


@pytest.fixture
def harness() -> Iterator[SimNodeHarness]:
    with SimNodeHarness.running(gpus="2x1024") as h:
        yield h


def attach(h: SimNodeHarness, name: str, guarantee: int, hard: int | None = None, **kw: Any) -> str:
    return h.admin.attach(client_spec(name, kw.pop("gpus", ["0"]), guarantee, hard, **kw)).token


def spawn(h: SimNodeHarness, token: str, commands: list[dict[str, Any]]) -> ClientProcess:
    return ClientProcess(h.server.client_socket, token, commands)


def usage(h: SimNodeHarness) -> dict[str, int]:
    return {c.name: c.gpus[0].used_bytes for c in h.admin.snapshot().clients}


# ---- the server process


def test_the_ready_line_names_sockets_and_stable_gpu_uuids(harness: SimNodeHarness) -> None:
    ready = harness.server.ready
    assert ready["event"] == "ready" and ready["simulated"] is True
    assert [g["uuid"] for g in ready["gpus"]] == [gpu_uuid("sim-node-0", 0), gpu_uuid("sim-node-0", 1)]
    assert stat.S_IMODE(os.stat(harness.server.admin_socket).st_mode) == 0o600
    assert stat.S_IMODE(os.stat(harness.server.client_socket).st_mode) == 0o666
    assert ready["admin_token_file"] is None  # the token came by env: nothing on disk


def test_sigterm_stops_the_server_and_removes_its_sockets() -> None:
    with short_tempdir() as d:
        server = ServerProcess.start(d, node="n", gpus="1x64")
        assert server.stop() == 0
        assert not os.path.exists(server.client_socket) and not os.path.exists(server.admin_socket)


def test_a_second_server_on_the_same_directory_is_refused_and_a_stale_socket_is_cleared() -> None:
    with short_tempdir() as d:
        with ServerProcess.start(d, node="n", gpus="1x64"):
            with pytest.raises(ServerStartError, match="already listening"):
                ServerProcess.start(d, node="n", gpus="1x64")
        stale = socket.socket(socket.AF_UNIX)
        stale.bind(str(d / "client.sock"))  # bound, never listening: what a crashed server leaves
        stale.close()
        with ServerProcess.start(d, node="n", gpus="1x64") as again:
            assert again.proc.poll() is None


def test_bad_arguments_exit_2_with_a_message() -> None:
    for args in (["--node", "n", "--gpus", "two"], ["--node", "n"], ["--gpus", "1x1"]):
        proc = subprocess.run(
            [sys.executable, "-m", "enforcement.sim.server", "--socket-dir", "/tmp/unused-gsim", *args],
            capture_output=True,
            text=True,
            cwd=str(REPO_ROOT),
            timeout=WAIT_S,
        )
        assert proc.returncode == 2, proc.stderr
        assert "simdevice:" in proc.stderr


def test_a_topology_file_describes_the_node() -> None:
    with short_tempdir() as d:
        topo = d / "topo.json"
        topo.write_text(
            json.dumps({"node": "gpu-7", "gpus": [{"memory_mib": 100}, {"memory_mib": 200, "product": "X"}]})
        )
        with ServerProcess.start(d, topology=topo) as server:
            gpus = server.ready["gpus"]
            assert server.ready["node"] == "gpu-7"
            assert [(g["memory_mib"], g["product"]) for g in gpus] == [
                (100, "NVIDIA H100 80GB HBM3"),
                (200, "X"),
            ]


def test_without_a_token_from_env_the_server_writes_one_readable_only_by_its_owner() -> None:
    with short_tempdir() as d:
        server = DeviceServer(SimNode("n", make_gpus("n", [64])), d)
        with server:
            token_file = d / ADMIN_TOKEN_FILE_NAME
            assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
            env = {k: v for k, v in os.environ.items() if k != ADMIN_TOKEN_ENV}
            os.environ.pop(ADMIN_TOKEN_ENV, None)
            try:
                with AdminClient.from_dir(d) as admin:
                    assert admin.hello.node == "n"
            finally:
                os.environ.clear()
                os.environ.update(env)
        assert not token_file.exists()


# ---- memory across several client processes


def test_concurrent_client_processes_share_a_gpu_without_breaking_any_limit(harness: SimNodeHarness) -> None:
    names = [f"ns/p{i}/c" for i in range(4)]
    # Hard limits add up to 2048 MiB on a 1024 MiB GPU; guarantees (4 x 128) fit.
    clients = [spawn(harness, attach(harness, n, 128, 512), [{"op": "fill"}, {"op": "wait"}]) for n in names]
    try:
        reports = [c.read() for c in clients]
        for c in clients:
            c.read()  # each is now waiting, still holding its memory
        granted = [r["mib"] for r in reports]
        assert all(g <= 512 for g in granted)
        assert sum(granted) == 1024  # the GPU filled exactly, never beyond
        assert {r["refused"] for r in reports} <= {"SimOutOfMemory", "SimPressure"}
        held = usage(harness)
        assert sorted(held.values()) == sorted(g * MiB for g in granted)
        assert harness.admin.snapshot().gpus[0].used_bytes == 1024 * MiB
    finally:
        for c in clients:
            c.finish()
    wait_until(
        lambda: harness.admin.snapshot().gpus[0].used_bytes == 0,
        "the exited clients' memory is released",
        timeout=WAIT_S,
    )


def test_a_client_process_that_dies_without_freeing_gets_its_memory_released(harness: SimNodeHarness) -> None:
    token = attach(harness, "ns/dies/c", 512)
    client = spawn(harness, token, [{"op": "alloc", "bytes": 300 * MiB}, {"op": "wait"}])
    client.read()
    pid = client.read()["pid"]
    snap = harness.admin.snapshot().clients[0]
    assert snap.gpus[0].used_bytes == 300 * MiB and pid in snap.pids
    client.proc.kill()  # SIGKILL: no chance to free or close anything
    client.finish()
    wait_until(
        lambda: usage(harness)["ns/dies/c"] == 0, "the killed client's memory is released", timeout=WAIT_S
    )
    assert harness.admin.snapshot().clients[0].contexts == 0  # still attached: the container may restart


def test_a_forked_child_gets_its_own_context_and_its_memory_goes_with_it(harness: SimNodeHarness) -> None:
    token = attach(harness, "ns/forks/c", 512)
    client = spawn(
        harness,
        token,
        [
            {"op": "alloc", "bytes": 10 * MiB},
            {"op": "fork", "bytes": 20 * MiB},
            {"op": "wait"},
            {"op": "meminfo"},
        ],
    )
    try:
        client.read()
        client.read()
        client.read()
        wait_until(
            lambda: usage(harness)["ns/forks/c"] == 10 * MiB,
            "the child's context is released",
            timeout=WAIT_S,
        )
        # The parent asks only now: the server sees the child's connection close on its own time, so a
        # meminfo sent straight after the fork could still count the child's 20 MiB (seen under load).
        client.go()
        assert client.read()["used"] == [10 * MiB]  # the parent's connection was never disturbed
    finally:
        client.finish()


# ---- tokens and the admin boundary


def test_a_client_cannot_free_another_clients_memory_even_with_its_handle(harness: SimNodeHarness) -> None:
    victim = spawn(
        harness, attach(harness, "victim", 512), [{"op": "alloc", "bytes": 100 * MiB}, {"op": "wait"}]
    )
    try:
        handle = victim.read()["handle"]
        victim.read()
        thief = spawn(harness, attach(harness, "thief", 512), [{"op": "free", "handle": handle}])
        report = thief.read()
        thief.finish()
        assert report["reply"] == "bad-request"
        assert usage(harness)["victim"] == 100 * MiB
    finally:
        victim.finish()


def test_an_unknown_token_is_denied(harness: SimNodeHarness) -> None:
    with pytest.raises(SimDenied, match="unknown client token"):
        DeviceClient(harness.server.client_socket, "f" * 32)


def test_admin_operations_are_refused_with_a_client_token(harness: SimNodeHarness) -> None:
    token = attach(harness, "ns/a/c", 128)
    with pytest.raises(SimDenied, match="admin token"):
        AdminClient(harness.server.admin_socket, token)
    # On the client socket, after a valid hello, an admin request is not served at all.
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(WAIT_S)
        s.connect(harness.server.client_socket)
        f = s.makefile("rwb")
        for request in (
            {"type": "hello", "token": token},
            {"type": "detach", "client": "ns/a/c"},
            {"type": "snapshot"},
            {
                "type": "attach",
                "spec": {"name": "x", "gpus": [{"gpu": "0", "hard_limit_mib": 1, "guarantee_mib": 1}]},
            },
        ):
            f.write(json.dumps(request).encode() + b"\n")
            f.flush()
            reply = json.loads(f.readline())
            if request["type"] != "hello":
                assert reply["type"] == "denied", reply
                assert "admin socket" in reply["message"]
    assert [c.name for c in harness.admin.snapshot().clients] == ["ns/a/c"]


def test_the_first_request_on_a_client_connection_must_be_hello(harness: SimNodeHarness) -> None:
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(WAIT_S)
        s.connect(harness.server.client_socket)
        f = s.makefile("rwb")
        f.write(b'{"type": "alloc", "device": 0, "nbytes": 1}\n')
        f.flush()
        assert json.loads(f.readline())["type"] == "denied"
        assert f.readline() == b""  # and the server hung up


def test_malformed_requests_get_a_bad_request_reply_and_the_connection_survives(
    harness: SimNodeHarness,
) -> None:
    token = attach(harness, "ns/a/c", 128)
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(WAIT_S)
        s.connect(harness.server.client_socket)
        f = s.makefile("rwb")

        def ask(raw: bytes) -> dict[str, Any]:
            f.write(raw + b"\n")
            f.flush()
            return json.loads(f.readline())

        assert ask(json.dumps({"type": "hello", "token": token}).encode())["type"] == "hello-reply"
        assert ask(b"not json")["type"] == "bad-request"
        bad = ask(b'{"type": "alloc", "device": 0, "nbytes": "1Gi"}')
        assert bad["type"] == "bad-request" and "alloc.nbytes" in bad["message"]
        assert ask(b'{"type": "alloc", "device": 0, "nbytes": 1, "extra": 1}')["type"] == "bad-request"
        assert ask(b'{"type": "alloc", "device": 0, "nbytes": 1048576}')["type"] == "alloc-reply"


def test_mode_refusal_over_the_admin_socket_names_both_clients(harness: SimNodeHarness) -> None:
    attach(harness, "ns/ts/c", 128, mode="time-slicing")
    with pytest.raises(SimModeConflict) as exc:
        attach(harness, "ns/sm/c", 128, mode="sm-sharing")
    assert "ns/ts/c" in str(exc.value) and "ns/sm/c" in str(exc.value)
    attach(harness, "ns/sm/c", 128, mode="sm-sharing", gpus=["1"])


def test_a_restarted_agent_re_adopts_clients_from_the_snapshot(harness: SimNodeHarness) -> None:
    token = attach(harness, "ns/p/c", 256, 512, labels={"pod-uid": "uid-1"})
    client = spawn(harness, token, [{"op": "alloc", "bytes": 400 * MiB}, {"op": "wait"}, {"op": "meminfo"}])
    try:
        client.read()
        pid = client.read()["pid"]
        harness.admin.close()  # the agent goes away; the device server keeps running
        with AdminClient(harness.server.admin_socket, harness.server.admin_token) as agent:
            (state,) = agent.snapshot().clients
            assert (state.name, state.labels, state.pids) == ("ns/p/c", {"pod-uid": "uid-1"}, (pid,))
            assert state.gpus[0].used_bytes == 400 * MiB and state.gpus[0].guarantee_bytes == 256 * MiB
            assert agent.evict("ns/p/c").released_bytes == 400 * MiB
        client.go()
        report = client.read()
        assert report["reply"] == "gone" and "evicted" in report["message"]
    finally:
        client.finish()
        harness.admin = harness.server.admin()


def test_pressure_over_the_admin_socket_and_eviction_let_the_guaranteed_client_in(
    harness: SimNodeHarness,
) -> None:
    borrower = spawn(harness, attach(harness, "borrower", 256, 1024), [{"op": "fill"}, {"op": "wait"}])
    guaranteed = ClientProcess(
        harness.server.client_socket,
        attach(harness, "guaranteed", 512),
        [
            {"op": "wait"},
            {"op": "alloc", "bytes": 512 * MiB},
            {"op": "wait"},
            {"op": "alloc", "bytes": 512 * MiB},
        ],
    )
    try:
        guaranteed.read()  # connected, allocating nothing until the borrower has filled the GPU
        assert borrower.read()["mib"] == 1024
        guaranteed.go()
        refused = guaranteed.read()
        assert refused["reply"] == "pressure" and "borrower" in refused["message"]
        (gpu0, _gpu1) = harness.admin.pressure()
        assert gpu0.under_pressure and [c.client for c in gpu0.candidates] == ["borrower"]
        harness.admin.evict("borrower")
        guaranteed.read()
        guaranteed.go()
        assert "handle" in guaranteed.read()
    finally:
        borrower.finish()
        guaranteed.finish()


# ---- compute across processes


def _kernel_spans(harness: SimNodeHarness, mode: str, seconds: float, count: int) -> list[list[list[float]]]:
    clients = [
        spawn(
            harness,
            attach(harness, f"k{i}", 64, mode=mode),
            [{"op": "wait"}, {"op": "kernels", "count": count, "seconds": seconds}],
        )
        for i in range(2)
    ]
    try:
        for c in clients:
            c.read()  # both connected and waiting
        for c in clients:
            c.go()
        return [c.read()["spans"] for c in clients]
    finally:
        for c in clients:
            c.finish()


def _overlap(a: list[list[float]], b: list[list[float]]) -> float:
    return sum(max(0.0, min(e1, e2) - max(s1, s2)) for s1, e1 in a for s2, e2 in b)


def test_time_slicing_serialises_kernels_of_client_processes(harness: SimNodeHarness) -> None:
    a, b = _kernel_spans(harness, "time-slicing", 0.05, 8)
    assert _overlap(a, b) == 0.0


def test_sm_sharing_runs_kernels_of_client_processes_concurrently(harness: SimNodeHarness) -> None:
    a, b = _kernel_spans(harness, "sm-sharing", 0.1, 6)
    # 0.6 s each; launched within a pipe write of each other, they overlap for most of it.
    assert _overlap(a, b) > 0.2


# ---- fault domains across processes


def _fault_neighbour(harness: SimNodeHarness, mode: str) -> dict[str, Any]:
    neighbour = spawn(
        harness, attach(harness, "neighbour", 64, mode=mode), [{"op": "wait"}, {"op": "meminfo"}]
    )
    try:
        neighbour.read()
        faulter = spawn(
            harness, attach(harness, "faulter", 64, mode=mode), [{"op": "fault"}, {"op": "meminfo"}]
        )
        assert "illegal memory access" in faulter.read()["message"]
        assert faulter.read()["reply"] == "fault"  # sticky for the faulting client
        faulter.finish()
        neighbour.go()
        return neighbour.read()
    finally:
        neighbour.finish()


def test_a_fault_in_sm_sharing_fails_the_neighbour_process(harness: SimNodeHarness) -> None:
    report = _fault_neighbour(harness, "sm-sharing")
    assert report["reply"] == "fault" and "faulter" in report["message"]


def test_a_fault_in_time_slicing_leaves_the_neighbour_process_alone(harness: SimNodeHarness) -> None:
    report = _fault_neighbour(harness, "time-slicing")
    assert report == {"op": "meminfo", "used": [0]}


def test_detach_tells_a_running_client_it_is_gone(harness: SimNodeHarness) -> None:
    token = attach(harness, "ns/a/c", 64)
    client = DeviceClient(harness.server.client_socket, token)
    try:
        harness.admin.detach("ns/a/c")
        with pytest.raises(SimGone) as exc:
            client.meminfo()
        assert exc.value.reply.reason == "stopped"
    finally:
        client.close()


def test_the_socket_dir_must_be_short_enough_for_unix_sockets(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="longer than"):
        DeviceServer(SimNode("n", make_gpus("n", [64])), tmp_path / ("x" * 120))

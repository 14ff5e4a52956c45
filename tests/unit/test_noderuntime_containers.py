"""Simulated containers are local processes that cannot outlive their container or their runtime."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fixtures.sandbox.noderuntime import CONTAINER_ID_ENV
from fixtures.sandbox.noderuntime.containers import (
    LaunchError,
    LaunchSpec,
    container_processes,
    launch,
    reap_leftovers,
    wait_group_gone,
)
from fixtures.sandbox.noderuntime.layout import containers_dir
from fixtures.suite.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 30.0


def spec(tmp_path: Path, *argv: str) -> LaunchSpec:
    cid = secrets.token_hex(16)
    run = tmp_path / cid
    env = {"PATH": "/usr/bin:/bin", "HOME": str(run), CONTAINER_ID_ENV: cid}
    return LaunchSpec(cid, argv, env, run, tmp_path / f"{cid}.log")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state != "Z"


def test_exit_is_reported_and_the_log_kept(tmp_path: Path) -> None:
    c = launch(spec(tmp_path, "sh", "-c", "echo out; echo err >&2; exit 3"), tmp_path)
    assert c.exited.wait(30)
    assert c.exit is not None and c.exit.returncode == 3
    assert c.spec.log.read_text() == "out\nerr\n"
    assert not list(containers_dir(tmp_path).glob("*.json"))  # the crash record goes with it


def test_what_a_container_forked_dies_with_it(tmp_path: Path) -> None:
    s = spec(tmp_path, "sh", "-c", "sleep 300 & echo $! > child.pid; exit 0")
    c = launch(s, tmp_path)
    assert c.exited.wait(30)
    child = int((s.cwd / "child.pid").read_text())
    wait_until(
        lambda: not alive(child), "the background child to be killed with its container", timeout=WAIT_S
    )
    assert not container_processes([s.container_id])


def test_stop_gives_sigterm_then_sigkill(tmp_path: Path) -> None:
    polite = launch(spec(tmp_path, "sleep", "300"), tmp_path)
    assert polite.stop(10).returncode == -signal.SIGTERM
    stubborn_spec = spec(tmp_path, "sh", "-c", "trap '' TERM; echo ready; while :; do sleep 0.1; done")
    stubborn = launch(stubborn_spec, tmp_path)
    wait_until(lambda: "ready" in stubborn_spec.log.read_text(), "the TERM trap", timeout=WAIT_S)
    started = time.monotonic()
    assert stubborn.stop(0.5).returncode == -signal.SIGKILL
    assert time.monotonic() - started >= 0.5
    assert not container_processes([stubborn_spec.container_id])


def test_an_exit_waits_for_the_group_to_be_gone_and_gives_up_when_bounded() -> None:
    # A group whose process still runs is not gone; the bound returns instead of hanging the runtime.
    proc = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        assert not wait_group_gone(proc.pid, 0.05)
    finally:
        proc.kill()
    os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOWAIT)  # a zombie leader is not "alive"
    assert wait_group_gone(proc.pid, 5.0)
    proc.wait()


def test_on_exit_runs_once_even_when_registered_late(tmp_path: Path) -> None:
    c = launch(spec(tmp_path, "true"), tmp_path)
    assert c.exited.wait(30)
    seen: list[int] = []
    c.on_exit(lambda done: seen.append(done.pid))
    assert seen == [c.pid]


def test_a_command_that_cannot_run_is_a_launch_error(tmp_path: Path) -> None:
    with pytest.raises(LaunchError, match="no-such-command-here"):
        launch(spec(tmp_path, "no-such-command-here"), tmp_path)


RUNTIME_STAND_IN = """
import sys, time
from pathlib import Path
from fixtures.sandbox.noderuntime.containers import LaunchSpec, launch
work, cid = Path(sys.argv[1]), sys.argv[2]
env = {"PATH": "/usr/bin:/bin", "HOME": str(work / cid), "GPUCONF_SIM_CONTAINER_ID": cid}
c = launch(LaunchSpec(cid, ("sh", "-c", "sleep 300 & sleep 300"), env, work / cid, work / "c.log"), work)
print(c.pid, flush=True)
time.sleep(300)
"""


def test_containers_die_with_a_killed_runtime_and_leftovers_are_reaped(tmp_path: Path) -> None:
    cid = secrets.token_hex(16)
    runtime = subprocess.Popen(
        [sys.executable, "-c", RUNTIME_STAND_IN, str(tmp_path), cid],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    try:
        assert runtime.stdout is not None
        pid = int(runtime.stdout.readline())
        wait_until(
            lambda: len(container_processes([cid])) >= 2, "the container and its child", timeout=WAIT_S
        )
        runtime.kill()  # SIGKILL: no handler runs, only the kernel's parent-death signal
        runtime.wait()
        wait_until(
            lambda: not alive(pid), "the container's main process to die with the runtime", timeout=WAIT_S
        )
        # Its background child escaped the parent-death signal; the next runtime reaps it by record.
        assert container_processes([cid]) and pid not in container_processes([cid])
        assert reap_leftovers(tmp_path, lambda _m: None)
        wait_until(lambda: not container_processes([cid]), "the leftover to be killed", timeout=WAIT_S)
        assert not list(containers_dir(tmp_path).glob("*.json"))
    finally:
        if runtime.poll() is None:
            runtime.kill()
        for leftover in container_processes([cid]):
            os.kill(leftover, signal.SIGKILL)


def test_container_processes_filters_by_directory(tmp_path: Path) -> None:
    s = spec(tmp_path, "sleep", "300")
    c = launch(s, tmp_path)
    try:
        wait_until(lambda: container_processes([s.container_id]), "the container", timeout=WAIT_S)
        assert container_processes(under=tmp_path) == {c.pid: s.container_id}
        assert not container_processes(under=tmp_path / "elsewhere")
    finally:
        c.stop(5)


def test_a_container_does_not_inherit_an_ignored_sigterm(tmp_path: Path) -> None:
    # The launching process may ignore SIGTERM (a workload run in-process ignores it while it writes
    # its result); the container must start with the default action, as a real runtime starts it.
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        container = launch(spec(tmp_path, "sleep", "300"), tmp_path)
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert container.stop(10).returncode == -signal.SIGTERM

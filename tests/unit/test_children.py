"""``stop_child``: a child that stops on SIGTERM keeps its own exit code; one that ignores it is killed."""

from __future__ import annotations

import signal
import subprocess
import sys

from enforcement.children import stop_child


def _child(code: str) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"up\n"  # its handlers are in place before it is stopped
    proc.stdout.close()
    return proc


def test_a_child_that_honours_sigterm_ends_with_its_own_code() -> None:
    proc = _child(
        "import signal, sys, time\n"
        "signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))\n"
        "print('up', flush=True)\n"
        "time.sleep(60)\n"
    )
    assert stop_child(proc, 10) == 7


def test_a_child_that_ignores_sigterm_is_killed_after_the_timeout() -> None:
    proc = _child(
        "import signal, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('up', flush=True)\n"
        "time.sleep(60)\n"
    )
    assert stop_child(proc, 0.3) == -signal.SIGKILL
    assert proc.poll() is not None  # reaped


def test_a_child_that_already_ended_is_left_as_it_is() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    proc.wait()
    assert stop_child(proc, 1) == 3

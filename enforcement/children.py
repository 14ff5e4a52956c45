"""Ending a child process: ask it to stop, give it time, then kill it.

The simulated device server, the agent under test, containerd and the probe's workloads are all
ended this way; a child that ignores SIGTERM (or is wedged) must not hang the caller, and a killed
one is still reaped so it never lingers as a zombie holding its ports or files.
"""

from __future__ import annotations

import subprocess


def stop_child(proc: subprocess.Popen[bytes] | subprocess.Popen[str], timeout_s: float) -> int:
    """SIGTERM ``proc``, wait up to ``timeout_s`` for it, then SIGKILL it; its exit code."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode

"""The allocation workload as a child process: ``python -m workloads.allocate`` on a plan.

What a node runtime does for a Pod's container, minus the container: start the workload with an
environment (the one the node agent returned, or a simulated device's), read its stdout line by
line on a thread so that a caller can wait for a progress line with a timeout, and read its
result (the last stdout line, and the termination message file) when it ends. Used by ``gpuconf
probe`` and by gpuconf's own tests; a caller that runs no Pods runs workloads through this.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

REPO_ROOT = Path(__file__).resolve().parents[1]
WORKLOAD_TIMEOUT_S = 120.0  # a cold interpreter on a loaded 2-core runner takes seconds, not minutes


@dataclass(frozen=True)
class WorkloadRun:
    exit_code: int
    result: dict[str, Any]  # the last stdout line, parsed
    stdout: str
    stderr: str
    termination_message: str | None

    @property
    def steps(self) -> list[dict[str, Any]]:
        return list(self.result.get("steps", []))


class WorkloadProcess:
    """A running ``python -m workloads.allocate``, its stdout read by a thread so tests can wait on lines.

    Waiting for a progress line ("holding ...", "heartbeat 1 ...") is how tests sequence workloads
    against each other; a thread does the reading so that a wait has a timeout and a silent workload
    cannot hang the test. Every one started is remembered until ``kill_leftovers``: a test that fails
    half-way must not leave a workload holding simulated memory (or running at all) after it.
    """

    _started: ClassVar[list[subprocess.Popen[str]]] = []

    def __init__(
        self,
        plan: Mapping[str, Any] | list[Any] | str,
        env: Mapping[str, str],
        termination_path: str | Path,
        *,
        extra_args: tuple[str, ...] = (),
        python: str = sys.executable,
        python_flags: tuple[str, ...] = (),
        cwd: str | Path | None = None,
    ) -> None:
        self.termination_path = Path(termination_path)
        run_env = dict(env)
        run_env["GPUCONF_TERMINATION_PATH"] = str(termination_path)
        plan_text = plan if isinstance(plan, str) else json.dumps(plan)
        self.proc = subprocess.Popen(
            [python, *python_flags, "-m", "workloads.allocate", "--plan", plan_text, *extra_args],
            env=run_env,
            cwd=str(cwd or REPO_ROOT),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        WorkloadProcess._started.append(self.proc)
        self._lines: list[str] = []
        self._cond = threading.Condition()
        self._eof = False
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.proc.pid

    @classmethod
    def kill_leftovers(cls) -> int:
        """Kill every workload started here that still runs; returns how many there were."""
        left = [p for p in cls._started if p.poll() is None]
        for proc in left:
            proc.kill()
        for proc in left:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        cls._started.clear()
        return len(left)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cond:
                self._lines.append(line)
                self._cond.notify_all()
        with self._cond:
            self._eof = True
            self._cond.notify_all()

    def output(self) -> str:
        """Everything printed so far."""
        with self._cond:
            return "".join(self._lines)

    def wait_for(
        self, text: str, timeout: float = WORKLOAD_TIMEOUT_S, *, or_exit: bool = False
    ) -> str | None:
        """Block until a stdout line containing ``text`` appears; return it.

        With ``or_exit``, the workload ending first is an answer too (None) rather than a failure.
        """
        deadline = time.monotonic() + timeout
        seen = 0
        with self._cond:
            while True:
                for line in self._lines[seen:]:
                    if text in line:
                        return line
                seen = max(seen, len(self._lines))
                if self._eof and or_exit:
                    return None
                left = deadline - time.monotonic()
                if self._eof or left <= 0:
                    raise AssertionError(
                        f"workload never printed {text!r} ({'exited' if self._eof else 'timed out'}):\n"
                        + "".join(self._lines)
                    )
                self._cond.wait(left)

    def finish(self, timeout: float = WORKLOAD_TIMEOUT_S) -> WorkloadRun:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(
                f"workload did not finish in {timeout:g}s:\n{''.join(self._lines)}"
            ) from None
        self._reader.join(timeout)
        assert self.proc.stderr is not None
        stderr = self.proc.stderr.read()
        self.proc.stderr.close()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        stdout = "".join(self._lines)
        last = stdout.strip().splitlines()[-1:] or [""]
        try:
            result = json.loads(last[0])
        except ValueError:
            result = {}
        try:
            termination = self.termination_path.read_text()
        except OSError:
            termination = None
        return WorkloadRun(self.proc.returncode, result, stdout, stderr, termination)


def run_workload(
    plan: Mapping[str, Any] | list[Any] | str,
    env: Mapping[str, str],
    termination_path: str | Path,
    *,
    timeout: float = WORKLOAD_TIMEOUT_S,
    extra_args: tuple[str, ...] = (),
) -> WorkloadRun:
    return WorkloadProcess(plan, env, termination_path, extra_args=extra_args).finish(timeout)

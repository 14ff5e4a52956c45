"""Helpers to drive the agent in tests: an in-process simulated node, the agent as a process.

Shared by the agent's unit tests, the fuzzing, the integration tests and the benchmark. Pods and
their placement annotations come from ``fixtures.suite.manifests`` (the one Pod builder); product code
imports nothing from here (an import-linter contract says so).
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from enforcement.agent.handler import AgentCore
from enforcement.agent.kube import RecordingKube
from enforcement.agent.metrics import Metrics
from enforcement.agent.options import AgentOptions
from enforcement.backends.sim import SimBackend
from enforcement.children import stop_child


@dataclass
class SimAgent:
    """An ``AgentCore`` on an in-process ``SimNode``, with Kubernetes recorded in memory."""

    core: AgentCore
    node: Any  # enforcement.sim.model.SimNode
    kube: RecordingKube
    backend: SimBackend


def sim_agent(
    gpus_mib: Sequence[int] = (1024, 1024),
    *,
    options: AgentOptions | None = None,
    node_name: str = "node-a",
    kube: RecordingKube | None = None,
    sim_node: Any | None = None,
) -> SimAgent:
    from enforcement.sim.model import SimNode
    from enforcement.sim.topology import make_gpus

    node = sim_node or SimNode(node_name, make_gpus(node_name, list(gpus_mib)))
    backend = SimBackend.in_process(node, client_socket="/tmp/gpuconf-test/client.sock")
    kube = kube or RecordingKube()
    core = AgentCore(
        backend, kube, options or AgentOptions(node=node_name), metrics=Metrics(), log=lambda _m: None
    )
    return SimAgent(core, node, kube, backend)


def internal_errors(core: AgentCore) -> int:
    """How many CreateContainer answers were internal errors (a crash turned into a refusal).

    The agent answers every request, refusing when it crashes (fail closed), so a test that only
    checks that an answer came, or that a container was refused, cannot tell a refusal from a
    crash: it asserts this is 0 as well.
    """
    return int(core.metrics.value("gpu_fractioning_agent_rejected_containers_total", reason="internal-error"))


class AgentProcess:
    """``python -m enforcement.agent`` as a child process, ready once it printed its JSON ready line.

    For the integration tests and the benchmark; ``kill()`` is SIGKILL (the restart-recovery case),
    ``stop()`` SIGTERM then SIGKILL. stderr goes to ``log_path`` so a chatty agent never blocks.
    """

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], log_path: str | Path) -> None:
        self.argv = list(argv)
        self.env = dict(env)
        self.log_path = Path(log_path)
        self.proc: subprocess.Popen[bytes] | None = None
        self.ready: dict[str, Any] = {}
        self.started_at = 0.0

    def start(self, timeout_s: float = 60.0) -> AgentProcess:
        root = str(Path(__file__).resolve().parents[2])
        env = dict(self.env)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)
        self.started_at = time.monotonic()
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "enforcement.agent", *self.argv],
                stdout=subprocess.PIPE,
                stderr=log,
                env=env,
                cwd=root,
            )
        assert self.proc.stdout is not None
        line = b""
        deadline = time.monotonic() + timeout_s
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            while not line.endswith(b"\n"):
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    self.kill()
                    raise RuntimeError(f"agent not ready after {timeout_s:g}s:\n{self.log_tail()}")
                chunk = os.read(self.proc.stdout.fileno(), 4096)
                if not chunk:
                    self.proc.wait()
                    raise RuntimeError(
                        f"agent exited {self.proc.returncode} before ready:\n{self.log_tail()}"
                    )
                line += chunk
        self.ready = json.loads(line.split(b"\n", 1)[0])
        return self

    def log_tail(self, chars: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self._close()

    def stop(self, timeout_s: float = 15.0) -> int | None:
        if self.proc is None:
            return None
        stop_child(self.proc, timeout_s)
        self._close()
        return self.proc.returncode

    def _close(self) -> None:
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()

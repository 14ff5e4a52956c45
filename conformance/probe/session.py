"""The probe's frame: its options, results and report, and the ``Session`` a check runs in.

A ``Session`` holds one backend, the reference agent's core with its evictor, and the workload
processes a check starts (``Session.run``: the agent's CreateContainer, then ``python -m
workloads.allocate`` with exactly the environment it returned). Checks judge through ``CheckFailed``
and ``CheckSkipped``; ``conformance.probe.checks`` holds them.
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from enforcement.children import stop_child

if TYPE_CHECKING:
    from enforcement.backends import Backend

REPO_ROOT = Path(__file__).resolve().parents[2]
WORKLOAD_TIMEOUT_S = 120.0
PRESSURE_RETRY_S = 10.0


class SetupError(Exception):
    """The probe cannot run here (no backend, bad options); exit code 2."""


@dataclass(frozen=True)
class ProbeOptions:
    backend: str = "sim"
    sim_gpus: str = "2x4096"
    """``--backend sim``: the simulated GPUs (``COUNTxMIB`` or a MiB list)."""
    checks: tuple[str, ...] = ()
    """Empty: every check."""
    faults: frozenset[str] = frozenset()
    """Seeded agent faults (self-validation only)."""
    mps_root: str | None = None
    """``--backend mps``: pipe/log/state directory (default: a fresh temporary one)."""
    output: Path | None = None
    report_dir: Path | None = None


@dataclass(frozen=True)
class ProbeResult:
    id: str
    statement: str
    status: str  # PASS | FAIL | SKIP | ERROR
    summary: str
    evidence: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    started: float = 0.0


class CheckFailed(Exception):
    def __init__(self, summary: str, evidence: Mapping[str, Any] | None = None) -> None:
        super().__init__(summary)
        self.summary = summary
        self.evidence = dict(evidence or {})


class CheckSkipped(CheckFailed):
    """The check cannot be judged on this machine (not a failure); the summary says why."""


# ---------------------------------------------------------------------------------------- session


class Session:
    """One backend, one agent core with its evictor, and the workload processes of the checks."""

    def __init__(self, backend: Backend, options: ProbeOptions, work: Path, simulated: bool) -> None:
        from enforcement.agent.evictor import Evictor
        from enforcement.agent.handler import AgentCore
        from enforcement.agent.kube import RecordingKube
        from enforcement.agent.options import AgentOptions

        self.backend = backend
        self.simulated = simulated
        self.work = work
        self.kube = RecordingKube()
        self.logs: list[str] = []
        self.core = AgentCore(
            backend,
            self.kube,
            AgentOptions(node="probe", evict_interval_s=0.05, faults=options.faults),
            log=self.logs.append,
        )
        self.gpus = backend.gpus()
        if not self.gpus:
            raise SetupError(f"the {backend.name} backend reports no GPUs")
        self.evictor = Evictor(self.core)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self.evictor.run, args=(self._stop,), daemon=True)
        self._thread.start()
        self._procs: list[Any] = []
        self._pods: list[dict[str, Any]] = []
        self._seq = 0

    @property
    def capacity_mib(self) -> int:
        return int(self.gpus[0].memory_mib)

    def admit(self, annotations: Mapping[str, str], name: str = "") -> tuple[dict[str, Any], Any]:
        from fixtures.suite import manifests

        self._seq += 1
        pod = manifests.pod(
            name or f"probe-{self._seq}",
            [manifests.container("main")],
            namespace="gpuconf-probe",
            annotations=annotations,
            node_name="probe",
            uid=str(uuid.uuid4()),
        )
        self._pods.append(pod)
        return pod, self.core.create_container(pod, "main")

    def env(self, adjustment_env: Mapping[str, str]) -> dict[str, str]:
        env = dict(os.environ)
        env.update(adjustment_env)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
        env["PYTHONUNBUFFERED"] = "1"
        if self.simulated:
            from enforcement.sim import SMI_BIN_DIR

            env["PATH"] = os.pathsep.join(p for p in (str(SMI_BIN_DIR), env.get("PATH", "")) if p)
        else:
            # No container runtime here to mount only the assigned GPUs: the probe plays that part.
            env["CUDA_VISIBLE_DEVICES"] = env.get("NVIDIA_VISIBLE_DEVICES", "")
            env.pop("GPUCONF_SIM_SOCKET", None)
        return env

    @property
    def reaction_period_s(self) -> float:
        """What the probe's agent declares (``--reaction-period``, as the suite reads it): its own
        reaction delay plus one pressure poll."""
        return self.core.options.reaction_period_s + self.core.options.evict_interval_s

    def run(self, pod: Mapping[str, Any], adjustment: Any, plan: Mapping[str, Any]) -> Any:
        from enforcement.agent.kube import pod_ref
        from enforcement.agent.registry import client_name
        from workloads.process import WorkloadProcess

        self._seq += 1
        proc = WorkloadProcess(
            plan,
            self.env(adjustment.env),
            self.work / f"termination-{self._seq}",
            extra_args=("--backend", "sim" if self.simulated else "cupy"),
        )
        self._procs.append(proc)
        self.backend.track_process(client_name(pod_ref(pod, "main")), proc.pid)
        return proc

    def finish(self, proc: Any, name: str, timeout: float = WORKLOAD_TIMEOUT_S) -> Any:
        """``proc``'s run once it ended; a workload that never ran its plan (``plan-error``,
        ``backend-unavailable``) is the probe's own problem, raised as an error (``ERROR``), never a
        failure of the agent (the suite's rule, ``fixtures.suite.frame.workload_must_have_run``)."""
        from fixtures.suite.frame import workload_must_have_run

        run = proc.finish(timeout)
        workload_must_have_run(name, run.result)
        return run

    def stop(self, pod: Mapping[str, Any]) -> None:
        from enforcement.agent.kube import pod_ref

        self.core.stop_container(pod_ref(pod, "main"), 0)

    def clean(self) -> None:
        """After each check: end its processes, release its containers."""
        from enforcement.agent.kube import pod_ref
        from enforcement.agent.registry import client_name

        for proc in self._procs:
            stop_child(proc.proc, 10)
            for stream in (proc.proc.stdout, proc.proc.stderr):
                if stream is not None:
                    stream.close()
        self._procs.clear()
        for pod in self._pods:
            self.stop(pod)
            # A seeded fault may keep the agent from releasing: the next check must start clean anyway.
            self.backend.detach(client_name(pod_ref(pod, "main")))
        self._pods.clear()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.clean()

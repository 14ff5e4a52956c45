"""``gpuconf probe``: the node-level checks, on this machine's GPUs, without Kubernetes.

The reference agent's own enforcement (``enforcement.agent.handler.AgentCore`` and its evictor),
driven in process: each check builds annotated Pods as the scheduler would, asks the agent's
CreateContainer for them, runs ``python -m workloads.allocate`` with exactly the environment the
agent returned, and judges what happened. On a GPU machine it uses the ``mps`` backend and the
CuPy workload; anywhere, ``--backend sim`` starts a simulated device server and runs on that.

Why a probe beside the conformance suite: the node half of the contract (docs/contract.md §6-7) can be
validated on one machine before any cluster exists (the first step of seed 000's rollout path),
and an operator upgrading a driver can run it on the node itself.

Its checks are entries of the conformance catalog (``conformance/catalog.yaml``), in the profile
``probe``: the same rule, statement and level as the suite's node checks, judged here by the agent
in process instead of in a cluster (``CHECKS``; ``--check`` picks some; the probe's older names are
accepted too):

| catalog id | the probe's old name | what the probe does |
|---|---|---|
| ``hard-limit-oom`` | ``hard-limit`` | ``alloc-until-oom`` beside a neighbour that must keep its memory |
| ``burst-borrowing`` | ``borrowing`` | grows from request to limit on an idle GPU, holds it, is not evicted |
| ``soft-limit-eviction`` | ``pressure-eviction`` | a borrower is evicted when a guaranteed Pod needs it |
| ``mode-guard`` | | a container of the other compute mode is refused on a GPU, allowed on another |
| ``smi-visibility`` | ``visibility`` | the container sees only its GPUs, with the limit as their memory |
| ``release-on-exit`` | ``release`` | a stopped container's memory and guarantee are released |
| ``fail-closed`` | | a malformed contract is refused, naming key and rule |

The result is the suite's result model (``reports.model``: ``RunRecord`` with ``source: probe``,
one ``CheckResult`` per check keyed ``probe/<id>``), so every report renders a probe like a run:
``--report-dir DIR`` writes it as ``gpuconf run`` does, ``--output FILE`` writes its ``run.json``.

Every check is shown to FAIL against the matching seeded fault of the agent (``--fault``,
``enforcement.agent.options.FAULTS``), which is how this probe is itself tested.

Exit codes: 0 every check passed (or was skipped), 1 a check failed, 2 usage or set-up error.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conformance.judgements import judge_boundary, kept_bytes, within

if TYPE_CHECKING:
    from enforcement.backends import Backend
    from enforcement.contract import Mode
    from fixtures.suite.checks import Check
    from reports.model import RunRecord

REPO_ROOT = Path(__file__).resolve().parents[1]
MIB = 1 << 20
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


@dataclass(frozen=True)
class ProbeReport:
    backend: str
    simulated: bool
    gpus: list[dict[str, Any]]
    faults: list[str]
    results: list[ProbeResult]
    started_at: float
    wall_s: float

    @property
    def passed(self) -> bool:
        return all(r.status in ("PASS", "SKIP") for r in self.results)

    def to_record(self) -> RunRecord:
        """The probe in the suite's result model: one ``probe/<id>`` result per check, source ``probe``."""
        from reports.model import Catalog, CheckResult, Environment, RunRecord

        outcome = {"PASS": "passed", "FAIL": "failed", "SKIP": "skipped", "ERROR": "error"}
        results = []
        by_id = {c.id: c for c in CHECKS}
        for r in self.results:
            declared = by_id[r.id].declared
            results.append(
                CheckResult(
                    key=declared.key("probe"),
                    id=declared.id,
                    profile="probe",
                    party=declared.party("probe"),
                    level=declared.level,
                    statement=declared.statement,
                    capability=declared.capability,
                    outcome=outcome[r.status],  # type: ignore[arg-type]
                    reason="" if r.status == "PASS" else r.summary,
                    detail=r.summary,
                    duration_s=r.seconds,
                    features=list(declared.features),
                    seed=declared.seed,
                    evidence={"facts": {"summary": r.summary, **r.evidence}},
                    started=r.started,
                )
            )
        product = str(self.gpus[0].get("product") or "") if self.gpus else ""
        memory = int(self.gpus[0].get("memory_mib") or 0) if self.gpus else 0
        return RunRecord(
            run_id="probe-" + time.strftime("%Y%m%d-%H%M%S", time.gmtime(self.started_at)),
            started=self.started_at,
            finished=self.started_at + self.wall_s,
            target={"kind": "probe", "backend": self.backend, "simulated": self.simulated},
            options={"profiles": ["probe"], "backend": self.backend, "faults": self.faults},
            results=results,
            source="probe",
            environment=Environment(
                node_agent="gpuconf reference agent",
                agent_backend=self.backend,
                simulated=self.simulated,
                gpu_product=product,
                gpu_count=len(self.gpus),
                gpu_memory_mib=memory,
                nodes=[{"name": "probe", "gpus": len(self.gpus), "memoryMiB": memory, "product": product}],
            ),
            catalog=Catalog(profiles=["probe"]),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "gpuconf_probe": 1,
            "backend": self.backend,
            "simulated": self.simulated,
            "gpus": self.gpus,
            "faults": self.faults,
            "passed": self.passed,
            "started_at": self.started_at,
            "wall_s": round(self.wall_s, 3),
            "results": [asdict(r) for r in self.results],
        }


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

    def stop(self, pod: Mapping[str, Any]) -> None:
        from enforcement.agent.kube import pod_ref

        self.core.stop_container(pod_ref(pod, "main"), 0)

    def clean(self) -> None:
        """After each check: end its processes, release its containers."""
        from enforcement.agent.kube import pod_ref
        from enforcement.agent.registry import client_name

        for proc in self._procs:
            if proc.proc.poll() is None:
                proc.proc.terminate()
                try:
                    proc.proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.proc.kill()
                    proc.proc.wait()
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


# ---------------------------------------------------------------------------------------- checks


def _placement(
    request_mib: int, limit_mib: int, devices: Sequence[str] = ("0",), mode: Mode = "time-slicing"
) -> dict[str, str]:
    from fixtures.suite.manifests import placement_annotations

    return placement_annotations("main", request_mib, limit_mib, devices, mode)


def _step(result: Mapping[str, Any], op: str) -> dict[str, Any]:
    for step in result.get("steps", ()):
        if step.get("op") == op:
            return dict(step)
    return {}


def _refused(adjustment: Any) -> None:
    if not adjustment.allowed:
        raise CheckFailed(f"the agent refused a valid container: {adjustment.message}")


def check_hard_limit(s: Session) -> tuple[str, dict[str, Any]]:
    import signal

    cap = s.capacity_mib
    request, limit = max(1, cap // 8), max(2, cap // 4)
    gran = MIB if s.simulated else 64 * MIB
    held = max(1, cap // 8)
    n_pod, n_adj = s.admit(_placement(held, held), "neighbour")
    _refused(n_adj)
    n_plan = {
        "name": "neighbour",
        "steps": [
            {"op": "alloc", "bytes": within(held) * MIB},  # the headroom a real GPU's context needs
            {"op": "touch"},
            {"op": "heartbeat", "interval": 0.1, "until_signal": "SIGTERM"},
            # Every byte it held, as the suite's check judges it: read back what the touch wrote (a
            # usage count misses pages scrubbed behind its back).
            {"op": "verify"},
        ],
    }
    neighbour = s.run(n_pod, n_adj, n_plan)
    neighbour.wait_for("heartbeat 1", WORKLOAD_TIMEOUT_S, or_exit=True)
    pod, adj = s.admit(_placement(request, limit))
    _refused(adj)
    plan = {
        "name": "hard-limit",
        "steps": [{"op": "alloc-until-oom", "granularity": gran, "limit": 2 * limit * MIB}],
    }
    run = s.run(pod, adj, plan).finish(WORKLOAD_TIMEOUT_S)
    step = _step(run.result, "alloc-until-oom")
    got = int(step.get("max_bytes", -1))
    oom = step.get("oom") or {}
    evidence = {
        "limit_bytes": limit * MIB,
        "max_allocated_bytes": got,
        "stopped_by": step.get("stopped_by"),
        "oom": oom,
        "exit_code": run.exit_code,
    }
    verdict = judge_boundary(got // MIB, limit, "ideal" if s.simulated else "real", search=step)
    evidence["boundary"] = verdict.as_fact()
    time.sleep(0.3)  # a few of the neighbour's heartbeats after the out-of-memory
    neighbour.proc.send_signal(signal.SIGTERM)
    n_run = neighbour.finish(WORKLOAD_TIMEOUT_S)
    beat = _step(n_run.result, "heartbeat")
    read_back = _step(n_run.result, "verify")
    lost = kept_bytes("the neighbour", within(held), read_back)
    evidence["neighbour"] = {
        "status": n_run.result.get("status"),
        "heartbeat": beat,
        "held_bytes": within(held) * MIB,
        "read_back": {k: read_back.get(k) for k in ("outcome", "bytes", "mismatched", "bad")},
        "kept_every_byte": bool(read_back) and not lost,
    }
    # "corrupted" is the read-back's own verdict after a heartbeat that ran to the signal: judged below.
    if n_run.result.get("status") not in ("ok", "corrupted") or beat.get("ended_by") != "signal":
        raise CheckFailed(f"the neighbour did not keep running: {n_run.result.get('status')}", evidence)
    if beat.get("used_min") and min(beat["used_min"]) < within(held) * MIB:
        raise CheckFailed("the neighbour lost memory it held while its neighbour ran out of memory", evidence)
    if lost:
        raise CheckFailed(f"{lost} while its neighbour ran into its limit beside it", evidence)
    if step.get("stopped_by") != "oom":
        raise CheckFailed(
            f"no OOM: allocated {got // MIB} MiB against a limit of {limit} MiB "
            f"(stopped by {step.get('stopped_by') or run.result.get('status')})",
            evidence,
        )
    if not verdict.ok:
        raise CheckFailed(f"OOM at {got / MIB:.0f} MiB, not at the limit: {verdict.problem}", evidence)
    return (
        f"OOM at {got / MIB:.0f} MiB = limit {limit} MiB ({oom.get('error_type', '?')}); "
        f"neighbour kept every byte of its {within(held)} MiB",
        evidence,
    )


def check_borrowing(s: Session) -> tuple[str, dict[str, Any]]:
    cap = s.capacity_mib
    request, limit = max(1, cap // 8), max(2, cap // 2)
    burst = within(limit)  # up to the limit, less the headroom a real GPU's context and pages need
    pod, adj = s.admit(_placement(request, limit))
    _refused(adj)
    plan = {
        "name": "borrowing",
        "steps": [
            {"op": "alloc", "bytes": burst * MIB, "chunk": max(1, burst // 4) * MIB},
            {"op": "touch"},
            {"op": "heartbeat", "interval": 0.2, "count": 3},
            {"op": "free"},
        ],
    }
    run = s.run(pod, adj, plan).finish(WORKLOAD_TIMEOUT_S)
    alloc = _step(run.result, "alloc")
    evidence = {
        "request_mib": request,
        "limit_mib": limit,
        "allocated_mib": int(alloc.get("bytes", 0)) // MIB,
        "status": run.result.get("status"),
        "exit_code": run.exit_code,
    }
    evidence["evicted_pods"] = [ref.pod for ref, _at in s.kube.evictions]
    if evidence["evicted_pods"]:
        raise CheckFailed(f"the borrower was evicted on an idle GPU: {evidence['evicted_pods']}", evidence)
    if run.exit_code != 0 or alloc.get("outcome") != "ok":
        why = (alloc.get("oom") or {}).get("message") or run.result.get("status")
        raise CheckFailed(f"borrowing {burst} MiB (request {request}, limit {limit}) failed: {why}", evidence)
    return f"held {burst} MiB between request {request} MiB and limit {limit} MiB, not evicted", evidence


def check_pressure_eviction(s: Session) -> tuple[str, dict[str, Any]]:
    from enforcement.agent.kube import REASON_EVICTED, pod_ref

    cap = s.capacity_mib
    g_request = max(1, cap // 2)
    b_request, b_limit = max(1, cap // 16), max(2, cap * 15 // 16)
    borrow = cap * 13 // 16
    guaranteed, g_adj = s.admit(_placement(g_request, g_request), "guaranteed")
    _refused(g_adj)
    borrower, b_adj = s.admit(_placement(b_request, b_limit), "borrower")
    _refused(b_adj)
    b_plan = {
        "name": "borrower",
        "steps": [
            {"op": "alloc", "bytes": borrow * MIB, "chunk": max(1, cap // 16) * MIB},
            {"op": "heartbeat", "interval": 0.2, "until_signal": "SIGTERM"},
        ],
    }
    b_proc = s.run(borrower, b_adj, b_plan)
    b_proc.wait_for("heartbeat 1", WORKLOAD_TIMEOUT_S, or_exit=True)
    g_plan = {
        "name": "guaranteed",
        "steps": [
            {
                "op": "alloc",
                "bytes": within(g_request) * MIB,
                "chunk": max(1, g_request // 4) * MIB,
                "retry_on_pressure": PRESSURE_RETRY_S,
                "retry_on_oom": PRESSURE_RETRY_S,  # a real GPU says out-of-memory until the eviction lands
                "retry_interval": 0.05,
            },
            {"op": "meminfo"},
        ],
    }
    g_run = s.run(guaranteed, g_adj, g_plan).finish(WORKLOAD_TIMEOUT_S)
    evicted = [ref.pod for ref, _at in s.kube.evictions]
    b_run = None
    if pod_ref(borrower).pod in evicted or b_proc.proc.poll() is not None:
        b_run = b_proc.finish(30.0)  # evicted: its device calls now fail with "gone" and it exits
    alloc = _step(g_run.result, "alloc")
    events = [e.message for e in s.kube.events_for(REASON_EVICTED)]
    evidence = {
        "gpu_mib": cap,
        "guaranteed": {"request_mib": g_request, "status": g_run.result.get("status"), "alloc": alloc},
        "borrower": {
            "request_mib": b_request,
            "limit_mib": b_limit,
            "borrowed_mib": borrow,
            "status": b_run.result.get("status") if b_run else "still running",
        },
        "evicted_pods": evicted,
        "eviction_events": events,
        "reaction_s": s.core.metrics.value("gpu_fractioning_agent_last_eviction_reaction_seconds"),
    }
    if pod_ref(guaranteed).pod in evicted:
        raise CheckFailed("the evictor evicted the Pod within its guarantee", evidence)
    if pod_ref(borrower).pod not in evicted:
        raise CheckFailed("the borrower was not evicted while a guaranteed neighbour needed memory", evidence)
    if g_run.exit_code != 0 or alloc.get("outcome") != "ok":
        raise CheckFailed(
            f"the guaranteed Pod did not get its {g_request} MiB: {g_run.result.get('status')}", evidence
        )
    return (
        f"borrower ({borrow} MiB, request {b_request}) evicted; guaranteed got {g_request} MiB "
        f"(reaction {evidence['reaction_s']:.2f} s)",
        evidence,
    )


def check_mode_guard(s: Session) -> tuple[str, dict[str, Any]]:
    small = max(1, s.capacity_mib // 16)
    first, a_adj = s.admit(_placement(small, small, ("0",), "time-slicing"), "time-slicing")
    _refused(a_adj)
    _second, b_adj = s.admit(_placement(small, small, ("0",), "sm-sharing"), "sm-sharing-same-gpu")
    evidence: dict[str, Any] = {
        "same_gpu": {"allowed": b_adj.allowed, "reason": b_adj.reason, "message": b_adj.message},
        "events": [e.reason for e in s.kube.events],
    }
    if b_adj.allowed:
        raise CheckFailed("an sm-sharing container was started on a GPU running time-slicing", evidence)
    if not all(word in b_adj.message for word in ("time-slicing", "sm-sharing", first["metadata"]["name"])):
        raise CheckFailed("the refusal does not name both modes and the other Pod", evidence)
    if len(s.gpus) > 1:
        _third, c_adj = s.admit(_placement(small, small, ("1",), "sm-sharing"), "sm-sharing-other-gpu")
        evidence["other_gpu"] = {"allowed": c_adj.allowed, "message": c_adj.message}
        if not c_adj.allowed:
            raise CheckFailed("sm-sharing was refused on a GPU with no time-slicing client", evidence)
    return (
        f"refused on GPU 0 ({b_adj.reason}); {'allowed on GPU 1' if len(s.gpus) > 1 else '1 GPU'}",
        evidence,
    )


def _hex(uuid: str) -> str:
    return uuid.lower().removeprefix("gpu-").replace("-", "")


def check_visibility(s: Session) -> tuple[str, dict[str, Any]]:
    target = s.gpus[-1]
    request, limit = max(1, s.capacity_mib // 16), max(2, s.capacity_mib // 4)
    pod, adj = s.admit(_placement(request, limit, (str(target.index),)))
    _refused(adj)
    steps: list[dict[str, Any]] = [{"op": "meminfo"}]
    if shutil.which("nvidia-smi", path=s.env(adj.env).get("PATH")):
        steps.append({"op": "smi", "expect": "any"})
    run = s.run(pod, adj, {"name": "visibility", "steps": steps}).finish(WORKLOAD_TIMEOUT_S)
    devices = run.result.get("devices") or []
    meminfo = _step(run.result, "meminfo").get("devices") or []
    smi = _step(run.result, "smi").get("gpus")
    evidence = {
        "assigned": {"index": target.index, "uuid": target.uuid, "limit_mib": limit},
        "env": {k: adj.env.get(k) for k in ("NVIDIA_VISIBLE_DEVICES", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT")},
        "workload_devices": devices,
        "meminfo": meminfo,
        "nvidia_smi": smi,
        "exit_code": run.exit_code,
    }
    if len(devices) != 1 or _hex(str(devices[0].get("uuid", ""))) != _hex(target.uuid):
        raise CheckFailed(
            f"the container sees {len(devices)} GPU(s), not exactly GPU {target.uuid}", evidence
        )
    if s.simulated:
        # The simulated NVML shim reports the limit as total, as the operator's shim does in a Pod.
        if not meminfo or int(meminfo[0].get("total", -1)) != limit * MIB:
            raise CheckFailed(f"memory total is not the limit of {limit} MiB", evidence)
        if not smi or len(smi) != 1 or int(smi[0].get("total_mib", -1)) != limit:
            raise CheckFailed(f"nvidia-smi does not show one GPU of {limit} MiB", evidence)
        return f"1 GPU ({target.uuid[:12]}...) of {limit} MiB in NVML and nvidia-smi", evidence
    # A bare host has no container NVML shim: nvidia-smi shows the physical GPUs, so the rule
    # (nvidia-smi lists the assigned GPUs with the limit as total) cannot be judged here.
    raise CheckSkipped(
        f"1 GPU ({target.uuid[:12]}...) visible to CUDA; a bare host has no container NVML shim, so what "
        "nvidia-smi shows inside a container is judged by the suite's node profile, not here",
        evidence,
    )


def check_release(s: Session) -> tuple[str, dict[str, Any]]:
    from enforcement.agent.kube import pod_ref
    from enforcement.agent.registry import client_name

    request = max(1, s.capacity_mib // 4)
    before = next(g.guaranteed_bytes for g in s.backend.usage().gpus if g.uuid == s.gpus[0].uuid)
    pod, adj = s.admit(_placement(request, request))
    _refused(adj)
    run = s.run(pod, adj, {"name": "release", "steps": [{"op": "alloc", "bytes": request // 2 * MIB}]})
    run.finish(WORKLOAD_TIMEOUT_S)
    s.stop(pod)
    usage = s.backend.usage()
    name = client_name(pod_ref(pod, "main"))
    after = next(g.guaranteed_bytes for g in usage.gpus if g.uuid == s.gpus[0].uuid)
    evidence = {"client": name, "guaranteed_before": before, "guaranteed_after": after}
    if usage.client(name) is not None or after != before:
        raise CheckFailed("after StopContainer the backend still holds the container's guarantee", evidence)
    return f"released: guarantee back to {before // MIB} MiB on GPU 0", evidence


def check_fail_closed(s: Session) -> tuple[str, dict[str, Any]]:
    """The suite's fail-closed, in process: the same malformed cases and the same judgement
    (``conformance.test_failclosed``), against the reference agent, which refuses each itself and
    names the key and the rule (``gpuconf-reference``'s description)."""
    from conformance.test_failclosed import cases, placement, refusal_verdict
    from enforcement.agent.kube import REASON_REJECTED
    from enforcement.hook import REASON_CONFIG_ERROR

    valid = _placement(64, 64)
    problems: list[str] = []
    seen: dict[str, Any] = {}
    for case in cases(len(s.gpus)):
        pod, adj = s.admit(placement(valid, case), case.name)
        uid = pod["metadata"]["uid"]
        events = [e.message for e in s.kube.events if e.ref.pod_uid == uid and e.reason == REASON_REJECTED]
        said = [f"{adj.reason}: {adj.message}", *(f"{REASON_REJECTED}: {m}" for m in events)]
        seen[case.name] = {"value": case.shown, "rule": case.rule, "allowed": adj.allowed, "said": said[-2:]}
        problem = refusal_verdict(case, adj.allowed, said, True)
        if not problem and not adj.allowed and adj.reason != REASON_CONFIG_ERROR:
            problem = f"{case.name} was refused with reason {adj.reason}, not {REASON_CONFIG_ERROR}"
        if not problem and not adj.allowed and not events:
            problem = f"{case.name} was refused, but no {REASON_REJECTED} Event was recorded"
        if problem:
            problems.append(problem)
        if adj.allowed:
            s.stop(pod)  # release what a broken agent fenced, so the next case starts from an idle GPU
    evidence = {"malformed": seen}
    if problems:
        raise CheckFailed("; ".join(problems), evidence)
    return (
        f"{len(seen)} malformed placements refused ({REASON_CONFIG_ERROR}), each naming key and rule",
        evidence,
    )


@dataclass(frozen=True)
class ProbeCheck:
    id: str
    """The catalog id: the declaration (statement, level, party) is the suite's check of that id."""
    run: Callable[[Session], tuple[str, dict[str, Any]]]
    alias: str = ""
    """The probe's name for it before the probe joined the catalog (still accepted by ``--check``)."""
    module: str = ""
    """The ``conformance`` module that declares it."""

    @property
    def declared(self) -> Check:
        import importlib

        from fixtures.suite.checks import REGISTRY

        importlib.import_module(f"conformance.{self.module}")
        declared = REGISTRY[self.id]
        if "probe" not in declared.profiles:
            raise RuntimeError(f"catalog check {self.id} does not list the probe profile")
        return declared

    @property
    def statement(self) -> str:
        return self.declared.statement


CHECKS: tuple[ProbeCheck, ...] = (
    ProbeCheck("hard-limit-oom", check_hard_limit, "hard-limit", "test_memory_limits"),
    ProbeCheck("burst-borrowing", check_borrowing, "borrowing", "test_memory_limits"),
    ProbeCheck("soft-limit-eviction", check_pressure_eviction, "pressure-eviction", "test_eviction"),
    ProbeCheck("mode-guard", check_mode_guard, "", "test_compute"),
    ProbeCheck("smi-visibility", check_visibility, "visibility", "test_visibility"),
    ProbeCheck("release-on-exit", check_release, "release", "test_release"),
    ProbeCheck("fail-closed", check_fail_closed, "", "test_failclosed"),
)
CHECK_IDS = tuple(c.id for c in CHECKS)
ALIASES = {c.alias: c.id for c in CHECKS if c.alias}


def check_id(name: str) -> str:
    """A catalog id from a catalog id or one of the probe's older names."""
    return ALIASES.get(name, name)


# ---------------------------------------------------------------------------------------- running


def _open_backend(options: ProbeOptions, work: Path) -> tuple[Backend, bool, Callable[[], None]]:
    """(backend, simulated, close)."""
    if options.backend == "sim":
        from enforcement.backends.sim import SimBackend
        from enforcement.sim.process import ServerProcess, ServerStartError
        from enforcement.sim.topology import TopologyError, parse_gpus

        try:
            parse_gpus("probe", options.sim_gpus)
        except TopologyError as exc:
            raise SetupError(str(exc)) from None
        try:
            server = ServerProcess.start(work / "sim", node="probe", gpus=options.sim_gpus)
        except ServerStartError as exc:
            raise SetupError(f"cannot start the simulated device: {exc}") from None
        backend = SimBackend.from_dir(work / "sim", server.admin_token)

        def close() -> None:
            backend.close()
            server.stop()

        return backend, True, close
    from enforcement.backends import BackendUnavailable
    from enforcement.backends.mps import MpsBackend

    root = Path(options.mps_root) if options.mps_root else work / "mps"
    try:
        mps = MpsBackend.create(root)
    except BackendUnavailable as exc:
        raise SetupError(f"the mps backend cannot run here: {exc}") from None
    health = mps.health()
    if not health.ok:
        print(f"gpuconf probe: warning: {health.reason}: {health.message}", file=sys.stderr)

    def close_mps() -> None:
        mps.shutdown_daemons()

    return mps, False, close_mps


def run_probe(options: ProbeOptions, log: Callable[[str], None] = lambda _m: None) -> ProbeReport:
    """Run the selected checks; raises ``SetupError`` when nothing can run."""
    unknown = sorted({check_id(c) for c in options.checks} - set(CHECK_IDS))
    if unknown:
        raise SetupError(f"unknown check(s) {', '.join(unknown)}; known: {', '.join(CHECK_IDS)}")
    wanted = {check_id(c) for c in options.checks}
    from enforcement.agent.options import FAULTS, canonical_fault

    options = replace(options, faults=frozenset(canonical_fault(f) for f in options.faults))
    bad_faults = sorted(set(options.faults) - set(FAULTS))
    if bad_faults:
        raise SetupError(f"unknown fault(s) {', '.join(bad_faults)}; known: {', '.join(FAULTS)}")
    started, t0 = time.time(), time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="gprobe-", dir="/tmp"))  # short: socket paths <= 107 bytes
    results: list[ProbeResult] = []
    try:
        backend, simulated, close = _open_backend(options, work)
        try:
            session = Session(backend, options, work, simulated)
            try:
                for check in CHECKS:
                    if wanted and check.id not in wanted:
                        continue
                    log(f"probe: {check.id} ...")
                    results.append(_run_check(session, check))
                    log(f"probe: {check.id}: {results[-1].status}: {results[-1].summary}")
                gpus = [asdict(g) for g in session.gpus]
            finally:
                session.close()
        finally:
            close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return ProbeReport(
        options.backend, simulated, gpus, sorted(options.faults), results, started, time.monotonic() - t0
    )


def _run_check(session: Session, check: ProbeCheck) -> ProbeResult:
    t0, started = time.monotonic(), time.time()
    try:
        summary, evidence = check.run(session)
        status = "PASS"
    except CheckSkipped as exc:
        summary, evidence, status = exc.summary, exc.evidence, "SKIP"
    except CheckFailed as exc:
        summary, evidence, status = exc.summary, exc.evidence, "FAIL"
    except AssertionError as exc:  # a workload that never printed what it should: a failure, with its output
        summary, evidence, status = str(exc).splitlines()[0], {"detail": str(exc)[-2000:]}, "FAIL"
    except Exception as exc:  # noqa: BLE001 - one broken check must not hide the others' results
        summary = f"{type(exc).__name__}: {exc}"
        evidence, status = {"traceback": traceback.format_exc()[-2000:]}, "ERROR"
    finally:
        try:
            session.clean()
        except Exception as exc:  # noqa: BLE001 - the check's verdict stands; a failed clean-up is logged
            session.logs.append(f"clean-up after {check.id}: {exc}")
    return ProbeResult(
        check.id, check.statement, status, summary, evidence, round(time.monotonic() - t0, 3), started
    )


def render_table(report: ProbeReport) -> str:
    kind = "simulated" if report.simulated else "real"
    sizes = ", ".join(f"{g['memory_mib']} MiB" for g in report.gpus)
    lines = [f"gpuconf probe: {report.backend} backend, {len(report.gpus)} {kind} GPU(s) ({sizes})"]
    if report.faults:
        lines.append(f"SEEDED FAULTS (self-validation): {', '.join(report.faults)}")
    width = max([len("CHECK"), *(len(r.id) for r in report.results)])
    lines.append(f"{'CHECK':<{width}}  RESULT  EVIDENCE")
    for r in report.results:
        lines.append(f"{r.id:<{width}}  {r.status:<6}  {r.summary}")
    failed = sum(1 for r in report.results if r.status in ("FAIL", "ERROR"))
    lines.append(
        f"{len(report.results) - failed} of {len(report.results)} checks passed in {report.wall_s:.1f} s"
    )
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------- CLI


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "probe",
        help="node-level enforcement checks on this machine's GPUs (or simulated ones), no Kubernetes",
        description="Run the node-level enforcement checks of the GPU-fraction contract with the reference "
        "agent's own enforcement, on this machine's GPUs (mps backend, CuPy workload) or on simulated ones "
        "(--backend sim), without Kubernetes; prints PASS/FAIL with evidence. Exit 0: all passed, "
        "1: a check failed, 2: usage or set-up error.",
    )
    p.add_argument(
        "--backend",
        choices=("mps", "sim"),
        default="mps",
        help="mps: this machine's GPUs (default); sim: simulated",
    )
    p.add_argument(
        "--sim-gpus", default="2x4096", metavar="SPEC", help="sim: GPUs as COUNTxMIB (default 2x4096)"
    )
    p.add_argument(
        "--check",
        action="append",
        default=[],
        choices=[*CHECK_IDS, *ALIASES],
        metavar="ID",
        help=f"run only this check, repeatable: {', '.join(CHECK_IDS)} (catalog ids)",
    )
    p.add_argument("--output", type=Path, help="write the result (the run.json of the result model) here")
    p.add_argument(
        "--report-dir",
        type=Path,
        help="write the result as gpuconf run does (run.json, checks/, junit.xml): the reports render it",
    )
    p.add_argument("--mps-root", help="mps: pipe/log/state directory (default: a temporary one)")
    p.add_argument("--fault", action="append", default=[], help=argparse.SUPPRESS)  # self-validation only
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    options = ProbeOptions(
        backend=args.backend,
        sim_gpus=args.sim_gpus,
        checks=tuple(args.check),
        faults=frozenset(args.fault),
        mps_root=args.mps_root,
        output=args.output,
        report_dir=args.report_dir,
    )
    try:
        report = run_probe(options, log=lambda m: print(m, file=sys.stderr, flush=True))
    except SetupError as exc:
        print(f"gpuconf probe: {exc}", file=sys.stderr)
        return 2
    print(render_table(report))
    record = report.to_record()
    try:
        if options.output is not None:
            options.output.parent.mkdir(parents=True, exist_ok=True)
            options.output.write_text(json.dumps(record.as_dict(), indent=2, default=str) + "\n")
        if options.report_dir is not None:
            from reports.records import write_run

            write_run(record, options.report_dir)
    except OSError as exc:
        print(f"gpuconf probe: cannot write the result: {exc}", file=sys.stderr)
        return 2
    return 0 if report.passed else 1

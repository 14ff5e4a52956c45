"""The ``mps`` backend: real GPUs, fenced by NVIDIA MPS and watched through NVML.

What each part of the contract becomes on a real node (docs/contract.md §5-7):

- **hard limit**: the client's ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` (the agent puts it in the
  container's environment); the MPS server refuses allocations past it with out-of-memory;
- **compute share**: ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` for sm-sharing clients with a portion;
- **modes**: two control daemons, each with its own pipe directory: ``<root>/default`` for
  time-slicing clients (the node's default MPS server) and ``<root>/sm-sharing`` for the shared
  sm-sharing server; the container's ``CUDA_MPS_PIPE_DIRECTORY`` picks one;
- **soft limit (guarantee)**: nothing in MPS enforces it. A real allocation does not wait for an
  evictor, it fails, so this backend keeps the invariant *free memory >= outstanding guarantees*
  on every GPU (outstanding = what each client is still owed up to its guarantee) and reports the
  shortfall as pressure *before* a guaranteed client needs the memory. Usage per client comes
  from NVML's per-process accounting, attributed to clients by pid (the processes the runtime
  reported, their descendants, and, on a Kubernetes node, the Pod UID in the process's cgroup).

Where no control daemon can run (no ``nvidia-cuda-mps-control`` binary, no permission, it dies
at start) the backend says so plainly through ``health()`` (the node condition turns False with
reason ``MPSControlDaemonUnavailable``) and keeps enforcing what needs no daemon: usage, the
pressure evictor, and eviction of clients above their hard limit (``over_limit``), since the
limit itself is then not applied by anyone.

Restart recovery: the client table is written to ``<root>/clients.json`` on every change and read
back at start; the daemons are deliberately left running when the agent stops (stopping MPS would
kill every client's CUDA context), and a running daemon is adopted, not restarted.

NVML (``pynvml``), the daemon commands and ``/proc`` are reached through three small Protocols
(``Nvml``, ``CommandRunner``, ``ProcessTable``) so that the backend imports and is unit-tested on
machines without a GPU; ``pynvml`` is imported only when a real ``PynvmlNvml`` is built.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from workloads.plan import MiB

from . import (
    Attachment,
    AttachRefused,
    BackendUnavailable,
    Candidate,
    ClientRequest,
    DeviceLimit,
    GpuInfo,
    GpuPressure,
    GpuUsage,
    Health,
    ModeConflict,
    Share,
    Usage,
    client_usage,
)

CONTROL_BINARY = "nvidia-cuda-mps-control"
DEFAULT_ROOT = "/run/gpuconf/mps"
STATE_FILE = "clients.json"
PIPE_SUBDIR = {"time-slicing": "default", "sm-sharing": "sm-sharing"}
# NVML counts a process's CUDA context in its usage; MPS's pinned limit counts allocations only.
# Allowed on top of the hard limit before a client is called over its limit (unenforced case).
CONTEXT_ALLOWANCE_BYTES = 512 * MiB
RESTART_BACKOFF_S = 5.0
_N = TypeVar("_N", int, float)
_PerClientGpu = dict[tuple[str, str], _N]
"""A figure per (client name, GPU UUID)."""


# ---- boundaries


@dataclass(frozen=True)
class NvmlGpu:
    index: int
    uuid: str
    name: str
    total_bytes: int


@dataclass(frozen=True)
class NvmlProcess:
    pid: int
    used_bytes: int


class Nvml(Protocol):
    """The NVML calls the backend makes; ``PynvmlNvml`` is the real one."""

    def gpus(self) -> tuple[NvmlGpu, ...]: ...

    def memory(self, index: int) -> tuple[int, int, int]:
        """``(total, used, free)`` bytes of GPU ``index``."""
        ...

    def processes(self, index: int) -> tuple[NvmlProcess, ...]:
        """Compute processes on GPU ``index`` with their memory."""
        ...

    def sm_utilization(self, index: int) -> Mapping[int, float]:
        """Recent SM utilisation per pid, in percent; empty when NVML has no samples."""
        ...


@dataclass(frozen=True)
class Completed:
    returncode: int
    stdout: str
    stderr: str


class CommandRunner(Protocol):
    """Runs the control daemon's command; faked in tests."""

    def which(self, name: str) -> str | None: ...

    def run(
        self, argv: list[str], env: Mapping[str, str], stdin: str | None = None, timeout_s: float = 10.0
    ) -> Completed: ...


class ProcessTable(Protocol):
    """What the backend asks of the OS about processes; faked in tests."""

    def parent(self, pid: int) -> int | None: ...

    def cgroup(self, pid: int) -> str: ...

    def alive(self, pid: int) -> bool: ...

    def kill(self, pid: int) -> None: ...


class SubprocessRunner:
    def which(self, name: str) -> str | None:
        return shutil.which(name)

    def run(
        self, argv: list[str], env: Mapping[str, str], stdin: str | None = None, timeout_s: float = 10.0
    ) -> Completed:
        try:
            done = subprocess.run(
                argv,
                env={**os.environ, **env},
                input=stdin,
                capture_output=True,
                text=True,
                timeout=timeout_s,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return Completed(-1, "", f"{type(exc).__name__}: {exc}")
        return Completed(done.returncode, done.stdout, done.stderr)


class ProcFs:
    """``/proc`` on Linux."""

    def parent(self, pid: int) -> int | None:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return None
        # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
        fields = stat.rpartition(")")[2].split()
        return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None

    def cgroup(self, pid: int) -> str:
        try:
            return Path(f"/proc/{pid}/cgroup").read_text()
        except OSError:
            return ""

    def alive(self, pid: int) -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True

    def kill(self, pid: int) -> None:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


class PynvmlNvml:
    """NVML through ``pynvml``, imported here and only here."""

    def __init__(self) -> None:
        try:
            import pynvml  # deferred: machines without a GPU do not have it
        except ImportError as exc:
            raise BackendUnavailable(f"pynvml is not importable ({exc}); install gpuconf[gpu]") from None
        self._nv = pynvml
        try:
            pynvml.nvmlInit()
            count = pynvml.nvmlDeviceGetCount()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        except pynvml.NVMLError as exc:
            raise BackendUnavailable(f"NVML: {exc}") from None
        self._last_seen = [0] * len(self._handles)

    @staticmethod
    def _text(value: Any) -> str:
        return value.decode() if isinstance(value, bytes) else str(value)

    def gpus(self) -> tuple[NvmlGpu, ...]:
        nv = self._nv
        try:
            return tuple(
                NvmlGpu(
                    i,
                    self._text(nv.nvmlDeviceGetUUID(h)),
                    self._text(nv.nvmlDeviceGetName(h)),
                    int(nv.nvmlDeviceGetMemoryInfo(h).total),
                )
                for i, h in enumerate(self._handles)
            )
        except nv.NVMLError as exc:
            raise BackendUnavailable(f"NVML: {exc}") from None

    def memory(self, index: int) -> tuple[int, int, int]:
        try:
            info = self._nv.nvmlDeviceGetMemoryInfo(self._handles[index])
        except self._nv.NVMLError as exc:
            raise BackendUnavailable(f"NVML GPU {index}: {exc}") from None
        return int(info.total), int(info.used), int(info.free)

    def processes(self, index: int) -> tuple[NvmlProcess, ...]:
        try:
            procs = self._nv.nvmlDeviceGetComputeRunningProcesses(self._handles[index])
        except self._nv.NVMLError as exc:
            raise BackendUnavailable(f"NVML GPU {index}: {exc}") from None
        # usedGpuMemory is None where the driver cannot tell (some MPS set-ups): count it as 0.
        return tuple(NvmlProcess(int(p.pid), int(p.usedGpuMemory or 0)) for p in procs)

    def sm_utilization(self, index: int) -> Mapping[int, float]:
        nv = self._nv
        try:
            samples = nv.nvmlDeviceGetProcessUtilization(self._handles[index], self._last_seen[index])
        except nv.NVMLError:
            return {}  # no samples yet, or not supported on this GPU: no figure, not an error
        out: dict[int, float] = {}
        for s in samples:
            out[int(s.pid)] = max(out.get(int(s.pid), 0.0), float(s.smUtil))
            self._last_seen[index] = max(self._last_seen[index], int(s.timeStamp))
        return out


# ---- the control daemons


@dataclass
class ControlDaemon:
    """One ``nvidia-cuda-mps-control -d`` with its own pipe and log directories."""

    binary: str
    pipe_dir: Path
    log_dir: Path
    runner: CommandRunner
    started_by_us: bool = False
    running: bool = False
    """As of the last ``ensure()``: the pressure poll reads this instead of asking the daemon."""
    last_error: str = ""
    last_attempt: float = field(default=-1e9)

    @property
    def env(self) -> dict[str, str]:
        return {"CUDA_MPS_PIPE_DIRECTORY": str(self.pipe_dir), "CUDA_MPS_LOG_DIRECTORY": str(self.log_dir)}

    def alive(self) -> bool:
        done = self.runner.run([self.binary], self.env, stdin="get_server_list\n", timeout_s=5.0)
        return done.returncode == 0

    def ensure(self) -> bool:
        """Running afterwards? Adopts a running daemon; starts one (at most every few seconds)."""
        self.running = self._ensure()
        return self.running

    def _ensure(self) -> bool:
        if self.alive():
            self.last_error = ""
            return True
        now = time.monotonic()
        if now - self.last_attempt < RESTART_BACKOFF_S:
            return False
        self.last_attempt = now
        try:
            self.pipe_dir.mkdir(parents=True, exist_ok=True)
            self.log_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            self.last_error = f"cannot create {self.pipe_dir} or {self.log_dir}: {exc}"
            return False
        done = self.runner.run([self.binary, "-d"], self.env, timeout_s=15.0)
        if done.returncode != 0:
            self.last_error = (
                f"{self.binary} -d (pipe {self.pipe_dir}) exited {done.returncode}: "
                f"{(done.stderr or done.stdout).strip()[:300]}"
            )
            return False
        if not self.alive():
            self.last_error = f"{self.binary} -d (pipe {self.pipe_dir}) started but does not answer"
            return False
        self.started_by_us = True
        self.last_error = ""
        return True

    def quit(self) -> None:
        self.runner.run([self.binary], self.env, stdin="quit\n", timeout_s=10.0)


# ---- the backend


@dataclass(frozen=True)
class _Client:
    name: str
    mode: str
    labels: dict[str, str]
    gpus: tuple[DeviceLimit, ...]
    active_thread_percentage: int | None
    pids: frozenset[int] = frozenset()

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "mode": self.mode,
            "labels": self.labels,
            "gpus": [[g.gpu, g.hard_limit_mib, g.guarantee_mib] for g in self.gpus],
            "active_thread_percentage": self.active_thread_percentage,
            "pids": sorted(self.pids),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> _Client:
        return cls(
            str(data["name"]),
            str(data["mode"]),
            {str(k): str(v) for k, v in dict(data.get("labels") or {}).items()},
            tuple(DeviceLimit(str(g[0]), int(g[1]), int(g[2])) for g in data["gpus"]),
            data.get("active_thread_percentage"),
            frozenset(int(p) for p in data.get("pids") or ()),
        )


class MpsBackend:
    """Real GPUs through MPS and NVML (see the module docstring)."""

    name = "mps"

    def __init__(
        self,
        nvml: Nvml,
        *,
        root: str | Path = DEFAULT_ROOT,
        runner: CommandRunner | None = None,
        procs: ProcessTable | None = None,
        binary: str = CONTROL_BINARY,
        context_allowance_bytes: int = CONTEXT_ALLOWANCE_BYTES,
    ) -> None:
        self._nvml = nvml
        self.root = Path(root)
        self._runner = runner or SubprocessRunner()
        self._procs = procs or ProcFs()
        self._allowance = context_allowance_bytes
        self._lock = threading.RLock()
        self._clients: dict[str, _Client] = {}
        found = self._runner.which(binary) if os.sep not in binary else binary
        self.binary: str | None = found
        self.daemons: dict[str, ControlDaemon] = {}
        if found is not None:
            for mode, sub in PIPE_SUBDIR.items():
                self.daemons[mode] = ControlDaemon(
                    found, self.root / sub, self.root / "log" / sub, self._runner
                )
        self._load()

    @classmethod
    def create(cls, root: str | Path = DEFAULT_ROOT, **kwargs: Any) -> MpsBackend:
        """With the real NVML; starts (or adopts) the control daemons."""
        backend = cls(PynvmlNvml(), root=root, **kwargs)
        backend.start()
        return backend

    def start(self) -> Health:
        for daemon in self.daemons.values():
            daemon.ensure()
        return self.health()

    # ---- state file

    def _state_path(self) -> Path:
        return self.root / STATE_FILE

    def _load(self) -> None:
        try:
            data = json.loads(self._state_path().read_text())
            self._clients = {c["name"]: _Client.from_json(c) for c in data.get("clients", ())}
        except (OSError, ValueError, KeyError, TypeError, IndexError):
            self._clients = {}  # no state (first start) or unreadable: nothing to re-adopt

    def _save(self) -> None:
        path = self._state_path()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"clients": [c.to_json() for c in self._clients.values()]}))
            tmp.replace(path)
        except OSError:
            pass  # recovery loses this client's record; enforcement itself is unaffected

    # ---- Backend

    def gpus(self) -> tuple[GpuInfo, ...]:
        return tuple(GpuInfo(g.index, g.uuid, g.name, g.total_bytes // MiB) for g in self._nvml.gpus())

    def pipe_directory(self, mode: str) -> str:
        return str(self.root / PIPE_SUBDIR.get(mode, PIPE_SUBDIR["time-slicing"]))

    def attach(self, request: ClientRequest) -> Attachment:
        uuids = {g.uuid for g in self._nvml.gpus()}
        for g in request.gpus:
            if g.gpu not in uuids:
                raise AttachRefused(f"client {request.name}: this node has no GPU {g.gpu}")
            if not 1 <= g.guarantee_mib <= g.hard_limit_mib:
                raise AttachRefused(
                    f"client {request.name}, GPU {g.gpu}: need 1 MiB <= guarantee ({g.guarantee_mib} MiB) "
                    f"<= hard limit ({g.hard_limit_mib} MiB)"
                )
        with self._lock:
            self._clients.pop(request.name, None)  # replaced, as a restarted container replaces its run
            wanted = {g.gpu for g in request.gpus}
            for other in self._clients.values():
                shared = wanted & {g.gpu for g in other.gpus}
                if shared and other.mode != request.mode:
                    gpu = sorted(shared)[0]
                    raise ModeConflict(
                        f"GPU {gpu} holds {other.mode} client {other.name} and cannot take {request.mode} "
                        f"client {request.name}: time-slicing and sm-sharing never share a GPU",
                        gpu,
                        request.name,
                        request.mode,
                        other.name,
                        other.mode,
                    )
            self._clients[request.name] = _Client(
                request.name,
                request.mode,
                dict(request.labels),
                request.gpus,
                request.active_thread_percentage,
            )
            self._save()
        daemon = self.daemons.get(request.mode)
        env = {"CUDA_MPS_PIPE_DIRECTORY": self.pipe_directory(request.mode)}
        if daemon is not None:
            env["CUDA_MPS_LOG_DIRECTORY"] = str(daemon.log_dir)
        return Attachment(request.name, env)

    def detach(self, client: str, reason: str = "stopped") -> None:
        with self._lock:
            if self._clients.pop(client, None) is not None:
                self._save()

    def evict(self, client: str) -> None:
        """Kill the client's processes (their memory goes back at once), then forget it."""
        with self._lock:
            known = self._clients.get(client)
        if known is None:
            return
        owners = self._owners()
        victims = set(known.pids) | {pid for pid, name in owners.items() if name == client}
        for pid in sorted(victims):
            self._procs.kill(pid)
        self.detach(client, "evicted")

    def track_process(self, client: str, pid: int) -> None:
        with self._lock:
            known = self._clients.get(client)
            if known is None:
                return
            live = frozenset(p for p in known.pids if self._procs.alive(p)) | {pid}
            self._clients[client] = _Client(
                known.name, known.mode, known.labels, known.gpus, known.active_thread_percentage, live
            )
            self._save()

    # ---- attribution and measurement

    def _owner_of(self, pid: int, by_pid: Mapping[int, str], clients: Mapping[str, _Client]) -> str | None:
        seen = 0
        current: int | None = pid
        while current is not None and current > 1 and seen < 64:
            if current in by_pid:
                return by_pid[current]
            current = self._procs.parent(current)
            seen += 1
        cgroup = self._procs.cgroup(pid)
        if cgroup:
            for name, c in clients.items():
                uid = c.labels.get("uid", "")
                if uid and (uid in cgroup or uid.replace("-", "_") in cgroup):
                    return name
        return None

    def _owners(self) -> dict[int, str]:
        """pid -> client, for every process NVML sees on any GPU."""
        with self._lock:
            clients = dict(self._clients)
        by_pid = {pid: c.name for c in clients.values() for pid in c.pids}
        out: dict[int, str] = {}
        for gpu in self._nvml.gpus():
            for proc in self._nvml.processes(gpu.index):
                owner = self._owner_of(proc.pid, by_pid, clients)
                if owner is not None:
                    out[proc.pid] = owner
        return out

    def _measure(
        self,
    ) -> tuple[tuple[NvmlGpu, ...], dict[str, _Client], _PerClientGpu[int], _PerClientGpu[float]]:
        """NVML's processes attributed to clients: (GPUs, clients, bytes and SM % per (client, GPU))."""
        gpus = self._nvml.gpus()
        with self._lock:
            clients = dict(self._clients)
        by_pid = {pid: c.name for c in clients.values() for pid in c.pids}
        used: dict[tuple[str, str], int] = {}  # (client, uuid) -> bytes
        sm: dict[tuple[str, str], float] = {}
        for gpu in gpus:
            utilisation = self._nvml.sm_utilization(gpu.index)
            for proc in self._nvml.processes(gpu.index):
                owner = self._owner_of(proc.pid, by_pid, clients)
                if owner is None:
                    continue
                key = (owner, gpu.uuid)
                used[key] = used.get(key, 0) + proc.used_bytes
                if proc.pid in utilisation:
                    sm[key] = sm.get(key, 0.0) + utilisation[proc.pid]
        return gpus, clients, used, sm

    def usage(self) -> Usage:
        gpus, clients, used, sm = self._measure()
        gpu_usage = []
        for g in gpus:
            total, in_use, free = self._nvml.memory(g.index)
            on_gpu = [c for c in clients.values() if any(d.gpu == g.uuid for d in c.gpus)]
            guaranteed = sum(d.guarantee_mib * MiB for c in on_gpu for d in c.gpus if d.gpu == g.uuid)
            mode = on_gpu[0].mode if on_gpu else None
            gpu_usage.append(GpuUsage(g.index, g.uuid, total, in_use, free, guaranteed, mode))
        return Usage(
            tuple(gpu_usage),
            tuple(
                client_usage(
                    gpu_usage,
                    c.name,
                    c.mode,
                    c.labels,
                    (
                        Share(
                            d.gpu,
                            ordinal,
                            used.get((c.name, d.gpu), 0),
                            d.hard_limit_mib * MiB,
                            d.guarantee_mib * MiB,
                            sm.get((c.name, d.gpu)),
                        )
                        for ordinal, d in enumerate(c.gpus)
                    ),
                    pids=sorted(c.pids),
                )
                for c in sorted(clients.values(), key=lambda c: c.name)
            ),
        )

    def pressure(self) -> tuple[GpuPressure, ...]:
        gpus, clients, used, _sm = self._measure()
        out = []
        for g in gpus:
            _total, _in_use, free = self._nvml.memory(g.index)
            shares = [(c, d) for c in clients.values() for d in c.gpus if d.gpu == g.uuid]
            outstanding = 0
            waiting: list[str] = []
            candidates: list[Candidate] = []
            over: list[Candidate] = []
            for c, d in shares:
                u, guarantee, hard = (
                    used.get((c.name, g.uuid), 0),
                    d.guarantee_mib * MiB,
                    d.hard_limit_mib * MiB,
                )
                if u < guarantee:
                    outstanding += guarantee - u
                    waiting.append(c.name)
                elif u > guarantee:
                    candidates.append(Candidate(c.name, u, guarantee, hard))
                daemon = self.daemons.get(c.mode)
                enforced = daemon is not None and daemon.running
                if not enforced and u > hard + self._allowance:
                    over.append(Candidate(c.name, u, guarantee, hard))
            candidates.sort(key=lambda k: (-k.overage_bytes, k.client))
            shortfall = max(0, outstanding - free)
            out.append(
                GpuPressure(
                    index=g.index,
                    uuid=g.uuid,
                    under_pressure=shortfall > 0 and bool(candidates),
                    shortfall_bytes=shortfall,
                    free_bytes=free,
                    waiting=tuple(waiting) if shortfall > 0 else (),
                    candidates=tuple(candidates),
                    over_limit=tuple(over),
                )
            )
        return tuple(out)

    def health(self) -> Health:
        try:
            count = len(self._nvml.gpus())
        except BackendUnavailable as exc:
            return Health(False, "NVMLUnavailable", str(exc))
        if self.binary is None:
            return Health(
                False,
                "MPSControlDaemonUnavailable",
                f"{CONTROL_BINARY} is not on PATH: hard memory limits and thread percentages cannot be "
                "enforced; only the NVML-based evictor runs (pressure, and clients above their hard limit)",
            )
        broken = [(mode, d) for mode, d in self.daemons.items() if not d.ensure()]
        if broken:
            detail = "; ".join(f"{mode}: {d.last_error or 'not running'}" for mode, d in broken)
            return Health(
                False,
                "MPSControlDaemonUnavailable",
                f"MPS control daemon not running ({detail}): hard limits are not enforced for those clients; "
                "only the NVML-based evictor runs",
            )
        return Health(True, "MPSReady", f"MPS control daemons serve {count} GPU(s) under {self.root}")

    def shutdown_daemons(self) -> None:
        """Stop the daemons this backend started (the probe's clean-up; the agent never does this)."""
        for daemon in self.daemons.values():
            if daemon.started_by_us:
                daemon.quit()
                daemon.started_by_us = False

    def close(self) -> None:
        """Leaves the daemons running: their clients' CUDA contexts live in them (see the docstring)."""

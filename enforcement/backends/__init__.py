"""What the node agent needs from a GPU sharing backend, as one small Protocol and plain values.

The agent decides *what* a container gets (from the contract annotations); a backend makes the
GPU obey it and tells the agent what the GPU holds. Two backends implement ``Backend``:

- ``sim`` (``enforcement.backends.sim``): the simulated device of ``enforcement.sim`` through its
  admin socket, for machines without GPUs (the sandbox, CI);
- ``mps`` (``enforcement.backends.mps``): real GPUs through NVIDIA MPS control daemons and NVML.

Built so because:

- **The agent must not branch on the backend.** Everything backend-specific (how a hard limit
  is applied, what "pressure" means on that hardware, which environment a client needs to find
  its device) hides behind ``attach`` / ``pressure`` / ``usage`` and ``Attachment.env``. The
  evictor, the metrics and restart recovery are one code path for both.
- **Pressure is reported, not acted on, by the backend.** ``pressure()`` names the clients that
  are above their guarantee on each GPU and how much memory the guaranteed ones are short; the
  agent's evictor chooses whom to evict (largest overage first, never a client within its
  guarantee) and goes through the Kubernetes Eviction API first, so the Pod, not only its
  process, is gone and an Event says why. How pressure is *measured* differs: the simulated
  device records a guaranteed client that was refused for want of memory; on a real GPU an
  allocation just fails, so the MPS backend keeps the invariant "free memory >= outstanding
  guarantees" and reports the shortfall before a guaranteed neighbour ever fails.
- **Frozen values, bytes for usage and MiB for limits**, as the contract writes limits in whole
  MiB and devices account usage in bytes.
- **Errors are typed**: ``BackendUnavailable`` (cannot reach the device: the node is not ready),
  ``ModeConflict`` (the device itself refused to mix compute modes on a GPU), ``AttachRefused``
  (anything else the device refused, with its message).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

__all__ = [
    "AttachRefused",
    "Attachment",
    "Backend",
    "BackendError",
    "BackendUnavailable",
    "Candidate",
    "ClientGpuUsage",
    "ClientRequest",
    "ClientUsage",
    "DeviceLimit",
    "GpuInfo",
    "GpuPressure",
    "GpuUsage",
    "Health",
    "ModeConflict",
    "Share",
    "Usage",
    "client_usage",
]


# ---- errors


class BackendError(Exception):
    """A backend operation failed; the message names the client and the GPU where known."""


class BackendUnavailable(BackendError):
    """The device (server, daemon, NVML) cannot be reached: nothing can be enforced right now."""


class AttachRefused(BackendError):
    """The device refused a client for a reason other than a mode conflict (bad limits, unknown GPU)."""


class ModeConflict(BackendError):
    """The device refused to put a client of one compute mode on a GPU holding the other mode."""

    def __init__(self, message: str, gpu: str, client: str, mode: str, other_client: str, other_mode: str):
        super().__init__(message)
        self.gpu = gpu
        self.client = client
        self.mode = mode
        self.other_client = other_client
        self.other_mode = other_mode


# ---- requests


@dataclass(frozen=True)
class GpuInfo:
    """One GPU of the node as the backend sees it."""

    index: int
    uuid: str
    product: str
    memory_mib: int


@dataclass(frozen=True)
class DeviceLimit:
    """A client's limits on one GPU (the contract's limits are per assigned device)."""

    gpu: str
    """The GPU's UUID."""
    hard_limit_mib: int
    guarantee_mib: int


@dataclass(frozen=True)
class ClientRequest:
    """One container to fence: its GPUs in container-visible order, mode and identifying labels."""

    name: str
    gpus: tuple[DeviceLimit, ...]
    mode: str
    active_thread_percentage: int | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    shared_fault_domain: bool = False
    """Put a time-slicing client in its GPUs' shared fault domain (sm-sharing clients are always in it).
    Only the seeded agent fault ``shared-fault-domain`` sets it; the simulated device honours it, the
    MPS backend cannot (its fault domain is the server the pipe directory names) and ignores it."""
    unprotected_memory: bool = False
    """Fence the client's overruns by scrubbing its GPU neighbours' pages. Only the seeded agent fault
    ``clobber-neighbour`` sets it; the simulated device honours it, the MPS backend ignores it (a real
    driver never hands one client's pages to another)."""
    device_usage_view: bool = False
    """Show the client's NVML readers (nvidia-smi) its GPUs' whole used memory, every client's, instead
    of its own. Only the seeded agent fault ``smi-device-used`` sets it; the simulated device honours
    it, the MPS backend ignores it (it configures no NVML view)."""
    device_faults: tuple[str, ...] = ()
    """Seeded agent faults the device itself commits for this client (``enforcement.sim.model``
    ``DEVICE_FAULTS``: ``context-outside-limit``, ``free-sub-page``, ``cuda-enumerates-all``). Only
    seeded faults set it; the simulated device honours it, the MPS backend ignores it."""


@dataclass(frozen=True)
class Attachment:
    """What attaching returned: the client's name and the environment it needs to reach its device."""

    client: str
    env: Mapping[str, str] = field(default_factory=dict)
    mounts: tuple[str, ...] = ()
    """Host paths a container must see at the same path to reach its device (the simulated device's
    client socket); the MPS pipe directory is the agent's to add, for every backend."""


# ---- state


@dataclass(frozen=True)
class ClientGpuUsage:
    uuid: str
    index: int
    """The GPU's index on the node (the ``gpu`` metric label)."""
    ordinal: int
    """The container-visible ordinal."""
    used_bytes: int
    hard_limit_bytes: int
    guarantee_bytes: int
    sm_percent: float | None = None
    """Streaming-multiprocessor utilisation of this client on this GPU, where the backend can tell."""


@dataclass(frozen=True)
class ClientUsage:
    name: str
    mode: str
    labels: Mapping[str, str]
    gpus: tuple[ClientGpuUsage, ...]
    pids: tuple[int, ...] = ()
    faulted: bool = False


@dataclass(frozen=True)
class GpuUsage:
    index: int
    uuid: str
    capacity_bytes: int
    used_bytes: int
    free_bytes: int
    guaranteed_bytes: int
    mode: str | None


@dataclass(frozen=True)
class Usage:
    """Everything the GPUs hold right now: the source of metrics and of restart recovery."""

    gpus: tuple[GpuUsage, ...]
    clients: tuple[ClientUsage, ...]

    def client(self, name: str) -> ClientUsage | None:
        return next((c for c in self.clients if c.name == name), None)


@dataclass(frozen=True)
class Share:
    """A client's share of one GPU as a backend measures it; ``client_usage`` names the GPU's index."""

    uuid: str
    ordinal: int
    used_bytes: int
    hard_limit_bytes: int
    guarantee_bytes: int
    sm_percent: float | None = None


def client_usage(
    gpus: Iterable[GpuUsage],
    name: str,
    mode: str,
    labels: Mapping[str, str],
    shares: Iterable[Share],
    pids: Iterable[int] = (),
    faulted: bool = False,
) -> ClientUsage:
    """One client's ``ClientUsage`` from what a backend measured, the same for every backend: each share
    on the GPU of that UUID among ``gpus`` (index -1 for a GPU the node no longer lists)."""
    index = {g.uuid: g.index for g in gpus}
    return ClientUsage(
        name=name,
        mode=mode,
        labels=dict(labels),
        gpus=tuple(
            ClientGpuUsage(
                s.uuid,
                index.get(s.uuid, -1),
                s.ordinal,
                s.used_bytes,
                s.hard_limit_bytes,
                s.guarantee_bytes,
                s.sm_percent,
            )
            for s in shares
        ),
        pids=tuple(pids),
        faulted=faulted,
    )


@dataclass(frozen=True)
class Candidate:
    """A client on one GPU that the evictor may consider."""

    client: str
    used_bytes: int
    guarantee_bytes: int
    hard_limit_bytes: int = 0
    """0 where the backend does not report it."""

    @property
    def overage_bytes(self) -> int:
        return self.used_bytes - self.guarantee_bytes


@dataclass(frozen=True)
class GpuPressure:
    """Pressure on one GPU, as the backend measures it (see the module docstring).

    ``candidates``: every client above its guarantee, largest overage first; evictable only while
    ``under_pressure``. ``over_limit``: clients above their *hard* limit, which only a backend that
    could not apply the limit (no MPS daemon) lets happen; the agent evicts those regardless.
    """

    index: int
    uuid: str
    under_pressure: bool
    shortfall_bytes: int
    free_bytes: int
    waiting: tuple[str, ...] = ()
    """Clients within their guarantee that are short of memory (who the eviction is for)."""
    waiting_s: float = 0.0
    """How long the longest-waiting of them has waited, where the backend knows."""
    candidates: tuple[Candidate, ...] = ()
    over_limit: tuple[Candidate, ...] = ()


@dataclass(frozen=True)
class Health:
    """Whether the backend can enforce right now; ``reason`` is a CamelCase word for the node condition."""

    ok: bool
    reason: str
    message: str


@runtime_checkable
class Backend(Protocol):
    """A GPU sharing backend, as the node agent drives it. Implementations are thread-safe."""

    name: str

    def gpus(self) -> tuple[GpuInfo, ...]:
        """The node's GPUs, in index order; raises ``BackendUnavailable``."""
        ...

    def pipe_directory(self, mode: str) -> str:
        """``CUDA_MPS_PIPE_DIRECTORY`` for clients of ``mode``."""
        ...

    def attach(self, request: ClientRequest) -> Attachment:
        """Fence a client; a client of the same name already attached is replaced.

        Raises ``ModeConflict``, ``AttachRefused`` or ``BackendUnavailable``.
        """
        ...

    def detach(self, client: str, reason: str = "stopped") -> None:
        """Release everything the client holds; a client the backend does not know is not an error."""
        ...

    def evict(self, client: str) -> None:
        """Reclaim the client's memory now (its Pod is being evicted); unknown clients are ignored."""
        ...

    def track_process(self, client: str, pid: int) -> None:
        """A process of ``client`` started (a backend that attributes usage by pid needs it)."""
        ...

    def usage(self) -> Usage: ...

    def pressure(self) -> tuple[GpuPressure, ...]: ...

    def health(self) -> Health: ...

    def close(self) -> None: ...

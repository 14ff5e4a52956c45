"""Node-side messages of the simulated GPU device: topology, attach/detach, snapshot, pressure.

These travel only on the admin socket, between the device server and the node agent (or the node
runtime that starts simulated containers). They are kept out of ``workloads.simwire``, which ships
inside workload images: a container has no use for them, and the client socket's codec is built
without them, so it cannot even decode an admin request.

Memory limits are whole MiB here, as the GPU-fraction contract writes them (docs/contract.md §2, §5);
usage is in bytes, as the device accounts it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from workloads.simwire import ERROR_REPLIES, Codec, Message

# ---- topology


@dataclass(frozen=True)
class GpuSpec:
    """One simulated GPU of a node."""

    index: int
    uuid: str
    product: str
    memory_mib: int


# ---- requests


@dataclass(frozen=True)
class AdminHello(Message):
    """First message of every admin connection; the token is the server's admin token."""

    TYPE: ClassVar[str] = "admin-hello"
    token: str


@dataclass(frozen=True)
class ClientGpuSpec:
    """One GPU a client is attached to, with its limits on that GPU.

    ``gpu`` names a node GPU by UUID (``GPU-…``) or by node index (``"0"``), as ``gpus.devices``
    does; the client sees the GPUs of its spec as ordinals 0..n-1 in the order given.
    """

    gpu: str
    hard_limit_mib: int  # the annotation's limit: an allocation past it fails with OOM
    guarantee_mib: int  # the annotation's request: the soft limit, protected under pressure


@dataclass(frozen=True)
class ClientSpec:
    """A container to attach: its name (unique on the node), GPUs, compute mode and free-form labels.

    The labels come back in snapshots so that a restarted agent can tell which Pod a client is.
    ``shared_fault_domain`` puts a time-slicing client in its GPUs' shared fault domain (as if it ran
    in the shared MPS server; sm-sharing clients always are): a broken agent's doing, never the default.
    """

    name: str
    gpus: tuple[ClientGpuSpec, ...]
    mode: str = "time-slicing"
    labels: dict[str, str] = field(default_factory=dict)
    shared_fault_domain: bool = False


@dataclass(frozen=True)
class Attach(Message):
    TYPE: ClassVar[str] = "attach"
    spec: ClientSpec


@dataclass(frozen=True)
class Detach(Message):
    """Detach a client and release all its memory. ``reason``: ``stopped`` or ``evicted``.

    The client's open connections stay open, but every call on them then fails with ``gone`` and
    that reason: a workload still running when its Pod is evicted hears why.
    """

    TYPE: ClassVar[str] = "detach"
    client: str
    reason: str = "stopped"


@dataclass(frozen=True)
class Snapshot(Message):
    TYPE: ClassVar[str] = "snapshot"


@dataclass(frozen=True)
class PressureQuery(Message):
    TYPE: ClassVar[str] = "pressure-query"


# ---- replies


@dataclass(frozen=True)
class AdminHelloReply(Message):
    TYPE: ClassVar[str] = "admin-hello-reply"
    node: str
    gpus: tuple[GpuSpec, ...]
    simulated: bool = True


@dataclass(frozen=True)
class AttachReply(Message):
    TYPE: ClassVar[str] = "attach-reply"
    client: str
    token: str  # inject as GPUCONF_SIM_TOKEN into the container; the only copy the node side returns


@dataclass(frozen=True)
class DetachReply(Message):
    TYPE: ClassVar[str] = "detach-reply"
    client: str
    reason: str
    released_bytes: int


@dataclass(frozen=True)
class ClientGpuState:
    ordinal: int
    uuid: str
    hard_limit_bytes: int
    guarantee_bytes: int
    used_bytes: int


@dataclass(frozen=True)
class ClientState:
    """A client as a restarted agent needs it to re-adopt the container. Tokens are not included."""

    name: str
    mode: str
    labels: dict[str, str]
    gpus: tuple[ClientGpuState, ...]
    attached_at: float  # wall clock
    contexts: int  # open connections (CUDA contexts) of this client
    pids: tuple[int, ...]  # peer pids of those connections, where the OS tells them
    faulted: bool


@dataclass(frozen=True)
class GpuState:
    index: int
    uuid: str
    product: str
    capacity_bytes: int
    used_bytes: int
    free_bytes: int
    guaranteed_bytes: int  # sum of attached clients' guarantees: above capacity means overcommitted
    mode: str | None  # the compute mode of its clients; None while it has none
    clients: tuple[str, ...]


@dataclass(frozen=True)
class SnapshotReply(Message):
    TYPE: ClassVar[str] = "snapshot-reply"
    node: str
    taken_at: float
    gpus: tuple[GpuState, ...]
    clients: tuple[ClientState, ...]


@dataclass(frozen=True)
class EvictionCandidate:
    client: str
    used_bytes: int
    guarantee_bytes: int
    overage_bytes: int  # used - guarantee, > 0


@dataclass(frozen=True)
class PressureWaiter:
    """A client within its guarantee that was refused for want of free memory, still waiting."""

    client: str
    needed_bytes: int
    waiting_s: float


@dataclass(frozen=True)
class GpuPressure:
    """Pressure on one GPU, for the evictor.

    ``candidates`` lists every client above its guarantee, largest overage first, whether or not
    there is pressure: they are evictable *only* while ``under_pressure`` holds. ``shortfall_bytes``
    is how much more memory the waiting clients need than the GPU has free.
    """

    index: int
    uuid: str
    under_pressure: bool
    free_bytes: int
    shortfall_bytes: int
    waiting: tuple[PressureWaiter, ...]
    candidates: tuple[EvictionCandidate, ...]


@dataclass(frozen=True)
class PressureStateReply(Message):
    TYPE: ClassVar[str] = "pressure-state"
    gpus: tuple[GpuPressure, ...]


ADMIN_REQUESTS: tuple[type[Message], ...] = (AdminHello, Attach, Detach, Snapshot, PressureQuery)
ADMIN_REPLIES: tuple[type[Message], ...] = (
    AdminHelloReply,
    AttachReply,
    DetachReply,
    SnapshotReply,
    PressureStateReply,
    *ERROR_REPLIES,
)
ADMIN_REQUEST_CODEC = Codec(ADMIN_REQUESTS)
ADMIN_REPLY_CODEC = Codec(ADMIN_REPLIES)

DETACH_REASONS = ("stopped", "evicted")

"""Node-side messages of the simulated GPU device: topology, attach/detach, snapshot, pressure.

These travel only on the admin socket, between the device server and the node agent (or the node
runtime that starts simulated containers). They are kept out of ``workloads.simwire``, which ships
inside workload images: a container has no use for them, and the client socket's codec is built
without them, so it cannot even decode an admin request.

Memory limits are whole MiB here, as the GPU-fraction contract writes them (docs/contract.md §2, §5);
usage is in bytes, as the device accounts it.
"""

from __future__ import annotations

from dataclasses import field

from workloads.simwire import ERROR_REPLIES, Codec, Message, message, record

# ---- topology


@record
class GpuSpec:
    """One simulated GPU of a node."""

    index: int
    uuid: str
    product: str
    memory_mib: int


# ---- requests


@message("admin-hello")
class AdminHello(Message):
    """First message of every admin connection; the token is the server's admin token."""

    token: str


@record
class ClientGpuSpec:
    """One GPU a client is attached to, with its limits on that GPU.

    ``gpu`` names a node GPU by UUID (``GPU-…``) or by node index (``"0"``), as ``gpus.devices``
    does; the client sees the GPUs of its spec as ordinals 0..n-1 in the order given.
    """

    gpu: str
    hard_limit_mib: int  # the annotation's limit: an allocation past it fails with OOM
    guarantee_mib: int  # the annotation's request: the soft limit, protected under pressure


@record
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
    unprotected_memory: bool = False
    """Fence this client's overruns by scrubbing its GPU neighbours' pages (the seeded agent fault
    ``clobber-neighbour``): never the default."""
    device_usage_view: bool = False
    """Show this client's NVML readers (non-CUDA connections: nvidia-smi) the used memory of its GPUs as
    a whole, every client's, instead of its own (the seeded agent fault ``smi-device-used``): never
    the default."""
    device_faults: tuple[str, ...] = ()
    """Seeded agent faults the device commits for this client (``enforcement.sim.model.DEVICE_FAULTS``):
    never set but by a broken agent."""


@message("attach")
class Attach(Message):
    spec: ClientSpec


@message("detach")
class Detach(Message):
    """Detach a client and release all its memory. ``reason``: ``stopped``, ``evicted``, or ``revoked``
    (eviction by CUDA error: the memory is reclaimed and the client, still attached, faults).

    The client's open connections stay open, but every call on them then fails with ``gone`` and
    that reason: a workload still running when its Pod is evicted hears why.
    """

    client: str
    reason: str = "stopped"


@message("snapshot")
class Snapshot(Message):
    """Ask for every GPU's and client's state (a restarted agent re-adopts from it)."""


@message("pressure-query")
class PressureQuery(Message):
    """Ask for each GPU's memory pressure and its eviction candidates."""


# ---- replies


@message("attach-reply")
class AttachReply(Message):
    """The attached container's client name, and the token its workload proves itself with."""

    client: str
    token: str  # inject as GPUCONF_SIM_TOKEN into the container; the only copy the node side returns


@message("detach-reply")
class DetachReply(Message):
    client: str
    reason: str
    released_bytes: int


@message("admin-hello-reply")
class AdminHelloReply(Message):
    """The device's answer to an admin hello: its node and every GPU it simulates."""

    node: str
    gpus: tuple[GpuSpec, ...]
    simulated: bool = True


@record
class ClientGpuState:
    ordinal: int
    uuid: str
    hard_limit_bytes: int
    guarantee_bytes: int
    used_bytes: int


@record
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


@record
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


@message("snapshot-reply")
class SnapshotReply(Message):
    node: str
    taken_at: float
    gpus: tuple[GpuState, ...]
    clients: tuple[ClientState, ...]


@record
class EvictionCandidate:
    client: str
    used_bytes: int
    guarantee_bytes: int
    overage_bytes: int  # used - guarantee, > 0


@record
class PressureWaiter:
    """A client within its guarantee that was refused for want of free memory, still waiting."""

    client: str
    needed_bytes: int
    waiting_s: float


@record
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


@message("pressure-state")
class PressureStateReply(Message):
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

DETACH_REASONS = ("stopped", "evicted", "revoked")

"""The simulated GPUs of one node: memory ledger, limits, pressure, compute modes, fault domains.

This is the device a simulated container talks to instead of CUDA, and the in-process API tests
use directly; ``enforcement.sim.server`` puts it behind Unix sockets. It implements the memory
semantics of docs/contract.md §6 and the compute modes of §7 exactly, and nothing a real GPU would do
besides (no fragmentation, no driver-reserved memory), so that a check that fails on the simulator
fails because of what the scheduler or agent did, not because of simulator noise.

Memory, per allocation of ``n`` bytes by a client on one of its GPUs:

1. usage + n above the client's hard limit: out of memory (``hard-limit``), whatever the GPU holds;
2. n fits in the GPU's free memory: granted. A client between guarantee and hard limit is
   *borrowing*; it keeps what it borrowed while nobody needs it back;
3. the GPU is full and usage + n stays within the client's guarantee: *pressure*. The device
   records the client as waiting, names the eviction candidates (clients above their guarantee on
   that GPU, largest overage first; never one within its guarantee) and refuses with a distinct
   ``pressure`` error rather than blocking. The node agent's evictor reads the pressure over the
   admin socket, evicts candidates through the Kubernetes Eviction API, the node runtime detaches
   them, and the waiting client's retry succeeds. Refusing keeps one request = one reply, so a
   client is never stuck in a call the evictor may never resolve, and a workload decides how long
   to retry. Memory freed while a client waits is reserved for it: a borrower cannot take it first.
   A wait lapses ``pressure_ttl_s`` after the client's last refused attempt, so a client that gave
   up does not keep the evictor evicting. With no candidate at all the guarantees on the GPU add up
   to more than it holds (an overcommitting scheduler): out of memory (``guarantee-unsatisfiable``);
4. otherwise: out of memory (``device-full``).

Compute: kernels of time-slicing clients take a per-GPU FIFO lock for their whole duration, so they
run one at a time in arrival order; sm-sharing kernels run concurrently. A GPU never holds clients
of both modes: attaching one of the other mode is refused, naming both. A fault is sticky, like
CUDA's illegal-address error: in time-slicing it hits the faulting client only, in sm-sharing every
client of that GPU (one shared MPS server, one fault domain); a kernel running at that moment fails.
A time-slicing client attached with ``shared_fault_domain`` (only a broken agent asks for it) shares
one fault domain with the GPU's other such clients, and still takes turns with them.

Content: the device does not keep bytes, it keeps what each allocation was last written with
(``touch``: one byte pattern) and how much of it was overwritten since, so ``verify`` answers as a
read-back would. A client attached with ``unprotected_memory`` (only a broken agent asks for it) is
fenced by reclaiming: its allocation past its hard limit is still refused, but the pages it asked
for are first scrubbed (zeroed) out of its GPU neighbours' memory.

Ownership: a ``Context`` is one client connection, the analogue of a CUDA context. Its allocations
are released when it closes, so a process that dies without freeing (its socket closed by the
kernel) gives its memory back. Detaching a client (container stopped or evicted) releases all its
contexts' memory; calls on them then fail with ``gone`` and the reason.

One lock guards the ledger; a call holds it for microseconds. Kernels wait outside it.
"""

from __future__ import annotations

import collections
import hmac
import itertools
import secrets
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field

from enforcement.clock import REAL, Clock
from workloads.simwire import (
    COMPUTE_MODES,
    OOM_DEVICE_FULL,
    OOM_GUARANTEE_UNSATISFIABLE,
    OOM_HARD_LIMIT,
    TOUCH_PATTERN,
    AllocReply,
    BadRequestReply,
    DeniedReply,
    DeviceMemory,
    FaultReply,
    FreeReply,
    GoneReply,
    HelloReply,
    KernelReply,
    MemInfoReply,
    MiB,
    ModeConflictReply,
    OomReply,
    PressureReply,
    TouchReply,
    VerifyReply,
    VisibleDevice,
    error,
)

from .fidelity import IDEAL, Fidelity
from .fidelity import fidelity as fidelity_named
from .messages import (
    DETACH_REASONS,
    AttachReply,
    ClientGpuState,
    ClientSpec,
    ClientState,
    DetachReply,
    EvictionCandidate,
    GpuPressure,
    GpuSpec,
    GpuState,
    PressureWaiter,
    SnapshotReply,
)

CONTEXT_OUTSIDE_LIMIT = "context-outside-limit"
"""A seeded agent fault the device commits: the CUDA context's memory is charged to the device and
shown in the client's used memory, but not counted against its hard limit (so the client holds its
limit plus its context). The ideal fidelity has no context; there the fault brings one of
``OUTSIDE_CONTEXT_BYTES`` (a node whose runtime keeps per-process memory outside the limit)."""
FREE_SUB_PAGE = "free-sub-page"
"""A seeded agent fault the device commits: an allocation smaller than a page
(``SUB_PAGE_BYTES``, the H200's 2 MiB, in either fidelity) is granted but not charged."""
CUDA_ENUMERATES_ALL = "cuda-enumerates-all"
"""A seeded agent fault the device commits: CUDA in the container enumerates every GPU of the node,
its own first, the others whole (their memory as total); its memory view and ``nvidia-smi`` still
show only its own."""
DEVICE_FAULTS = (CONTEXT_OUTSIDE_LIMIT, FREE_SUB_PAGE, CUDA_ENUMERATES_ALL)
OUTSIDE_CONTEXT_BYTES = 64 * MiB
"""The context the fault ``context-outside-limit`` brings on the ideal device, which has none."""
SUB_PAGE_BYTES = 2 * MiB
"""What the fault ``free-sub-page`` takes as a page, in either fidelity."""

# A kernel holds a server thread (and, in time-slicing, the GPU) for its duration; a typo of
# seconds for milliseconds should not wedge a GPU for hours.
MAX_KERNEL_SECONDS = 600.0
DEFAULT_PRESSURE_TTL_S = 30.0


def _bad(message: str) -> Exception:
    return error(BadRequestReply(message=message))


def _fmt_bytes(n: int) -> str:
    if n % MiB == 0:
        return f"{n // MiB} MiB"
    return f"{n} bytes"


class FairLock:
    """A FIFO lock: waiters get it in arrival order, as time-slicing hands out turns.

    ``threading.Lock`` makes no ordering promise; a client issuing kernels back to back could win
    it again and again and starve its neighbour, which is not what time-slicing does.
    """

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._queue: collections.deque[object] = collections.deque()
        self._held = False

    def acquire(self) -> None:
        ticket = object()
        with self._cond:
            self._queue.append(ticket)
            while self._held or self._queue[0] is not ticket:
                self._cond.wait()
            self._queue.popleft()
            self._held = True

    def waiting(self) -> int:
        """How many are queued for the lock now (a test stages a queue before letting it go)."""
        with self._cond:
            return len(self._queue)

    def release(self) -> None:
        with self._cond:
            self._held = False
            self._cond.notify_all()


@dataclass(eq=False)
class _Gpu:
    spec: GpuSpec
    capacity: int
    used: int = 0
    clients: dict[str, _ClientGpu] = field(default_factory=dict)  # client name -> its share of this GPU
    waiters: dict[str, _Waiter] = field(default_factory=dict)  # client name -> its pressure wait
    lock: FairLock = field(default_factory=FairLock)
    # The kernel cost model (h200): SM shares of the kernels running now, and recent kernel spans
    # (client, start, end) to count how long each kernel shared the GPU with another client's.
    running: dict[int, tuple[str, float, float]] = field(default_factory=dict)  # id -> (client, sm, start)
    spans: collections.deque[tuple[str, float, float]] = field(
        default_factory=lambda: collections.deque(maxlen=512)
    )

    @property
    def free(self) -> int:
        return self.capacity - self.used


@dataclass(eq=False)
class _ClientGpu:
    client: _Client
    ordinal: int
    gpu: _Gpu
    hard: int
    guarantee: int
    used: int = 0
    outside: int = 0
    """Of ``used``, context memory not counted against ``hard`` (the fault ``context-outside-limit``)."""

    @property
    def overage(self) -> int:
        return self.used - self.guarantee


@dataclass(eq=False)
class _Waiter:
    share: _ClientGpu
    needed: int
    since: float
    last: float


@dataclass(eq=False)
class _Client:
    name: str
    token: str
    mode: str
    labels: dict[str, str]
    gpus: list[_ClientGpu]
    attached_at: float
    contexts: set[Context] = field(default_factory=set)
    shared_fault_domain: bool = False
    """In its GPUs' shared fault domain even in time-slicing (``ClientSpec.shared_fault_domain``)."""
    unprotected_memory: bool = False
    """Its overruns are fenced by reclaiming neighbours' pages (``ClientSpec.unprotected_memory``)."""
    device_usage_view: bool = False
    """Its NVML readers see its GPUs' whole usage (``ClientSpec.device_usage_view``)."""
    device_faults: frozenset[str] = frozenset()
    """Seeded faults the device commits for it (``DEVICE_FAULTS``; ``ClientSpec.device_faults``)."""
    fault: FaultReply | None = None
    gone: GoneReply | None = None
    # Set on fault or detach: wakes this client's running kernel so it fails at once.
    interrupt: threading.Event = field(default_factory=threading.Event)


@dataclass(eq=False)
class _Allocation:
    share: _ClientGpu
    nbytes: int
    pattern: int | None = None
    """The byte its last ``touch`` wrote into all of it; None: never written (its content undefined)."""
    clobbered: int = 0
    """Bytes overwritten since that touch by something else than its owner (see ``unprotected_memory``)."""


class Context:
    """One open connection of a client: the analogue of a CUDA context, owner of its allocations."""

    _ids = itertools.count(1)

    def __init__(self, client: _Client, pid: int | None, cuda: bool = True) -> None:
        self.id = next(Context._ids)
        self.pid = pid
        # A CUDA process's connection, or an NVML reader's (the simulated nvidia-smi): they see the
        # same figures, but where a broken agent configured the NVML view (device_usage_view).
        self.cuda = cuda
        self._client = client
        self._allocations: dict[int, _Allocation] = {}
        self._handles = itertools.count(1)
        self.closed = False
        # h200: the CUDA context's own memory, per device ordinal, once charged (see SimNode.fidelity).
        self._reserved: dict[int, int] = {}

    @property
    def client_name(self) -> str:
        return self._client.name


class SimNode:
    """The simulated GPUs of one node and the clients attached to them. Thread-safe."""

    def __init__(
        self,
        node: str,
        gpus: Iterable[GpuSpec],
        *,
        pressure_ttl_s: float = DEFAULT_PRESSURE_TTL_S,
        clock: Clock = REAL,
        fidelity: Fidelity | str = IDEAL,
    ) -> None:
        self.node = node
        self.fidelity = fidelity_named(fidelity) if isinstance(fidelity, str) else fidelity
        self.pressure_ttl_s = pressure_ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._gpus: list[_Gpu] = []
        for spec in gpus:
            if spec.memory_mib < 1:
                raise ValueError(f"GPU {spec.index} of node {node}: memory must be at least 1 MiB")
            if any(g.spec.index == spec.index or g.spec.uuid == spec.uuid for g in self._gpus):
                raise ValueError(f"node {node}: GPU index {spec.index} or UUID {spec.uuid} given twice")
            self._gpus.append(_Gpu(spec=spec, capacity=spec.memory_mib * MiB))
        if not self._gpus:
            raise ValueError(f"node {node} has no GPUs")
        self._clients: dict[str, _Client] = {}
        self._by_token: dict[str, _Client] = {}
        self._tombstones: dict[str, GoneReply] = {}  # token -> why its client went

    @property
    def gpus(self) -> tuple[GpuSpec, ...]:
        return tuple(g.spec for g in self._gpus)

    # ---------------------------------------------------------------------------------------------
    # Node-side (admin) operations

    def attach(self, spec: ClientSpec) -> AttachReply:
        """Attach a container; returns the token to inject into it."""
        if not spec.name:
            raise _bad("client name must not be empty")
        if spec.mode not in COMPUTE_MODES:
            raise _bad(
                f"client {spec.name}: compute mode {spec.mode!r} is not one of {', '.join(COMPUTE_MODES)}"
            )
        if not spec.gpus:
            raise _bad(f"client {spec.name}: no GPUs given")
        unknown = sorted(set(spec.device_faults) - set(DEVICE_FAULTS))
        if unknown:
            raise _bad(f"client {spec.name}: unknown device fault(s) {', '.join(unknown)}")
        for g in spec.gpus:
            if g.guarantee_mib < 1 or g.hard_limit_mib < g.guarantee_mib:
                raise _bad(
                    f"client {spec.name}, GPU {g.gpu}: need 1 MiB <= guarantee ({g.guarantee_mib} MiB) "
                    f"<= hard limit ({g.hard_limit_mib} MiB)"
                )
        with self._lock:
            if spec.name in self._clients:
                raise _bad(f"client {spec.name} is already attached on node {self.node}")
            resolved = [self._resolve_gpu(spec.name, g.gpu) for g in spec.gpus]
            if len({id(g) for g in resolved}) != len(resolved):
                raise _bad(f"client {spec.name}: a GPU is listed twice")
            for gpu in resolved:
                for other in gpu.clients.values():
                    if other.client.mode != spec.mode:
                        raise error(
                            ModeConflictReply(
                                message=(
                                    f"GPU {gpu.spec.uuid} (index {gpu.spec.index}) on node {self.node} holds "
                                    f"{other.client.mode} client {other.client.name} and cannot take "
                                    f"{spec.mode} client {spec.name}: time-slicing and sm-sharing never "
                                    "share a GPU"
                                ),
                                uuid=gpu.spec.uuid,
                                client=spec.name,
                                mode=spec.mode,
                                other_client=other.client.name,
                                other_mode=other.client.mode,
                            )
                        )
            token = secrets.token_hex(16)
            client = _Client(
                name=spec.name,
                token=token,
                mode=spec.mode,
                labels=dict(spec.labels),
                gpus=[],
                attached_at=self._clock.time(),
                shared_fault_domain=spec.shared_fault_domain,
                unprotected_memory=spec.unprotected_memory,
                device_usage_view=spec.device_usage_view,
                device_faults=frozenset(spec.device_faults),
            )
            for ordinal, (g, gpu) in enumerate(zip(spec.gpus, resolved, strict=True)):
                share = _ClientGpu(
                    client=client,
                    ordinal=ordinal,
                    gpu=gpu,
                    hard=g.hard_limit_mib * MiB,
                    guarantee=g.guarantee_mib * MiB,
                )
                client.gpus.append(share)
                gpu.clients[spec.name] = share
            self._clients[spec.name] = client
            self._by_token[token] = client
            return AttachReply(client=spec.name, token=token)

    def _resolve_gpu(self, client: str, ref: str) -> _Gpu:
        for gpu in self._gpus:
            if ref == gpu.spec.uuid or ref == str(gpu.spec.index):
                return gpu
        raise _bad(f"client {client}: node {self.node} has no GPU {ref!r}")

    def detach(self, name: str, reason: str = "stopped") -> DetachReply:
        """Detach a client (container stopped, or evicted) and release all of its memory."""
        if reason not in DETACH_REASONS:
            raise _bad(f"detach reason {reason!r} is not one of {', '.join(DETACH_REASONS)}")
        with self._lock:
            if reason == "revoked":
                return self._revoke(name)
            client = self._clients.pop(name, None)
            if client is None:
                raise _bad(f"no client {name} is attached on node {self.node}")
            released = sum(s.used for s in client.gpus)
            for share in client.gpus:
                share.gpu.used -= share.used
                share.used = share.outside = 0
                del share.gpu.clients[name]
                share.gpu.waiters.pop(name, None)
            for ctx in client.contexts:
                ctx._allocations.clear()
                ctx._reserved.clear()
            gone = GoneReply(
                message=f"client {name} was {'evicted' if reason == 'evicted' else 'detached'} from "
                f"node {self.node}; its GPU memory was released",
                reason=reason,
            )
            client.gone = gone
            client.interrupt.set()
            del self._by_token[client.token]
            self._tombstones[client.token] = gone
            return DetachReply(client=name, reason=reason, released_bytes=released)

    def _revoke(self, name: str) -> DetachReply:
        """Evict by failing the client's CUDA calls (a node agent's ``--evict-by cuda-error``): all its
        memory is reclaimed at once, and its next call, or the kernel it runs, fails with a sticky
        CUDA-style error. It stays attached (its container has not stopped) with nothing held."""
        client = self._clients.get(name)
        if client is None:
            raise _bad(f"no client {name} is attached on node {self.node}")
        released = 0
        for share in client.gpus:
            released += share.used
            share.gpu.used -= share.used
            share.used = share.outside = 0
            share.gpu.waiters.pop(name, None)
        for ctx in client.contexts:
            ctx._allocations.clear()
            ctx._reserved = {k: -1 for k in ctx._reserved}
        first = client.gpus[0]
        if client.fault is None:
            client.fault = FaultReply(
                message=(
                    "CUDA error: out of memory (as cudaErrorMemoryAllocation; simulated): the node's memory "
                    f"manager reclaimed the memory of {name}, which borrowed beyond its guarantee on GPU "
                    f"{first.gpu.spec.uuid} under pressure; this context is no longer usable"
                ),
                device=first.ordinal,
                uuid=first.gpu.spec.uuid,
                origin="memory-manager",
            )
        client.interrupt.set()
        return DetachReply(client=name, reason="revoked", released_bytes=released)

    def evict(self, name: str) -> DetachReply:
        return self.detach(name, "evicted")

    def snapshot(self) -> SnapshotReply:
        """Everything a restarted agent needs to re-adopt the clients. Tokens are left out."""
        with self._lock:
            gpus = tuple(
                GpuState(
                    index=g.spec.index,
                    uuid=g.spec.uuid,
                    product=g.spec.product,
                    capacity_bytes=g.capacity,
                    used_bytes=g.used,
                    free_bytes=g.free,
                    guaranteed_bytes=sum(s.guarantee for s in g.clients.values()),
                    mode=next((s.client.mode for s in g.clients.values()), None),
                    clients=tuple(sorted(g.clients)),
                )
                for g in self._gpus
            )
            clients = tuple(
                ClientState(
                    name=c.name,
                    mode=c.mode,
                    labels=dict(c.labels),
                    gpus=tuple(
                        ClientGpuState(
                            ordinal=s.ordinal,
                            uuid=s.gpu.spec.uuid,
                            hard_limit_bytes=s.hard,
                            guarantee_bytes=s.guarantee,
                            used_bytes=s.used,
                        )
                        for s in c.gpus
                    ),
                    attached_at=c.attached_at,
                    contexts=len(c.contexts),
                    pids=tuple(sorted({ctx.pid for ctx in c.contexts if ctx.pid})),
                    faulted=c.fault is not None,
                )
                for c in sorted(self._clients.values(), key=lambda c: c.name)
            )
            return SnapshotReply(node=self.node, taken_at=self._clock.time(), gpus=gpus, clients=clients)

    def pressure(self) -> tuple[GpuPressure, ...]:
        """Per GPU: is there real pressure, who waits, and whom the evictor may evict, in order."""
        with self._lock:
            now = self._clock.monotonic()
            out = []
            for gpu in self._gpus:
                waiters = self._active_waiters(gpu, now)
                needed = sum(w.needed for w in waiters)
                out.append(
                    GpuPressure(
                        index=gpu.spec.index,
                        uuid=gpu.spec.uuid,
                        under_pressure=bool(waiters) and needed > gpu.free,
                        free_bytes=gpu.free,
                        shortfall_bytes=max(0, needed - gpu.free),
                        waiting=tuple(
                            PressureWaiter(
                                client=w.share.client.name, needed_bytes=w.needed, waiting_s=now - w.since
                            )
                            for w in waiters
                        ),
                        candidates=tuple(
                            EvictionCandidate(
                                client=s.client.name,
                                used_bytes=s.used,
                                guarantee_bytes=s.guarantee,
                                overage_bytes=s.overage,
                            )
                            for s in self._candidates(gpu)
                        ),
                    )
                )
            return tuple(out)

    # ---------------------------------------------------------------------------------------------
    # Client operations

    def open_context(
        self, token: str, pid: int | None = None, *, cuda: bool = True
    ) -> tuple[Context, HelloReply]:
        """Bind a new connection to the client ``token`` names.

        h200: a CUDA process (``cuda``; not the simulated nvidia-smi) is charged its context's
        memory on every device it sees, where that fits its limit and the GPU; where it does not
        yet (a full GPU), with its first allocation there, which then fails or waits as any would.
        """
        with self._lock:
            client = self._find_token(token)
            ctx = Context(client, pid, cuda)
            client.contexts.add(ctx)
            reserve = self._context_size(client) if cuda else 0
            outside = CONTEXT_OUTSIDE_LIMIT in client.device_faults
            for share in client.gpus:
                ctx._reserved[share.ordinal] = 0 if reserve else -1
                fits = outside or share.used + reserve <= share.hard
                if reserve and fits and reserve <= share.gpu.free:
                    self._charge_context(ctx, share)
            devices = [
                VisibleDevice(
                    ordinal=s.ordinal,
                    uuid=s.gpu.spec.uuid,
                    name=s.gpu.spec.product,
                    total_bytes=s.hard,
                    guarantee_bytes=s.guarantee,
                )
                for s in client.gpus
            ]
            if CUDA_ENUMERATES_ALL in client.device_faults:
                # Seeded fault: CUDA enumerates the node's other GPUs too, whole, after its own.
                own = {id(s.gpu) for s in client.gpus}
                devices += [
                    VisibleDevice(
                        ordinal=len(devices) + i,
                        uuid=g.spec.uuid,
                        name=g.spec.product,
                        total_bytes=g.capacity,
                        guarantee_bytes=0,
                    )
                    for i, g in enumerate(g for g in self._gpus if id(g) not in own)
                ]
            hello = HelloReply(
                client=client.name,
                node=self.node,
                mode=client.mode,
                devices=tuple(devices),
                fidelity=self.fidelity.name,
                context_bytes=self.fidelity.context_bytes,
                granularity_bytes=self.fidelity.granularity_bytes,
            )
            return ctx, hello

    def _context_size(self, client: _Client) -> int:
        """A CUDA context's memory on each device (h200; on the ideal device none, but where the
        seeded fault ``context-outside-limit`` brings one)."""
        if CONTEXT_OUTSIDE_LIMIT in client.device_faults:
            return self.fidelity.context_bytes or OUTSIDE_CONTEXT_BYTES
        return self.fidelity.context_bytes

    def _charge_context(self, ctx: Context, share: _ClientGpu) -> None:
        reserve = self._context_size(share.client)
        ctx._reserved[share.ordinal] = reserve
        share.used += reserve
        share.gpu.used += reserve
        if CONTEXT_OUTSIDE_LIMIT in share.client.device_faults:
            share.outside += reserve  # seeded fault: charged, but not against the limit

    def _context_owed(self, ctx: Context, share: _ClientGpu) -> int:
        """Context memory this connection still owes on the share's device (h200), else 0."""
        return self._context_size(share.client) if ctx._reserved.get(share.ordinal) == 0 else 0

    def _find_token(self, token: str) -> _Client:
        # Compare in constant time against each known token: a lookup by dict key would leak, through
        # timing, how much of a guessed token is right. Nodes have tens of clients, not millions.
        for known, client in self._by_token.items():
            if hmac.compare_digest(known, token):
                return client
        for known, gone in self._tombstones.items():
            if hmac.compare_digest(known, token):
                raise error(gone)
        raise error(DeniedReply(message=f"unknown client token for the simulated GPUs of node {self.node}"))

    def close_context(self, ctx: Context) -> int:
        """The connection closed (or its process died): release what it allocated. Returns bytes."""
        with self._lock:
            if ctx.closed:
                return 0
            ctx.closed = True
            ctx._client.contexts.discard(ctx)
            released = 0
            for alloc in ctx._allocations.values():
                alloc.share.used -= alloc.nbytes
                alloc.share.gpu.used -= alloc.nbytes
                released += alloc.nbytes
            ctx._allocations.clear()
            if ctx._client.gone is None:
                outside = CONTEXT_OUTSIDE_LIMIT in ctx._client.device_faults
                for share in ctx._client.gpus:
                    reserved = max(0, ctx._reserved.get(share.ordinal, 0))
                    share.used -= reserved
                    share.gpu.used -= reserved
                    if outside:
                        share.outside = max(0, share.outside - reserved)
                    released += reserved
            ctx._reserved.clear()
            return released

    def _usable(self, ctx: Context) -> _Client:
        client = ctx._client
        if ctx.closed:
            raise _bad("this connection's context is closed")
        if client.gone is not None:
            raise error(client.gone)
        if client.fault is not None:
            raise error(client.fault)
        return client

    @staticmethod
    def _share(client: _Client, device: int) -> _ClientGpu:
        if not 0 <= device < len(client.gpus):
            raise _bad(
                f"device ordinal {device} is not visible to client {client.name} "
                f"(it sees {len(client.gpus)} device(s): 0..{len(client.gpus) - 1})"
            )
        return client.gpus[device]

    def alloc(self, ctx: Context, device: int, asked: int) -> AllocReply:
        if asked < 1:
            raise _bad(f"allocation size must be at least 1 byte, got {asked}")
        with self._lock:
            client = self._usable(ctx)
            share = self._share(client, device)
            gpu = share.gpu
            # h200: whole pages, and the context's memory if this connection has not paid it yet.
            owed = self._context_owed(ctx, share)
            nbytes = self.fidelity.charge(asked) + owed
            counted = nbytes
            if client.device_faults:
                if FREE_SUB_PAGE in client.device_faults and asked < SUB_PAGE_BYTES:
                    nbytes = counted = owed  # seeded fault: granted, not charged
                if CONTEXT_OUTSIDE_LIMIT in client.device_faults:
                    counted = nbytes - owed  # seeded fault: the context is not the limit's business
            if share.used - share.outside + counted > share.hard:
                if client.unprotected_memory:
                    self._clobber_neighbours(share, nbytes)
                raise self._oom(
                    share, nbytes, OOM_HARD_LIMIT, f"would exceed its hard limit of {_fmt_bytes(share.hard)}"
                )
            within_guarantee = share.used + nbytes <= share.guarantee
            available = gpu.free
            if not within_guarantee:
                # Borrowing: memory freed for clients waiting on their guarantee is theirs, not ours.
                now = self._clock.monotonic()
                available -= sum(w.needed for w in self._active_waiters(gpu, now) if w.share is not share)
            if nbytes > available:
                if not within_guarantee:
                    raise self._oom(
                        share,
                        nbytes,
                        OOM_DEVICE_FULL,
                        f"GPU has {_fmt_bytes(max(available, 0))} available and the client is beyond its "
                        f"guarantee of {_fmt_bytes(share.guarantee)}",
                    )
                candidates = self._candidates(gpu)
                if not candidates:
                    raise self._oom(
                        share,
                        nbytes,
                        OOM_GUARANTEE_UNSATISFIABLE,
                        "the client is within its guarantee but the GPU is full and no client is above its "
                        "guarantee: the guarantees on this GPU exceed its memory",
                    )
                now = self._clock.monotonic()
                waiter = gpu.waiters.get(client.name)
                if waiter is None or now - waiter.last > self.pressure_ttl_s:
                    gpu.waiters[client.name] = _Waiter(share=share, needed=nbytes, since=now, last=now)
                else:  # a retry: refresh the wait, keep when it began
                    waiter.needed, waiter.last = nbytes, now
                names = tuple(s.client.name for s in candidates)
                if self.fidelity.pressure_as_oom:
                    # As CUDA says it: out of memory. The wait is recorded; the agent sees the pressure.
                    raise self._oom(
                        share,
                        nbytes,
                        OOM_DEVICE_FULL,
                        f"GPU {gpu.spec.uuid} is full; the client is within its guarantee of "
                        f"{_fmt_bytes(share.guarantee)}, and borrowers above theirs hold the memory "
                        f"({', '.join(names)})",
                    )
                raise error(
                    PressureReply(
                        message=(
                            f"simulated GPU {gpu.spec.uuid} is full: {_fmt_bytes(nbytes)} for {client.name} "
                            f"(within its guarantee of {_fmt_bytes(share.guarantee)}) needs eviction of "
                            f"clients above their guarantee: {', '.join(names)}"
                        ),
                        device=device,
                        uuid=gpu.spec.uuid,
                        requested_bytes=nbytes,
                        used_bytes=share.used,
                        guarantee_bytes=share.guarantee,
                        shortfall_bytes=nbytes - gpu.free,
                        candidates=names,
                    )
                )
            handle = next(ctx._handles)
            if owed:
                self._charge_context(ctx, share)
                nbytes -= owed
            ctx._allocations[handle] = _Allocation(share=share, nbytes=nbytes)
            share.used += nbytes
            gpu.used += nbytes
            gpu.waiters.pop(client.name, None)
            return AllocReply(handle=handle, device=device, nbytes=nbytes, used_bytes=share.used)

    def _oom(self, share: _ClientGpu, nbytes: int, reason: str, why: str) -> Exception:
        return error(
            OomReply(
                message=(
                    f"out of memory (simulated): {_fmt_bytes(nbytes)} on device {share.ordinal} for "
                    f"{share.client.name} holding {_fmt_bytes(share.used)}: {why}"
                ),
                device=share.ordinal,
                requested_bytes=nbytes,
                used_bytes=share.used,
                limit_bytes=share.hard,
                reason=reason,
            )
        )

    def _active_waiters(self, gpu: _Gpu, now: float) -> list[_Waiter]:
        expired = [n for n, w in gpu.waiters.items() if now - w.last > self.pressure_ttl_s]
        for name in expired:
            del gpu.waiters[name]
        # A waiter whose own usage has since grown past its guarantee is no longer owed anything.
        return [w for w in gpu.waiters.values() if w.share.used + w.needed <= w.share.guarantee]

    @staticmethod
    def _candidates(gpu: _Gpu) -> list[_ClientGpu]:
        over = [s for s in gpu.clients.values() if s.overage > 0]
        over.sort(key=lambda s: (-s.overage, s.client.name))
        return over

    def free(self, ctx: Context, handle: int) -> FreeReply:
        with self._lock:
            self._usable(ctx)
            alloc = ctx._allocations.pop(handle, None)
            if alloc is None:
                raise _bad(f"unknown allocation handle {handle} in this context")
            alloc.share.used -= alloc.nbytes
            alloc.share.gpu.used -= alloc.nbytes
            return FreeReply(
                handle=handle, device=alloc.share.ordinal, nbytes=alloc.nbytes, used_bytes=alloc.share.used
            )

    def _clobber_neighbours(self, share: _ClientGpu, nbytes: int) -> None:
        """A broken fence's overrun (``unprotected_memory``): the pages the overrunning allocation
        asked for are scrubbed out of the GPU's other clients' written memory, oldest context first,
        though the allocation itself is still refused. Caller holds the lock."""
        left = nbytes
        for other in self._clients.values():
            if other is share.client:
                continue
            for ctx in sorted(other.contexts, key=lambda c: c.id):
                for alloc in ctx._allocations.values():
                    if left <= 0:
                        return
                    if alloc.share.gpu is share.gpu and alloc.pattern is not None:
                        taken = min(left, alloc.nbytes - alloc.clobbered)
                        alloc.clobbered += taken
                        left -= taken

    def touch(self, ctx: Context, handle: int, pattern: int = TOUCH_PATTERN) -> TouchReply:
        if not 0 <= pattern <= 0xFF:
            raise _bad(f"a touch pattern is one byte (0..255), got {pattern}")
        with self._lock:
            self._usable(ctx)
            alloc = ctx._allocations.get(handle)
            if alloc is None:
                raise _bad(f"unknown allocation handle {handle} in this context")
            alloc.pattern, alloc.clobbered = pattern, 0
            return TouchReply(handle=handle, nbytes=alloc.nbytes)

    def verify(self, ctx: Context, handle: int, pattern: int) -> VerifyReply:
        """Read an allocation back: the bytes that do not hold ``pattern`` (scrubbed ones read zero)."""
        with self._lock:
            self._usable(ctx)
            alloc = ctx._allocations.get(handle)
            if alloc is None:
                raise _bad(f"unknown allocation handle {handle} in this context")
            # Never written: nothing in it was put there by its owner, whatever it is asked about.
            matched = 0
            if alloc.pattern is not None:
                matched = (alloc.nbytes - alloc.clobbered if alloc.pattern == pattern else 0) + (
                    alloc.clobbered if pattern == 0 else 0  # scrubbed pages read zero
                )
            mismatched = alloc.nbytes - matched
            return VerifyReply(handle=handle, nbytes=alloc.nbytes, mismatched_bytes=mismatched)

    def meminfo(self, ctx: Context) -> MemInfoReply:
        """What the NVML shim shows the container: total = its hard limit, used = its own usage (for
        an NVML reader of a ``device_usage_view`` client, a broken agent's, the GPU's whole usage)."""
        with self._lock:
            client = self._usable(ctx)
            whole = client.device_usage_view and not ctx.cuda

            def used(s: _ClientGpu) -> int:
                return s.gpu.used if whole else s.used

            return MemInfoReply(
                devices=tuple(
                    DeviceMemory(
                        ordinal=s.ordinal,
                        uuid=s.gpu.spec.uuid,
                        name=s.gpu.spec.product,
                        total_bytes=s.hard,
                        used_bytes=used(s),
                        free_bytes=max(
                            0,
                            min(s.hard - used(s), s.gpu.free)
                            if self.fidelity.pressure_as_oom
                            else s.hard - used(s),
                        ),
                    )
                    for s in client.gpus
                )
            )

    def kernel(
        self, ctx: Context, device: int, seconds: float, sm_fraction: float = 1.0, streams: int = 1
    ) -> KernelReply:
        """Keep the device busy for ``seconds``; time-slicing clients of a GPU take turns.

        ``ideal``: the kernel takes exactly ``seconds``, and a time-slicing one holds the GPU for all
        of it. ``h200`` (the cost model): it advances at ``min(1, 1 / load)`` of its solo speed,
        where ``load`` is the SM share of every kernel running on the GPU at that moment (its own
        ``streams`` copies included), so one kernel that fills the GPU halves a neighbour's speed
        and small ones leave it whole; a time-slicing client holds the GPU one slice at a time.
        """
        if not 0 < seconds <= MAX_KERNEL_SECONDS:
            raise _bad(f"kernel duration must be in (0, {MAX_KERNEL_SECONDS:g}] seconds, got {seconds}")
        if not 0 < sm_fraction <= 1 or not 1 <= streams <= 8:
            raise _bad(f"kernel: need 0 < sm_fraction <= 1, 1 <= streams <= 8; got {sm_fraction}, {streams}")
        with self._lock:
            client = self._usable(ctx)
            share = self._share(client, device)
        exclusive = client.mode == "time-slicing"
        gpu = share.gpu
        queued = self._clock.time()
        if not self.fidelity.kernel_cost_model:
            if exclusive:
                gpu.lock.acquire()
            try:
                start = self._clock.time()
                self._run_begin(gpu, client.name, 1.0, start)
                try:
                    interrupted = client.interrupt.is_set() or self._clock.wait(client.interrupt, seconds)
                finally:
                    end = self._clock.time()
                    shared = self._run_end(gpu, client.name, start, end)
            finally:
                if exclusive:
                    gpu.lock.release()
        else:
            start, end, shared, interrupted = self._modelled(gpu, client, seconds, sm_fraction * streams)
        if interrupted:
            with self._lock:
                self._usable(ctx)  # raises the fault or the detach that interrupted us
        return KernelReply(
            device=device,
            start=start,
            end=end,
            waited_s=start - queued,
            shared_s=round(shared, 6),
            work_s=seconds * streams,
        )

    _TICK_S = 0.002

    def _modelled(
        self, gpu: _Gpu, client: _Client, seconds: float, load: float
    ) -> tuple[float, float, float, bool]:
        """The h200 cost model (see ``kernel``): returns start, end, time shared, interrupted."""
        exclusive = client.mode == "time-slicing"
        slice_s = self.fidelity.timeslice_s or seconds
        done = 0.0
        start: float | None = None
        shared = 0.0
        interrupted = False
        key = id(threading.current_thread()) ^ id(client)
        while done < seconds - 1e-9 and not interrupted:
            if exclusive:
                gpu.lock.acquire()
            try:
                turn_start = self._clock.time()
                if start is None:
                    start = turn_start
                with self._lock:
                    gpu.running[key] = (client.name, load, turn_start)
                turn_end_by = turn_start + (slice_s if exclusive else float("inf"))
                last = turn_start
                while done < seconds - 1e-9:
                    with self._lock:
                        total = sum(sm for _c, sm, _s in gpu.running.values())
                        others = any(c != client.name for c, _sm, _s in gpu.running.values())
                    speed = min(1.0, 1.0 / total) if total > 0 else 1.0
                    step = min(self._TICK_S, (seconds - done) / speed, max(0.0, turn_end_by - last))
                    if step <= 0:
                        break
                    if self._clock.wait(client.interrupt, step):
                        interrupted = True
                        break
                    now = self._clock.time()
                    done += (now - last) * speed
                    if others:
                        shared += now - last
                    last = now
                with self._lock:
                    gpu.running.pop(key, None)
                    gpu.spans.append((client.name, turn_start, last))
            finally:
                if exclusive:
                    gpu.lock.release()
        end = self._clock.time()
        return start if start is not None else end, end, shared, interrupted

    def _run_begin(self, gpu: _Gpu, name: str, load: float, start: float) -> None:
        with self._lock:
            gpu.running[id(threading.current_thread())] = (name, load, start)

    def _run_end(self, gpu: _Gpu, name: str, start: float, end: float) -> float:
        """Ends an ideal kernel's span; returns how long another client's kernel ran beside it."""
        with self._lock:
            gpu.running.pop(id(threading.current_thread()), None)
            shared = 0.0
            for other, s, e in gpu.spans:
                if other != name:
                    shared += max(0.0, min(end, e) - max(start, s))
            for other, _load, s in gpu.running.values():
                if other != name:
                    shared += max(0.0, end - max(start, s))
            gpu.spans.append((name, start, end))
            return min(shared, end - start)

    def fault(self, ctx: Context, device: int) -> FaultReply:
        """Fault on purpose. Always raises ``SimFault``; the annotation names what it carries."""
        with self._lock:
            client = self._usable(ctx)
            share = self._share(client, device)
            gpu = share.gpu
            if client.mode == "sm-sharing":
                victims = list(gpu.clients.values())  # one MPS server per GPU: one fault domain
                scope = f"; sm-sharing clients of a GPU share a fault domain, so all {len(victims)} failed"
            elif client.shared_fault_domain:
                victims = [s for s in gpu.clients.values() if s.client.shared_fault_domain]
                scope = (
                    "; this time-slicing client was put in the GPU's shared fault domain, so all "
                    f"{len(victims)} in it failed"
                )
            else:
                victims = [share]
                scope = "; time-slicing isolates faults, neighbours are unaffected"
            for victim in victims:
                if victim.client.fault is None:
                    victim.client.fault = FaultReply(
                        message=(
                            "simulated sticky device fault: an illegal memory access was encountered "
                            f"(as cudaErrorIllegalAddress) on GPU {gpu.spec.uuid}, raised by a kernel of "
                            f"{client.name}{scope}"
                        ),
                        device=victim.ordinal,
                        uuid=gpu.spec.uuid,
                        origin=client.name,
                    )
                victim.client.interrupt.set()
            assert client.fault is not None
            raise error(client.fault)

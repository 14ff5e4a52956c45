"""The ``sim`` backend: the simulated GPU device of ``enforcement.sim``, driven over its admin socket.

An adapter, nothing more: the device model already enforces hard limits, guarantees, pressure and
compute modes (``enforcement.sim.model``); this module translates between its admin messages and
the backend-neutral values of ``enforcement.backends``.

Built so because:

- **Two admin connections** (``control`` for attach/detach/evict, ``poll`` for the evictor's and
  the metrics' reads): a snapshot of a node with a thousand clients must not hold up the
  CreateContainer of the next one, and each connection serialises its own requests.
- **Reconnect on demand.** The device server may be restarted (the node condition then flips);
  a dead connection is dropped and the next call dials again, so the agent needs no restart.
- **In process too.** ``SimBackend.in_process(SimNode)`` drives the device model without sockets
  (its node-side methods mirror ``AdminClient`` one to one), which is what the unit tests and
  the fuzzing use.
- The environment a simulated container needs is the client socket and its token
  (``GPUCONF_SIM_SOCKET`` / ``GPUCONF_SIM_TOKEN``). ``CUDA_MPS_PIPE_DIRECTORY`` is still set by
  the agent, to a directory under the sim dir, so the environment is the same shape as on a real
  node; nothing listens there.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, Protocol, TypeVar

from enforcement.sim import CLIENT_SOCKET_NAME, SIM_SOCKET_ENV, SIM_TOKEN_ENV
from enforcement.sim.messages import ClientGpuSpec, ClientSpec, GpuSpec
from workloads.simwire import SimBadRequest, SimConnectionError, SimError, SimModeConflict, WireError

from . import (
    Attachment,
    AttachRefused,
    BackendUnavailable,
    Candidate,
    ClientRequest,
    GpuInfo,
    GpuPressure,
    GpuUsage,
    Health,
    ModeConflict,
    Share,
    Usage,
    client_usage,
)

T = TypeVar("T")
HEALTH = "health"
"""The health probe's connection: of its own, so that it never queues behind the evictor's reads."""
HEALTH_TIMEOUT_S = 2.0
"""How long the health probe waits for the device to answer: a device silent this long (a hung
server, a frozen one: ``enforcement.sim.outage``) is unavailable. Twice this (the call is tried
once more on a fresh connection) plus the agent's health interval bounds how soon the node
condition says so."""


class _Admin(Protocol):
    """The node-side calls ``AdminClient`` and ``SimNode`` share."""

    def attach(self, spec: ClientSpec) -> Any: ...

    def detach(self, client: str, reason: str = "stopped") -> Any: ...

    def snapshot(self) -> Any: ...

    def pressure(self) -> Any: ...


class SimBackend:
    """The simulated device of one node (see the module docstring)."""

    name = "sim"

    def __init__(
        self,
        connect: Callable[[], tuple[_Admin, tuple[GpuSpec, ...], str]],
        client_socket: str,
        pipe_root: str,
        close_admin: Callable[[_Admin], None] = lambda _a: None,
        connect_health: Callable[[], tuple[_Admin, tuple[GpuSpec, ...], str]] | None = None,
    ) -> None:
        self._connect = connect
        self._connect_health = connect_health
        self._close_admin = close_admin
        self.client_socket = client_socket
        self._pipe_root = pipe_root
        self._make_pipe_dirs = False
        self._lock = threading.Lock()
        self._conns: dict[str, _Admin] = {}
        self._gpus: tuple[GpuInfo, ...] = ()
        self.node = ""

    @classmethod
    def from_dir(
        cls,
        sim_dir: str | Path,
        admin_token: str | None = None,
        timeout_s: float = 10.0,
        health_timeout_s: float = HEALTH_TIMEOUT_S,
    ) -> SimBackend:
        """The device server serving ``sim_dir``; the token as ``AdminClient.from_dir`` finds it."""
        from enforcement.sim.admin import AdminClient

        directory = Path(sim_dir)

        def dial(timeout: float) -> tuple[_Admin, tuple[GpuSpec, ...], str]:
            admin = AdminClient.from_dir(directory, admin_token, timeout)
            return admin, admin.hello.gpus, admin.hello.node

        def close(admin: _Admin) -> None:
            if isinstance(admin, AdminClient):
                admin.close()

        backend = cls(
            partial(dial, timeout_s),
            str(directory / CLIENT_SOCKET_NAME),
            str(directory / "mps"),
            close,
            connect_health=partial(dial, health_timeout_s),
        )
        backend._make_pipe_dirs = True  # a real container binds them (the NRI plugin): they must exist
        return backend

    @classmethod
    def in_process(
        cls, node: Any, client_socket: str = "", pipe_root: str = "/tmp/gpuconf-sim-mps"
    ) -> SimBackend:
        """A ``SimNode`` driven directly (tests); ``client_socket`` is what the env will name."""
        return cls(lambda: (node, node.gpus, node.node), client_socket, pipe_root)

    # ---- connections

    def _call(self, kind: str, fn: Callable[[_Admin], T]) -> T:
        """``fn`` on the ``kind`` connection; after a broken connection, once more on a fresh one.

        A broken connection most often means the server restarted: the connection is dropped and the
        call tried again once on a fresh one. Only this one is dropped: the others fail on their own
        next use and are dialled again then, while closing one that another thread is reading on
        would wait out that read (a hung device's whole timeout, in the health probe's way). Every
        call here may be repeated: reads are reads, a detach of a client already gone is a no-op, and
        attach replaces a same-name client.
        """
        for attempt in (1, 2):
            admin = self._conn(kind)
            try:
                return fn(admin)
            except (SimConnectionError, WireError, OSError) as exc:
                self._drop(kind, admin)
                if attempt == 2:
                    raise BackendUnavailable(f"simulated GPU device ({self.client_socket}): {exc}") from None
        raise AssertionError("unreachable")

    def _conn(self, kind: str) -> _Admin:
        with self._lock:
            admin = self._conns.get(kind)
        if admin is not None:
            return admin
        # Dialled outside the lock: a device that hangs (accepts, never answers) must hold up only
        # this connection's caller for its timeout, never the health probe waiting for the lock.
        connect = self._connect_health if kind == HEALTH and self._connect_health else self._connect
        try:
            admin, gpus, node = connect()
        except (SimConnectionError, WireError, OSError, SimError) as exc:
            raise BackendUnavailable(f"cannot reach the simulated GPU device: {exc}") from None
        with self._lock:
            raced = self._conns.get(kind)
            if raced is None:
                self._conns[kind] = admin
                self._gpus = tuple(GpuInfo(g.index, g.uuid, g.product, g.memory_mib) for g in gpus)
                self.node = node
        if raced is not None:
            self._close_admin(admin)
            return raced
        return admin

    def _drop(self, kind: str, admin: _Admin) -> None:
        """Forget and close the ``kind`` connection ``admin`` (unless it was replaced meanwhile)."""
        with self._lock:
            if self._conns.get(kind) is admin:
                del self._conns[kind]
        try:
            self._close_admin(admin)
        except OSError:
            pass

    def close(self) -> None:
        with self._lock:
            conns, self._conns = list(self._conns.values()), {}
        for admin in conns:
            try:
                self._close_admin(admin)
            except OSError:
                pass

    # ---- Backend

    def gpus(self) -> tuple[GpuInfo, ...]:
        self._conn("control")
        return self._gpus

    def pipe_directory(self, mode: str) -> str:
        return os.path.join(self._pipe_root, mode)

    def attach(self, request: ClientRequest) -> Attachment:
        spec = ClientSpec(
            name=request.name,
            gpus=tuple(ClientGpuSpec(g.gpu, g.hard_limit_mib, g.guarantee_mib) for g in request.gpus),
            mode=request.mode,
            labels=dict(request.labels),
            shared_fault_domain=request.shared_fault_domain,
            unprotected_memory=request.unprotected_memory,
            device_usage_view=request.device_usage_view,
            device_faults=tuple(request.device_faults),
        )

        def attach(admin: _Admin) -> Any:
            try:
                return admin.attach(spec)
            except SimBadRequest:
                known = any(c.name == request.name for c in admin.snapshot().clients)
                if not known:
                    raise
                # A client of this name is still attached (a StopContainer the agent never heard):
                # the new container replaces it, as a restarted container replaces its old run.
                admin.detach(request.name, "stopped")
                return admin.attach(spec)

        if self._make_pipe_dirs:
            os.makedirs(self.pipe_directory(request.mode), exist_ok=True)
        try:
            reply = self._call("control", attach)
        except SimModeConflict as exc:
            r = exc.reply
            raise ModeConflict(r.message, r.uuid, r.client, r.mode, r.other_client, r.other_mode) from None
        except SimError as exc:
            raise AttachRefused(f"simulated GPU device refused client {request.name}: {exc}") from None
        env = {SIM_SOCKET_ENV: self.client_socket, SIM_TOKEN_ENV: reply.token}
        return Attachment(reply.client, env, mounts=(self.client_socket,) if self.client_socket else ())

    def detach(self, client: str, reason: str = "stopped") -> None:
        def detach(admin: _Admin) -> None:
            try:
                admin.detach(client, reason)
            except SimBadRequest:
                pass  # not attached (any more): nothing to release

        self._call("control", detach)

    def evict(self, client: str) -> None:
        self.detach(client, "evicted")

    def track_process(self, client: str, pid: int) -> None:
        """The device sees its clients' connections itself."""

    def usage(self) -> Usage:
        snap = self._call("poll", lambda a: a.snapshot())
        gpus = tuple(
            GpuUsage(
                g.index, g.uuid, g.capacity_bytes, g.used_bytes, g.free_bytes, g.guaranteed_bytes, g.mode
            )
            for g in snap.gpus
        )
        clients = tuple(
            client_usage(
                gpus,
                c.name,
                c.mode,
                c.labels,
                (
                    Share(s.uuid, s.ordinal, s.used_bytes, s.hard_limit_bytes, s.guarantee_bytes)
                    for s in c.gpus
                ),
                pids=c.pids,
                faulted=c.faulted,
            )
            for c in snap.clients
        )
        return Usage(gpus, clients)

    def pressure(self) -> tuple[GpuPressure, ...]:
        reply = self._call("poll", lambda a: a.pressure())
        return tuple(
            GpuPressure(
                index=p.index,
                uuid=p.uuid,
                under_pressure=p.under_pressure,
                shortfall_bytes=p.shortfall_bytes,
                free_bytes=p.free_bytes,
                waiting=tuple(w.client for w in p.waiting),
                waiting_s=max((w.waiting_s for w in p.waiting), default=0.0),
                candidates=tuple(Candidate(c.client, c.used_bytes, c.guarantee_bytes) for c in p.candidates),
            )
            for p in reply
        )

    def health(self) -> Health:
        try:
            # Its own connection, with a short timeout: a hung device is reported within seconds.
            self._call(HEALTH, lambda a: a.pressure())
        except BackendUnavailable as exc:
            return Health(False, "SimulatedDeviceUnavailable", str(exc))
        return Health(
            True,
            "SimulatedDeviceReady",
            f"simulated GPU device of node {self.node} serves {len(self._gpus)} GPU(s) (simulated)",
        )

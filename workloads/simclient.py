"""A container's client of the simulated GPU device: what CUDA plus the NVML shim are on a real node.

Standard library only, so it runs in the workload image and in the simulated ``nvidia-smi``.

One ``DeviceClient`` holds one connection, and the device treats that connection as a CUDA context:
the allocations made through it are released when it closes, whether by ``close()`` or because the
process died and the kernel closed the socket. That is why the client keeps a single long-lived
connection rather than connecting per call (which would free the memory after every call), and why
a forked child opens its own connection instead of reusing its parent's: a child does not inherit
its parent's CUDA context either.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from .simwire import (
    CLIENT_REPLY_CODEC,
    SIM_SOCKET_ENV,
    SIM_TOKEN_ENV,
    TOUCH_PATTERN,
    Alloc,
    AllocReply,
    Connection,
    ErrorReply,
    Fault,
    FaultReply,
    Free,
    FreeReply,
    Hello,
    HelloReply,
    Kernel,
    KernelReply,
    MemInfo,
    MemInfoReply,
    Message,
    SimConnectionError,
    Touch,
    TouchReply,
    Verify,
    VerifyReply,
    WireError,
    error,
    expect_reply,
)

__all__ = ["DeviceClient", "SimConfigError"]


class SimConfigError(Exception):
    """The environment does not say where the simulated device is or who this container is."""


class DeviceClient:
    """A session with the simulated device under one client token (one container)."""

    def __init__(
        self, socket_path: str, token: str, timeout: float | None = None, *, cuda: bool = True
    ) -> None:
        self.socket_path = socket_path
        self._token = token
        self._timeout = timeout
        self._cuda = cuda
        self._conn: Connection | None = None
        self._hello: HelloReply | None = None
        self._connect()

    @classmethod
    def from_env(
        cls, environ: Mapping[str, str] | None = None, timeout: float | None = None, *, cuda: bool = True
    ) -> DeviceClient:
        env = os.environ if environ is None else environ
        path, token = env.get(SIM_SOCKET_ENV, ""), env.get(SIM_TOKEN_ENV, "")
        if not path or not token:
            missing = [n for n, v in ((SIM_SOCKET_ENV, path), (SIM_TOKEN_ENV, token)) if not v]
            raise SimConfigError(
                f"simulated GPU device not configured: {', '.join(missing)} unset "
                "(the node agent injects these into simulated containers)"
            )
        return cls(path, token, timeout, cuda=cuda)

    def _connect(self) -> None:
        conn = Connection(self.socket_path, CLIENT_REPLY_CODEC, self._timeout)
        try:
            self._hello = expect_reply(conn.request(Hello(token=self._token, cuda=self._cuda)), HelloReply)
        except BaseException:
            conn.close()
            raise
        self._conn = conn

    def _request(self, message: Message) -> Message:
        conn = self._conn
        if conn is None:
            raise SimConnectionError("the device client is closed")
        if not conn.owned_by_me:
            # Forked child: leave the parent's connection (and context) alone, start our own.
            self._conn = None
            self._connect()
            conn = self._conn
            assert conn is not None
        return conn.request(message)

    @property
    def hello(self) -> HelloReply:
        """What the device said at connect time: client name, node, mode, visible devices."""
        assert self._hello is not None
        return self._hello

    def alloc(self, device: int, nbytes: int) -> AllocReply:
        return expect_reply(self._request(Alloc(device=device, nbytes=nbytes)), AllocReply)

    def free(self, handle: int) -> FreeReply:
        return expect_reply(self._request(Free(handle=handle)), FreeReply)

    def touch(self, handle: int, pattern: int = TOUCH_PATTERN) -> TouchReply:
        return expect_reply(self._request(Touch(handle=handle, pattern=pattern)), TouchReply)

    def verify(self, handle: int, pattern: int) -> VerifyReply:
        return expect_reply(self._request(Verify(handle=handle, pattern=pattern)), VerifyReply)

    def meminfo(self) -> MemInfoReply:
        return expect_reply(self._request(MemInfo()), MemInfoReply)

    def kernel(self, device: int, seconds: float, sm_fraction: float = 1.0, streams: int = 1) -> KernelReply:
        request = Kernel(device=device, seconds=seconds, sm_fraction=sm_fraction, streams=streams)
        return expect_reply(self._request(request), KernelReply)

    def fault(self, device: int) -> FaultReply:
        """Fault the device on purpose. Returns the fault; every later call raises ``SimFault``."""
        reply = self._request(Fault(device=device))
        if isinstance(reply, FaultReply):
            return reply
        if isinstance(reply, ErrorReply):
            raise error(reply)  # faulted already, gone, ...: the caller should hear why
        raise WireError(f"the simulated device answered a fault with {reply.TYPE!r}")

    def close(self) -> None:
        """Close the connection; the device releases everything allocated through it."""
        conn, self._conn = self._conn, None
        if conn is not None and conn.owned_by_me:
            conn.close()

    def __enter__(self) -> DeviceClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""The node side's client of a simulated device: attach and detach containers, read state.

Used by the node runtime (attach a container before its process starts, detach when it stops or is
evicted) and by the node agent (snapshot to re-adopt clients after a restart; pressure for the
evictor). Its methods mirror ``SimNode``'s node-side methods one to one, so code and tests can run
against either.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from workloads.simwire import Connection, Message, SimConnectionError, expect_reply

from . import ADMIN_SOCKET_NAME, ADMIN_TOKEN_ENV, ADMIN_TOKEN_FILE_NAME
from .messages import (
    ADMIN_REPLY_CODEC,
    AdminHello,
    AdminHelloReply,
    Attach,
    AttachReply,
    ClientGpuSpec,
    ClientSpec,
    Detach,
    DetachReply,
    GpuPressure,
    PressureQuery,
    PressureStateReply,
    Snapshot,
    SnapshotReply,
)


def client_spec(
    name: str,
    gpus: list[str] | tuple[str, ...],
    guarantee_mib: int,
    hard_limit_mib: int | None = None,
    mode: str = "time-slicing",
    labels: Mapping[str, str] | None = None,
) -> ClientSpec:
    """A spec with the same limits on every GPU, as the contract's per-device request/limit give.

    ``hard_limit_mib`` defaults to the guarantee (limit = request when only a request is given).
    """
    hard = guarantee_mib if hard_limit_mib is None else hard_limit_mib
    return ClientSpec(
        name=name,
        gpus=tuple(ClientGpuSpec(gpu=str(g), hard_limit_mib=hard, guarantee_mib=guarantee_mib) for g in gpus),
        mode=mode,
        labels=dict(labels or {}),
    )


class AdminClient:
    """A connection to a device server's admin socket, authenticated with the admin token."""

    def __init__(self, socket_path: str, token: str, timeout: float | None = 30.0) -> None:
        self._conn = Connection(socket_path, ADMIN_REPLY_CODEC, timeout)
        try:
            self.hello = expect_reply(self._conn.request(AdminHello(token=token)), AdminHelloReply)
        except BaseException:
            self._conn.close()
            raise

    @classmethod
    def from_dir(
        cls, socket_dir: str | Path, token: str | None = None, timeout: float | None = 30.0
    ) -> AdminClient:
        """Connect to the server of ``socket_dir``; the token from the argument, env, or token file."""
        directory = Path(socket_dir)
        if token is None:
            token = os.environ.get(ADMIN_TOKEN_ENV) or None
        if token is None:
            try:
                token = (directory / ADMIN_TOKEN_FILE_NAME).read_text().strip()
            except OSError as exc:
                raise SimConnectionError(
                    f"no admin token for the simulated device in {directory}: "
                    f"{ADMIN_TOKEN_ENV} unset and {exc}"
                ) from None
        return cls(str(directory / ADMIN_SOCKET_NAME), token, timeout)

    def _call(self, message: Message) -> Message:
        return self._conn.request(message)

    def attach(self, spec: ClientSpec) -> AttachReply:
        return expect_reply(self._call(Attach(spec=spec)), AttachReply)

    def detach(self, client: str, reason: str = "stopped") -> DetachReply:
        return expect_reply(self._call(Detach(client=client, reason=reason)), DetachReply)

    def evict(self, client: str) -> DetachReply:
        return self.detach(client, "evicted")

    def snapshot(self) -> SnapshotReply:
        return expect_reply(self._call(Snapshot()), SnapshotReply)

    def pressure(self) -> tuple[GpuPressure, ...]:
        return expect_reply(self._call(PressureQuery()), PressureStateReply).gpus

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""Helpers to drive a simulated node from tests: a device server and attached clients.

Shared by the simulator's own tests and by anything later that needs a simulated GPU without the
sandbox (the node runtime's tests, the conformance suite's self-tests). Everything here runs real
processes: a ``python -m enforcement.sim.server`` per node, and ``container_env`` wires a workload
(``workloads.process.WorkloadProcess``) exactly as the node runtime wires a simulated container
(socket and token in its environment, the simulated ``nvidia-smi`` first on its PATH), so a test
exercises the same path a Pod does.

Socket paths are limited to 107 bytes, and pytest's ``tmp_path`` can be longer than that, hence
``short_tempdir``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from workloads.simwire import SIM_SOCKET_ENV, SIM_TOKEN_ENV

from . import SMI_BIN_DIR
from .admin import AdminClient, client_spec
from .process import ServerProcess

REPO_ROOT = Path(__file__).resolve().parents[2]


@contextlib.contextmanager
def short_tempdir(prefix: str = "gsim-") -> Iterator[Path]:
    """A fresh directory under /tmp whose socket paths stay under the 107-byte limit; removed after."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def container_env(
    client_socket: str, token: str, base: Mapping[str, str] | None = None, *, smi: bool = True
) -> dict[str, str]:
    """The environment the node runtime gives a simulated container."""
    env = dict(os.environ if base is None else base)
    env[SIM_SOCKET_ENV] = client_socket
    env[SIM_TOKEN_ENV] = token
    if smi:
        env["PATH"] = os.pathsep.join(p for p in (str(SMI_BIN_DIR), env.get("PATH", "")) if p)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env["PYTHONUNBUFFERED"] = "1"
    return env


@dataclass(frozen=True)
class AttachedClient:
    name: str
    token: str
    env: dict[str, str] = field(repr=False)


class SimNodeHarness:
    """One simulated node served by its own server process, with an admin connection."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        self.admin: AdminClient = server.admin()

    @classmethod
    @contextlib.contextmanager
    def running(
        cls, gpus: str = "2x1024", node: str = "sim-node-0", *, pressure_ttl_s: float | None = None
    ) -> Iterator[SimNodeHarness]:
        with short_tempdir() as directory:
            server = ServerProcess.start(directory, node=node, gpus=gpus, pressure_ttl_s=pressure_ttl_s)
            harness = cls(server)
            try:
                yield harness
            finally:
                harness.admin.close()
                server.stop()

    @property
    def socket_dir(self) -> Path:
        return Path(self.server.client_socket).parent

    def attach(
        self,
        name: str,
        gpus: list[str] | tuple[str, ...] = ("0",),
        guarantee_mib: int = 256,
        hard_limit_mib: int | None = None,
        mode: str = "time-slicing",
    ) -> AttachedClient:
        reply = self.admin.attach(client_spec(name, list(gpus), guarantee_mib, hard_limit_mib, mode))
        env = container_env(self.server.client_socket, reply.token)
        return AttachedClient(reply.client, reply.token, env)

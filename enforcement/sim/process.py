"""Start a simulated device server as its own process and wait until it is ready.

The node runtime runs one per simulated node; tests and the benchmark use it to exercise the
device across real process boundaries. Readiness is the server's JSON ready line, not a sleep or a
poll for the socket file, which can exist before the server accepts. The server's stderr goes to a
log file beside its sockets so that a chatty server never blocks on a full pipe and the log is
there to attach as evidence.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from enforcement.children import stop_child

from . import ADMIN_TOKEN_ENV
from .admin import AdminClient

DEFAULT_READY_TIMEOUT_S = 60.0  # generous: a cold interpreter on a loaded 2-core runner is slow
LOG_FILE_NAME = "server.log"


class ServerStartError(RuntimeError):
    pass


class ServerProcess:
    """A running ``python -m enforcement.sim.server``; ``stop()`` (or ``with``) ends it."""

    def __init__(
        self, proc: subprocess.Popen[bytes], ready: dict[str, Any], admin_token: str, log_path: Path
    ) -> None:
        self.proc = proc
        self.ready = ready
        self.admin_token = admin_token
        self.log_path = log_path

    @property
    def client_socket(self) -> str:
        return str(self.ready["client_socket"])

    @property
    def admin_socket(self) -> str:
        return str(self.ready["admin_socket"])

    @property
    def gpu_uuids(self) -> list[str]:
        return [g["uuid"] for g in self.ready["gpus"]]

    def admin(self, timeout: float | None = 30.0) -> AdminClient:
        return AdminClient(self.admin_socket, self.admin_token, timeout)

    @classmethod
    def start(
        cls,
        socket_dir: str | Path,
        *,
        node: str | None = None,
        gpus: str | None = None,
        topology: str | Path | None = None,
        product: str | None = None,
        pressure_ttl_s: float | None = None,
        admin_token: str | None = None,
        env: Mapping[str, str] | None = None,
        python: str = sys.executable,
        ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
    ) -> ServerProcess:
        directory = Path(socket_dir)
        directory.mkdir(parents=True, exist_ok=True)
        argv = [python, "-m", "enforcement.sim.server", "--socket-dir", str(directory)]
        for flag, value in (
            ("--node", node),
            ("--gpus", gpus),
            ("--topology", topology),
            ("--product", product),
        ):
            if value is not None:
                argv += [flag, str(value)]
        if pressure_ttl_s is not None:
            argv += ["--pressure-ttl", str(pressure_ttl_s)]
        token = admin_token or os.urandom(24).hex()
        child_env = dict(os.environ if env is None else env)
        child_env[ADMIN_TOKEN_ENV] = token
        # The server must import this checkout's packages wherever the caller's cwd is.
        root = str(Path(__file__).resolve().parents[2])
        child_env["PYTHONPATH"] = os.pathsep.join(p for p in (root, child_env.get("PYTHONPATH", "")) if p)
        log_path = directory / LOG_FILE_NAME
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, env=child_env, cwd=root)
        assert proc.stdout is not None
        deadline = time.monotonic() + ready_timeout_s
        line = b""
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            while not line.endswith(b"\n"):
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    proc.kill()
                    proc.wait()
                    raise ServerStartError(
                        f"simulated device server not ready after {ready_timeout_s:g}s; log: {log_path}"
                    )
                chunk = os.read(proc.stdout.fileno(), 4096)
                if not chunk:
                    proc.wait()
                    raise ServerStartError(
                        f"simulated device server exited with {proc.returncode} before it was ready: "
                        f"{log_path.read_text(errors='replace')[-2000:]}"
                    )
                line += chunk
        ready = json.loads(line.split(b"\n", 1)[0])
        if ready.get("event") != "ready":
            proc.kill()
            proc.wait()
            raise ServerStartError(f"unexpected first line from the simulated device server: {line[:200]!r}")
        return cls(proc, ready, token, log_path)

    def stop(self, timeout_s: float = 10.0) -> int:
        stop_child(self.proc, timeout_s)
        if self.proc.stdout is not None:
            with contextlib.suppress(OSError):
                self.proc.stdout.close()
        return self.proc.returncode

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

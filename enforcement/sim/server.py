"""The simulated device of one node behind two Unix sockets; also its process entry point.

``python -m enforcement.sim.server --node NAME --gpus 4x81920 --socket-dir DIR`` serves until
SIGTERM/SIGINT and prints one JSON ready line on stdout (``{"event": "ready", ...}``) once both
sockets accept connections. In process, ``DeviceServer(node, socket_dir)`` does the same on threads.

Two sockets, because the two audiences must not be able to act as each other:

* ``client.sock`` (mode 0666; containers of any uid reach it) serves only client requests. A
  connection opens with ``hello`` and a client token issued at attach time; from then on it acts
  as that client and no other, and allocation handles are scoped to the connection, so one
  container cannot free, touch or see another's memory. Admin requests are not decodable there.
* ``admin.sock`` (mode 0600) serves attach/detach(evict)/snapshot/pressure after ``admin-hello``
  with the admin token. The mode keeps other uids out on a real node; the token keeps out
  same-uid processes of the sandbox, where every simulated container runs as the harness's user.
  The token comes from ``GPUCONF_SIM_ADMIN_TOKEN`` if the starter set it (then it never touches
  disk), else it is generated and written to ``admin.token`` (0600) beside the sockets.

A connection is a context (see ``model``): when it closes, for whatever reason, what it allocated
is released. One thread per connection: a kernel call blocks its connection for the kernel's
duration, exactly as a synchronising CUDA call would, and nobody else's.
"""

from __future__ import annotations

import argparse
import contextlib
import hmac
import json
import os
import secrets
import signal
import socket
import socketserver
import struct
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workloads.simwire import (
    CLIENT_REQUEST_CODEC,
    MAX_LINE_BYTES,
    PROTOCOL_VERSION,
    Alloc,
    BadRequestReply,
    Codec,
    DeniedReply,
    Fault,
    Free,
    Hello,
    InternalErrorReply,
    Kernel,
    MemInfo,
    Message,
    SimError,
    Touch,
    Verify,
    WireError,
)

from . import ADMIN_SOCKET_NAME, ADMIN_TOKEN_ENV, ADMIN_TOKEN_FILE_NAME, CLIENT_SOCKET_NAME
from .fidelity import FIDELITIES, IDEAL
from .messages import (
    ADMIN_REQUEST_CODEC,
    AdminHello,
    AdminHelloReply,
    Attach,
    Detach,
    PressureQuery,
    PressureStateReply,
    Snapshot,
)
from .model import Context, SimNode
from .outage import write_hook_file
from .topology import DEFAULT_PRODUCT, TopologyError, load_topology, parse_gpus

# sockaddr_un.sun_path is 108 bytes on Linux, including the terminating NUL.
MAX_SOCKET_PATH = 107


def _peer_pid(sock: socket.socket) -> int | None:
    """The pid of the process at the other end, where the OS tells (Linux SO_PEERCRED)."""
    opt = getattr(socket, "SO_PEERCRED", None)
    if opt is None:
        return None
    try:
        pid, _uid, _gid = struct.unpack("3i", sock.getsockopt(socket.SOL_SOCKET, opt, struct.calcsize("3i")))
    except OSError:
        return None
    return pid or None


def _request_tag(line: bytes) -> str | None:
    with contextlib.suppress(ValueError, UnicodeDecodeError):
        data = json.loads(line)
        if isinstance(data, dict) and isinstance(data.get("type"), str):
            return data["type"]
    return None


class _UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    block_on_close = False  # handlers may sit in a kernel or a read; stop() closes their sockets instead
    allow_reuse_address = False

    def __init__(self, path: str, session: Callable[[socket.socket], None], mode: int) -> None:
        self._session = session
        super().__init__(path, _Handler)
        os.chmod(path, mode)  # at once: connect(2) needs write permission, so 0600 keeps others out


class _Handler(socketserver.BaseRequestHandler):
    server: _UnixServer

    def handle(self) -> None:
        self.server._session(self.request)


class DeviceServer:
    """Serves one ``SimNode`` on ``socket_dir/client.sock`` and ``socket_dir/admin.sock``."""

    def __init__(
        self,
        node: SimNode,
        socket_dir: str | Path,
        *,
        admin_token: str | None = None,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.node = node
        self.socket_dir = Path(socket_dir)
        self.client_socket = str(self.socket_dir / CLIENT_SOCKET_NAME)
        self.admin_socket = str(self.socket_dir / ADMIN_SOCKET_NAME)
        for path in (self.client_socket, self.admin_socket):
            if len(path.encode()) > MAX_SOCKET_PATH:
                raise ValueError(
                    f"socket path {path} is longer than {MAX_SOCKET_PATH} bytes; use a shorter --socket-dir"
                )
        self.admin_token_file: str | None = None
        if admin_token is None:
            admin_token = secrets.token_hex(24)
            self.admin_token_file = str(self.socket_dir / ADMIN_TOKEN_FILE_NAME)
        self.admin_token = admin_token
        self._log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        self._servers: list[_UnixServer] = []
        self._threads: list[threading.Thread] = []
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        self._client_handlers: dict[type[Message], Callable[[Context, Any], Message]] = {
            Alloc: lambda ctx, r: node.alloc(ctx, r.device, r.nbytes),
            Free: lambda ctx, r: node.free(ctx, r.handle),
            Touch: lambda ctx, r: node.touch(ctx, r.handle, r.pattern),
            Verify: lambda ctx, r: node.verify(ctx, r.handle, r.pattern),
            MemInfo: lambda ctx, r: node.meminfo(ctx),
            Kernel: lambda ctx, r: node.kernel(ctx, r.device, r.seconds, r.sm_fraction, r.streams),
            Fault: self._fault,
        }
        self._admin_handlers: dict[type[Message], Callable[[Any], Message]] = {
            Attach: self._attach,
            Detach: self._detach,
            Snapshot: lambda r: node.snapshot(),
            PressureQuery: lambda r: PressureStateReply(gpus=node.pressure()),
        }

    def log(self, message: str) -> None:
        self._log(f"simdevice[{self.node.node}] ({self.node.fidelity.label}s): {message}")

    # ---- lifecycle

    def start(self) -> None:
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        for path in (self.client_socket, self.admin_socket):
            self._clear_stale(path)
        if self.admin_token_file is not None:
            fd = os.open(self.admin_token_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(self.admin_token + "\n")
            os.chmod(self.admin_token_file, 0o600)  # O_CREAT's mode does not apply to an existing file
        self._servers = [
            _UnixServer(self.client_socket, self._client_session, 0o666),
            _UnixServer(self.admin_socket, self._admin_session, 0o600),
        ]
        for srv in self._servers:
            t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True)
            t.start()
            self._threads.append(t)
        self.log(f"serving {len(self.node.gpus)} GPU(s) on {self.client_socket} (admin: {self.admin_socket})")

    @staticmethod
    def _clear_stale(path: str) -> None:
        if not os.path.exists(path):
            return
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(path)
        except OSError:
            os.unlink(path)  # left behind by a server that died; nobody is listening
            return
        finally:
            probe.close()
        raise RuntimeError(f"another simulated device server is already listening on {path}")

    def stop(self) -> None:
        for srv in self._servers:
            srv.shutdown()
            srv.server_close()
        with self._conns_lock:
            conns = list(self._conns)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        for t in self._threads:
            t.join(timeout=5)
        for path in (self.client_socket, self.admin_socket, self.admin_token_file):
            if path:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
        self._servers, self._threads = [], []

    def __enter__(self) -> DeviceServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def ready_info(self) -> dict[str, Any]:
        """The ready line's content: what a node runtime needs to wire containers to this device."""
        return {
            "event": "ready",
            "simulated": True,
            "node": self.node.node,
            "pid": os.getpid(),
            "client_socket": self.client_socket,
            "admin_socket": self.admin_socket,
            "admin_token_file": self.admin_token_file,
            "gpus": [
                {"index": g.index, "uuid": g.uuid, "product": g.product, "memory_mib": g.memory_mib}
                for g in self.node.gpus
            ],
        }

    # ---- sessions

    def _session(self, sock: socket.socket, body: Callable[[socket.socket, Any], None]) -> None:
        with self._conns_lock:
            self._conns.add(sock)
        reader = sock.makefile("rb")
        try:
            body(sock, reader)
        except OSError:
            pass  # the peer went away mid-reply; its context is closed by the session's finally
        finally:
            with self._conns_lock:
                self._conns.discard(sock)
            reader.close()

    @staticmethod
    def _read(reader: Any) -> bytes | None:
        """One request line; None at end of stream. An oversized line ends the session."""
        line: bytes = reader.readline(MAX_LINE_BYTES + 1)
        if not line:
            return None
        if len(line) > MAX_LINE_BYTES:
            raise WireError(f"request longer than {MAX_LINE_BYTES} bytes")
        return line

    @staticmethod
    def _send(sock: socket.socket, reply: Message) -> None:
        sock.sendall(Codec.encode(reply))

    def _client_session(self, sock: socket.socket) -> None:
        self._session(sock, self._client_body)

    def _client_body(self, sock: socket.socket, reader: Any) -> None:
        try:
            line = self._read(reader)
            if line is None:
                return
            first = CLIENT_REQUEST_CODEC.decode(line, "request")
        except WireError as exc:
            self._send(sock, BadRequestReply(message=str(exc)))
            return
        if not isinstance(first, Hello):
            self._send(
                sock, DeniedReply(message="the first request on a connection must be hello with a token")
            )
            return
        if first.protocol != PROTOCOL_VERSION:
            self._send(
                sock,
                BadRequestReply(
                    message=f"protocol {first.protocol} not supported; this device speaks {PROTOCOL_VERSION}"
                ),
            )
            return
        try:
            ctx, hello = self.node.open_context(first.token, _peer_pid(sock), cuda=first.cuda)
        except SimError as exc:
            self._send(sock, exc.reply)
            return
        try:
            self._send(sock, hello)
            while True:
                try:
                    line = self._read(reader)
                except WireError as exc:
                    self._send(sock, BadRequestReply(message=str(exc)))
                    return
                if line is None:
                    return
                self._send(sock, self._client_reply(ctx, line))
        finally:
            released = self.node.close_context(ctx)
            if released:
                self.log(f"connection of {ctx.client_name} (pid {ctx.pid}) closed; released {released} bytes")

    def _client_reply(self, ctx: Context, line: bytes) -> Message:
        try:
            request = CLIENT_REQUEST_CODEC.decode(line, "request")
        except WireError as exc:
            tag = _request_tag(line)
            if tag is not None and ADMIN_REQUEST_CODEC.knows(tag):
                return DeniedReply(
                    message=f"{tag!r} is a node-side operation: it is served only on the admin socket, "
                    "never to a client token"
                )
            return BadRequestReply(message=str(exc))
        handler = self._client_handlers.get(type(request))
        if handler is None:
            return BadRequestReply(message=f"{request.TYPE!r} may only be sent as the first request")
        try:
            return handler(ctx, request)
        except SimError as exc:
            return exc.reply
        except Exception as exc:  # noqa: BLE001 - a bug in the model must not kill the connection silently
            self.log(f"internal error serving {request.TYPE}: {traceback.format_exc()}")
            return InternalErrorReply(message=f"internal error in the simulated device: {exc!r}")

    def _fault(self, ctx: Context, request: Fault) -> Message:
        try:
            return self.node.fault(ctx, request.device)
        except SimError as exc:
            self.log(exc.reply.message)
            raise

    def _admin_session(self, sock: socket.socket) -> None:
        self._session(sock, self._admin_body)

    def _admin_body(self, sock: socket.socket, reader: Any) -> None:
        try:
            line = self._read(reader)
            if line is None:
                return
            first = ADMIN_REQUEST_CODEC.decode(line, "request")
        except WireError as exc:
            self._send(
                sock, DeniedReply(message=f"admin socket: {exc}; the first request must be admin-hello")
            )
            return
        if not isinstance(first, AdminHello) or not hmac.compare_digest(first.token, self.admin_token):
            self._send(
                sock, DeniedReply(message="admin socket: not the admin token of this simulated device")
            )
            return
        self._send(sock, AdminHelloReply(node=self.node.node, gpus=self.node.gpus))
        while True:
            try:
                line = self._read(reader)
            except WireError as exc:  # oversized: the rest of that line cannot be resynchronised
                self._send(sock, BadRequestReply(message=str(exc)))
                return
            if line is None:
                return
            try:
                request = ADMIN_REQUEST_CODEC.decode(line, "request")
            except WireError as exc:
                self._send(sock, BadRequestReply(message=str(exc)))
                continue
            handler = self._admin_handlers.get(type(request))
            try:
                if handler is None:
                    raise WireError(f"{request.TYPE!r} may only be sent as the first request")
                reply = handler(request)
            except SimError as exc:
                reply = exc.reply
            except WireError as exc:
                reply = BadRequestReply(message=str(exc))
            except Exception as exc:  # noqa: BLE001 - a bug in the model is answered as one, never a hang
                self.log(f"internal error serving {request.TYPE}: {traceback.format_exc()}")
                reply = InternalErrorReply(message=f"internal error in the simulated device: {exc!r}")
            self._send(sock, reply)

    def _attach(self, request: Attach) -> Message:
        reply = self.node.attach(request.spec)
        spec = request.spec
        limits = ", ".join(f"{g.gpu}: {g.guarantee_mib}..{g.hard_limit_mib} MiB" for g in spec.gpus)
        self.log(f"attached {spec.name} ({spec.mode}; {limits})")
        return reply

    def _detach(self, request: Detach) -> Message:
        reply = self.node.detach(request.client, request.reason)
        self.log(f"{request.reason} {request.client}: released {reply.released_bytes} bytes")
        return reply


# --------------------------------------------------------------------------------------------------
# Process entry point


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m enforcement.sim.server",
        description="Serve the simulated GPUs of one node (gpuconf's simulated device; no real GPU).",
    )
    p.add_argument("--node", help="node name (required unless --topology names it)")
    p.add_argument("--gpus", help="COUNTxMIB (4x81920) or MiB per GPU (81920,40960)")
    p.add_argument("--product", default=DEFAULT_PRODUCT, help="product name shown for --gpus GPUs")
    p.add_argument("--topology", help='JSON file: {"node": NAME, "gpus": [{"memory_mib": N}, ...]}')
    p.add_argument("--socket-dir", required=True, help="directory for client.sock, admin.sock (created)")
    p.add_argument(
        "--pressure-ttl",
        type=float,
        default=30.0,
        help="seconds a refused guaranteed client counts as waiting after its last attempt",
    )
    p.add_argument(
        "--fidelity",
        choices=FIDELITIES,
        default=IDEAL,
        help="ideal: the exact device; h200: a simulated H200 (2 MiB pages, a CUDA context per "
        "process, a kernel cost model; docs/contract.md §10)",
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.topology:
            node_name, gpus = load_topology(args.topology)
            if args.node and args.node != node_name:
                raise TopologyError(f"--node {args.node} contradicts the topology's node {node_name}")
        elif args.node and args.gpus:
            node_name, gpus = args.node, parse_gpus(args.node, args.gpus, args.product)
        else:
            raise TopologyError("give --node and --gpus, or --topology")
        if args.pressure_ttl <= 0:
            raise ValueError(f"--pressure-ttl must be positive, got {args.pressure_ttl}")
        server = DeviceServer(
            SimNode(node_name, gpus, pressure_ttl_s=args.pressure_ttl, fidelity=args.fidelity),
            args.socket_dir,
            admin_token=os.environ.get(ADMIN_TOKEN_ENV) or None,
        )
    except (TopologyError, ValueError) as exc:
        print(f"simdevice: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        server.start()
    except (OSError, RuntimeError) as exc:
        print(f"simdevice: cannot serve node {node_name}: {exc}", file=sys.stderr)
        return 1
    # The simulated device's outage hook (enforcement.sim.outage): how a test freezes this process.
    write_hook_file(args.socket_dir)
    print(json.dumps(server.ready_info()), flush=True)
    try:
        while not stop.wait(1.0):
            pass
    finally:
        server.stop()
        server.log("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The hook between a node's container runtime and its node agent.

NVIDIA's GPU Fractioning Operator is an NRI plugin: before containerd creates a container it
asks the plugin, which may adjust the container (environment, mounts) or refuse it; when a
container stops the plugin is told. The sandbox's simulated kubelet (the node runtime) calls
the reference agent the same way, so the agent under test is exercised through the same
moments a real node gives it:

- ``CreateContainer``: the Pod (as a dict) and a container name; the agent answers with an
  ``Adjustment``: allowed or refused (with a kubelet-style waiting reason and a message), and
  the environment to set, which overrides whatever the container set itself.
- ``StopContainer``: the container ended (exit, deletion, eviction); release what it held.
- ``Synchronize``: the runtime's running containers, sent when it (re)connects, so an agent
  that restarted can re-adopt them (NRI does the same on plugin registration).

The agent and the runtime are separate processes: the agent can be killed and restarted
while containers keep running. The transport is one JSON request and one JSON reply per
connection on a Unix socket: no session to lose when either side restarts. A runtime that
cannot reach the agent gets ``AgentUnavailable`` and must not start a container unfenced.

**The NRI forms.** On a real node the caller is the NRI plugin of ``enforcement/nri`` (Go), which
translates containerd's NRI events and decides nothing. It knows a Pod only as NRI's pod sandbox
(name, namespace, uid, labels and annotations: the kubelet copies the Pod's annotations there), so
its requests carry ``"sandbox"`` where the simulated kubelet sends ``"pod"`` or ``"ref"``; the
agent builds the Pod from it here (``pod_from_sandbox``) and decides exactly as for the kubelet:

- ``{"op": "CreateContainer", "sandbox": S, "container": C}``;
- ``{"op": "StopContainer", "sandbox": S, "container": C, "exit_code": N|null}`` (also sent on
  RemoveContainer: a release is idempotent);
- ``{"op": "Synchronize", "containers": [{"sandbox": S, "container": C, "pid": P}, ...]}``;
- ``{"op": "PluginStatus", "registered": bool, "plugin": name, "runtime": "containerd 2.x", ...}``,
  every second: whether the plugin is registered with the runtime (``PluginStatus``).

Every reply carries the agent's ``incarnation`` (new on every start): a plugin that sees it change
sends a Synchronize, so a restarted agent re-adopts the running containers. A CreateContainer
reply also carries ``mounts``: host paths the runtime binds into the container at the same path
(the MPS pipe directory of the container's mode; the simulated GPU's socket).
"""

from __future__ import annotations

import json
import os
import socket
import socketserver
import threading
import uuid
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

# Kubelet's waiting reason for a container whose configuration cannot be applied.
REASON_CONFIG_ERROR = "CreateContainerConfigError"
MAX_MESSAGE_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class ContainerRef:
    namespace: str
    pod: str
    pod_uid: str
    container: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.pod}[{self.container}]"


@dataclass(frozen=True)
class Adjustment:
    """The agent's answer to CreateContainer."""

    allowed: bool
    env: Mapping[str, str] = field(default_factory=dict)
    """Set in the container's environment, overriding its own values for these names."""
    reason: str = ""
    """When refused: the container's waiting reason (``CreateContainerConfigError``)."""
    message: str = ""
    """When refused: why, naming the key and the rule; also the Event's message."""
    mounts: tuple[str, ...] = ()
    """Host paths bound into the container at the same path (read-write): the MPS pipe directory,
    the simulated device's socket. The simulated kubelet runs processes on the host and needs none."""


@dataclass(frozen=True)
class PluginStatus:
    """What the NRI plugin last reported: is it registered with the container runtime?"""

    registered: bool
    plugin: str = ""
    runtime: str = ""
    pid: int = 0


@dataclass(frozen=True)
class RunningContainer:
    ref: ContainerRef
    pid: int


class AgentUnavailable(Exception):
    """The agent's hook socket does not answer; the runtime must not start the container unfenced."""


class HookHandler(Protocol):
    """What the agent implements."""

    def create_container(self, pod: Mapping[str, Any], container: str) -> Adjustment: ...

    def stop_container(self, ref: ContainerRef, exit_code: int | None) -> None: ...

    def synchronize(self, running: list[RunningContainer]) -> None: ...


class PluginStatusHandler(Protocol):
    """What an agent that serves an NRI plugin implements too."""

    def plugin_status(self, status: PluginStatus) -> None: ...


def pod_from_sandbox(sandbox: Mapping[str, Any], container: str) -> dict[str, Any]:
    """The Pod as the agent reads it, from NRI's pod sandbox and the container being created.

    The sandbox lists no containers: the Pod built here has the one being decided, so a placement
    key naming another container is that container's business, exactly as with the whole Pod.
    """
    annotations = sandbox.get("annotations") or {}
    labels = sandbox.get("labels") or {}
    if not isinstance(annotations, Mapping) or not isinstance(labels, Mapping):
        raise ValueError("the sandbox's annotations and labels must be objects")
    return {
        "kind": "Pod",
        "metadata": {
            "name": str(sandbox.get("name") or ""),
            "namespace": str(sandbox.get("namespace") or ""),
            "uid": str(sandbox.get("uid") or ""),
            "annotations": dict(annotations),
            "labels": dict(labels),
        },
        "spec": {"containers": [{"name": container}]},
    }


def ref_from_sandbox(sandbox: Mapping[str, Any], container: str) -> ContainerRef:
    return ContainerRef(
        str(sandbox.get("namespace") or ""),
        str(sandbox.get("name") or ""),
        str(sandbox.get("uid") or ""),
        container,
    )


# ---- runtime side ---------------------------------------------------------------------------


class HookClient:
    """The runtime's end: one call, one connection."""

    def __init__(self, socket_path: str | Path, timeout: float = 10.0):
        self.path = str(socket_path)
        self.timeout = timeout

    def _call(self, request: dict[str, Any]) -> dict[str, Any]:
        data = json.dumps(request).encode() + b"\n"
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(self.timeout)
                sock.connect(self.path)
                sock.sendall(data)
                reply = _read_line(sock)
        except (
            FileNotFoundError,
            ConnectionRefusedError,
            ConnectionResetError,
            TimeoutError,
            OSError,
        ) as exc:
            raise AgentUnavailable(f"node agent hook {self.path} did not answer: {exc}") from None
        if "error" in reply:
            raise AgentUnavailable(f"node agent hook {self.path} failed: {reply['error']}")
        return reply

    def create_container(self, pod: Mapping[str, Any], container: str) -> Adjustment:
        reply = self._call({"op": "CreateContainer", "pod": pod, "container": container})
        return _adjustment(reply)

    def create_container_nri(self, sandbox: Mapping[str, Any], container: str) -> Adjustment:
        """CreateContainer in the NRI plugin's form (a pod sandbox, not a Pod)."""
        return _adjustment(self._call({"op": "CreateContainer", "sandbox": sandbox, "container": container}))

    def plugin_status(self, status: PluginStatus) -> str:
        """Report the plugin's registration, as the NRI plugin does; returns the agent's incarnation."""
        return str(self._call({"op": "PluginStatus", **asdict(status)}).get("incarnation", ""))

    def stop_container(self, ref: ContainerRef, exit_code: int | None) -> None:
        self._call({"op": "StopContainer", "ref": asdict(ref), "exit_code": exit_code})

    def synchronize(self, running: list[RunningContainer]) -> None:
        self._call({"op": "Synchronize", "running": [{"ref": asdict(r.ref), "pid": r.pid} for r in running]})


def _adjustment(reply: Mapping[str, Any]) -> Adjustment:
    return Adjustment(
        allowed=bool(reply["allowed"]),
        env=dict(reply.get("env") or {}),
        reason=str(reply.get("reason", "")),
        message=str(reply.get("message", "")),
        mounts=tuple(str(m["source"]) for m in reply.get("mounts") or ()),
    )


def _read_line(sock: socket.socket) -> dict[str, Any]:
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
        if chunk.endswith(b"\n"):
            break
        if size > MAX_MESSAGE_BYTES:
            raise ValueError(f"hook message larger than {MAX_MESSAGE_BYTES} bytes")
    raw = b"".join(chunks)
    if not raw:
        raise ConnectionResetError("empty reply")
    message = json.loads(raw)
    if not isinstance(message, dict):
        raise ValueError("hook message is not a JSON object")
    return message


# ---- agent side -----------------------------------------------------------------------------


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def handle(self) -> None:
        try:
            request = _read_line(self.connection)
            reply = self.server.dispatch(request)
        except Exception as exc:  # noqa: BLE001 - a bad request must never take the agent down
            reply = {"error": f"{type(exc).__name__}: {exc}"}
        try:
            self.connection.sendall(json.dumps(reply).encode() + b"\n")
        except OSError:
            pass


class _Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(self, path: str, handler: HookHandler):
        self.handler = handler
        self.incarnation = uuid.uuid4().hex
        super().__init__(path, _Handler)

    def dispatch(self, request: dict[str, Any]) -> dict[str, Any]:
        reply = self._dispatch(request)
        reply["incarnation"] = self.incarnation
        return reply

    def _dispatch(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        sandbox = request.get("sandbox")
        if sandbox is not None and not isinstance(sandbox, dict):
            raise ValueError(f"{op}: 'sandbox' must be an object")
        if op == "CreateContainer":
            pod, container = request.get("pod"), request.get("container")
            if sandbox is not None and isinstance(container, str):
                pod = pod_from_sandbox(sandbox, container)
            if not isinstance(pod, dict) or not isinstance(container, str):
                raise ValueError("CreateContainer needs 'pod' or 'sandbox' (object) and 'container' (string)")
            adj = self.handler.create_container(pod, container)
            return {
                "allowed": adj.allowed,
                "env": dict(adj.env),
                "reason": adj.reason,
                "message": adj.message,
                "mounts": [{"source": m, "destination": m, "options": ["rbind", "rw"]} for m in adj.mounts],
            }
        if op == "StopContainer":
            if sandbox is not None:
                ref = ref_from_sandbox(sandbox, str(request["container"]))
            else:
                ref = ContainerRef(**request["ref"])
            self.handler.stop_container(ref, request.get("exit_code"))
            return {"ok": True}
        if op == "Synchronize":
            if "containers" in request:
                running = [
                    RunningContainer(
                        ref_from_sandbox(c["sandbox"], str(c["container"])), int(c.get("pid") or 0)
                    )
                    for c in request["containers"] or ()
                ]
            else:
                running = [
                    RunningContainer(ContainerRef(**r["ref"]), int(r["pid"])) for r in request["running"]
                ]
            self.handler.synchronize(running)
            return {"ok": True}
        if op == "PluginStatus":
            report = getattr(self.handler, "plugin_status", None)
            if report is None:
                raise ValueError("this agent serves no NRI plugin")
            report(
                PluginStatus(
                    registered=bool(request.get("registered")),
                    plugin=str(request.get("plugin") or ""),
                    runtime=str(request.get("runtime") or ""),
                    pid=int(request.get("pid") or 0),
                )
            )
            return {"ok": True}
        raise ValueError(f"unknown hook operation {op!r}")


class HookServer:
    """The agent's end: serves ``handler`` on a Unix socket (mode 0600) in a background thread."""

    def __init__(self, socket_path: str | Path, handler: HookHandler):
        self.path = str(socket_path)
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        try:
            os.unlink(self.path)  # a socket file left by a killed agent
        except FileNotFoundError:
            pass
        self._server = _Server(self.path, handler)
        os.chmod(self.path, 0o600)
        self._thread = threading.Thread(target=self._server.serve_forever, name="hook", daemon=True)

    @property
    def incarnation(self) -> str:
        """New on every start of the agent: a plugin that sees it change sends a Synchronize."""
        return self._server.incarnation

    def start(self) -> HookServer:
        self._thread.start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def __enter__(self) -> HookServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

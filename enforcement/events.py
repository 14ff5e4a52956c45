"""Events on Pods, recorded the way the kubelet's recorder does: one recorder for every gpuconf component.

The node agent, the simulated kubelet and the reference scheduler all explain themselves through
core/v1 Events on Pods, and all three need the same things of a recorder:

- **Aggregated.** A repeat (same Pod, container, reason and message) raises ``count`` and
  ``lastTimestamp`` on the first Event instead of creating another, as the kubelet's recorder
  does, so a retry loop cannot fill a namespace with copies. What is remembered for that is
  bounded (``MAX_REMEMBERED``, oldest first out: a long-lived agent must not keep every Event
  it ever wrote) and dropped per Pod by ``forget`` when the Pod is gone.
- **Best effort.** An Event is evidence, never control: one that cannot be written (a namespace
  being deleted refuses new ones, the API server is away) is logged and never fails, retries or
  holds up the work it describes.
- **Off the caller's thread when asked** (``background=True``): the agent answers the runtime's
  CreateContainer and the scheduler binds while the Event is still on its way; a full queue
  drops the Event and says so. The simulated kubelet writes on its own worker thread anyway and
  records synchronously.

Who records what on a node, so that nothing is said twice: the **node agent** records why it
refused or evicted a container (its Event names the annotation key and the rule); the
**runtime** (the simulated kubelet) records what only it knows: ``Started``, ``Killing``,
``BackOff``, and ``Failed`` for starts that never reached the agent or the process, and shows
the agent's refusals in the container's waiting state only.
"""

from __future__ import annotations

import queue
import secrets
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Protocol

NORMAL: Final = "Normal"
WARNING: Final = "Warning"
MAX_MESSAGE: Final = 1024
"""The API server truncates longer Event messages; the recorder says so itself."""
MAX_REMEMBERED: Final = 10_000
QUEUE_SIZE: Final = 1000
REQUEST_TIMEOUT_S: Final = 15

Log = Callable[[str], None]


class PodIdentity(Protocol):
    """The Pod an Event is about (``fixtures.sandbox.scheduler.recorder.PodRef`` is one)."""

    @property
    def namespace(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def uid(self) -> str: ...


@dataclass(frozen=True)
class InvolvedPod:
    namespace: str
    name: str
    uid: str

    @classmethod
    def of(cls, pod: Mapping[str, Any]) -> InvolvedPod:
        meta = pod.get("metadata") or {}
        return cls(str(meta.get("namespace") or ""), str(meta.get("name") or ""), str(meta.get("uid") or ""))


def timestamp() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def clipped(message: str) -> str:
    return message if len(message) <= MAX_MESSAGE else message[: MAX_MESSAGE - 3] + "..."


def _short(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:300]


@dataclass(frozen=True)
class _Pending:
    pod: InvolvedPod
    kind: str
    reason: str
    message: str
    container: str
    action: str


class EventRecorder:
    """Creates (or counts up) Events on Pods for ``component`` through ``core_v1``: an
    ``enforcement.kubeapi.CoreApi`` (the components) or a ``CoreV1Api`` (both take the same calls).

    ``host`` goes in ``source.host`` (a node's name, for node components); ``instance`` is the
    ``reportingInstance`` (default: ``host``, else the component); ``prefix`` starts every
    message (the simulated kubelet marks its Events as simulated).
    """

    def __init__(
        self,
        core_v1: Any,
        component: str,
        log: Log,
        *,
        host: str = "",
        instance: str = "",
        prefix: str = "",
        background: bool = False,
        queue_size: int = QUEUE_SIZE,
        max_remembered: int = MAX_REMEMBERED,
    ) -> None:
        self._core = core_v1
        self.component = component
        self.host = host
        self.instance = instance or host or component
        self.prefix = prefix
        self._log = log
        self._max_remembered = max_remembered
        self._lock = threading.Lock()
        self._seen: dict[tuple[str, str, str, str], tuple[str, int]] = {}
        self._background = background
        self._queue: queue.Queue[_Pending] = queue.Queue(maxsize=queue_size)
        self._worker: threading.Thread | None = None

    def record(
        self,
        pod: PodIdentity | Mapping[str, Any],
        kind: str,
        reason: str,
        message: str,
        container: str | None = None,
        *,
        action: str = "",
    ) -> None:
        """Record ``reason`` on ``pod`` (a Pod dict or its identity); ``container`` goes in
        ``fieldPath``. Never raises."""
        involved = (
            InvolvedPod.of(pod) if isinstance(pod, Mapping) else InvolvedPod(pod.namespace, pod.name, pod.uid)
        )
        text = message if message.startswith(self.prefix) else self.prefix + message
        item = _Pending(involved, kind, reason, clipped(text), container or "", action)
        if not self._background:
            self._write(item)
            return
        with self._lock:
            if self._worker is None:
                self._worker = threading.Thread(target=self._drain, name="events", daemon=True)
                self._worker.start()
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self._log(
                f"Event queue full; dropped {reason} on Pod {involved.namespace}/{involved.name}: "
                f"{message[:200]}"
            )

    def forget(self, uid: str) -> None:
        """Drop what is remembered about a Pod that is gone."""
        with self._lock:
            for key in [k for k in self._seen if k[0] == uid]:
                del self._seen[key]

    def flush(self, timeout_s: float = 10.0) -> None:
        """Wait until the queued Events are written (or ``timeout_s`` passed)."""
        deadline = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.01)

    def remembered(self) -> int:
        with self._lock:
            return len(self._seen)

    def _drain(self) -> None:
        while True:
            item = self._queue.get()
            try:
                self._write(item)
            finally:
                self._queue.task_done()

    def _write(self, item: _Pending) -> None:
        pod = item.pod
        key = (pod.uid, item.container, item.reason, item.message)
        now = timestamp()
        with self._lock:
            seen = self._seen.get(key)
            if seen is not None:
                self._seen[key] = (seen[0], seen[1] + 1)
        try:
            if seen is not None:
                self._core.patch_namespaced_event(
                    seen[0],
                    pod.namespace,
                    {"count": seen[1] + 1, "lastTimestamp": now},
                    _preload_content=False,
                    _request_timeout=REQUEST_TIMEOUT_S,
                )
                return
            name = f"{pod.name}.{secrets.token_hex(8)}"
            involved: dict[str, Any] = {
                "apiVersion": "v1",
                "kind": "Pod",
                "namespace": pod.namespace,
                "name": pod.name,
                "uid": pod.uid,
            }
            if item.container:
                involved["fieldPath"] = f"spec.containers{{{item.container}}}"
            source = {"component": self.component}
            if self.host:
                source["host"] = self.host
            body: dict[str, Any] = {
                "apiVersion": "v1",
                "kind": "Event",
                "metadata": {"name": name, "namespace": pod.namespace},
                "involvedObject": involved,
                "reason": item.reason,
                "message": item.message,
                "type": item.kind,
                "source": source,
                "reportingComponent": self.component,
                "reportingInstance": self.instance,
                "firstTimestamp": now,
                "lastTimestamp": now,
                "count": 1,
            }
            if item.action:
                body["action"] = item.action
            self._core.create_namespaced_event(
                pod.namespace, body, _preload_content=False, _request_timeout=REQUEST_TIMEOUT_S
            )
            with self._lock:
                self._seen.setdefault(key, (name, 1))
                while len(self._seen) > self._max_remembered:
                    self._seen.pop(next(iter(self._seen)))
        except Exception as exc:  # noqa: BLE001 - an Event is never worth failing anything for
            where = f"{pod.namespace}/{pod.name}"
            self._log(f"could not record Event {item.reason} on Pod {where}: {_short(exc)}")

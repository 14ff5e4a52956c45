"""One kind of Kubernetes object, listed and then watched, for as long as its consumer runs.

Three components keep a view of the API and all need the same thing from it: the node agent
(which Pods on its node are gone), the simulated kubelet (the Pods bound to its node) and the
reference scheduler (every Pod and Node). They share this one reflector, so that a fix to the
list/watch rules reaches all three.

Why not ``kubernetes.watch.Watch``: it turns every object into the client's generated model
classes, which costs more than anything a consumer then does with the object, and every consumer
here reads plain dicts anyway (the contract module does). So the raw JSON of the list reply and
the newline-delimited JSON of the watch stream are decoded once with ``json``
(``_preload_content=False``), and objects lose ``managedFields`` (``slim``) before anyone sees them.

The rules, as client-go's reflector has them:

- **list, then watch from the list's resourceVersion**, with bookmarks, so nothing between the two
  is lost and the version stays fresh on a quiet stream;
- a watch that ends (the server's timeout, a dropped connection, a restarting API server) resumes
  from the **last resourceVersion seen, bookmarks included**, without a relist; after a failure it
  first waits a growing backoff (``BACKOFF_S``), which a watch that ends normally resets;
- **410 Gone**, as the reply to the watch request or as an ``ERROR`` event inside its stream, means
  the version was compacted away and events were lost: list again and hand the **whole list** over
  (``Listed``), so the consumer replaces its view instead of patching a hole it cannot see;
- with ``resync_s``, list again at least that often anyway (each watch request is cut to end by
  then): a full list is the one thing that reveals a deletion nobody saw.

Everything goes to one ``sink`` callable, in order, on the reflector's thread; the reflector keeps
no copy of the objects. It runs until the consumer's ``stop`` event is set: checked between events,
and the backoff waits on it. A consumer that lists by itself first (the scheduler, which must
build its view before it decides anything) starts the reflector with that list's version instead.

This module sits in ``enforcement/`` (the lowest layer, and all the agent's image ships besides
``workloads/``) so that the agent can use it; the fixtures import it from here. The Kubernetes
client is imported only when a watch is made: the agent's modules import without it.
"""

from __future__ import annotations

import functools
import json
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal, cast

ChangeType = Literal["ADDED", "MODIFIED", "DELETED"]
ListFn = Callable[..., Any]
"""A ``list_*`` method of ``enforcement.kubeapi.CoreApi`` or ``CoreV1Api`` (or a fake with their
signature), selectors already bound."""
Log = Callable[[str], None]

WATCH_TIMEOUT_S = 240
"""Server-side end of each watch request; resumed at once from the last resourceVersion."""
READ_SLACK_S = 30
"""Client-side read timeout beyond the server's: a connection silent for longer than that is dead."""
CONNECT_TIMEOUT_S = 10
LIST_TIMEOUT_S = 60
BACKOFF_S = (0.2, 0.5, 1.0, 2.0, 5.0)
"""Waits after consecutive failed watches; the last one repeats."""

_CHANGES: frozenset[str] = frozenset(("ADDED", "MODIFIED", "DELETED"))


@dataclass(frozen=True)
class Listed:
    """A full list: the consumer replaces everything it knew of this kind."""

    kind: str
    items: tuple[dict[str, Any], ...]
    resource_version: str
    started: float = 0.0
    """``time.monotonic()`` when the list request was sent: anything the consumer took on before
    then and the list lacks was deleted; anything since may be too new for the list to show."""


@dataclass(frozen=True)
class Changed:
    """One watch event (bookmarks are not handed over: they only move the resourceVersion)."""

    kind: str
    type: ChangeType
    obj: dict[str, Any]


Event = Listed | Changed
Sink = Callable[[Event], None]


def slim(obj: dict[str, Any]) -> dict[str, Any]:
    """Drop managedFields: the bulk of every object, and never read by any consumer."""
    meta = obj.get("metadata")
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    return obj


def pods_on_node(core_v1: Any, node: str) -> ListFn:
    """The list function of the Pods bound to ``node``: what a kubelet, or a node's agent, sees."""
    return functools.partial(core_v1.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={node}")


def list_objects(kind: str, list_fn: ListFn) -> Listed:
    """One consistent list of what ``list_fn`` selects, with the version to watch from."""
    started = time.monotonic()
    data = json.loads(list_fn(_preload_content=False, _request_timeout=LIST_TIMEOUT_S).data)
    items = tuple(slim(item) for item in data.get("items") or ())
    return Listed(kind, items, str(data["metadata"]["resourceVersion"]), started)


class _Gone(Exception):
    """The watch's resourceVersion is too old (HTTP 410): a relist is needed."""


class Reflector(threading.Thread):
    """Keeps ``sink`` fed with one kind's lists and changes until ``stop`` is set.

    Without ``resource_version`` it lists first; with it, it watches from there (the caller has
    just listed). ``resync_s`` (None: never) forces a relist at least that often.
    """

    def __init__(
        self,
        kind: str,
        list_fn: ListFn,
        sink: Sink,
        stop: threading.Event,
        log: Log,
        *,
        resource_version: str | None = None,
        resync_s: float | None = None,
        watch_timeout_s: int = WATCH_TIMEOUT_S,
    ) -> None:
        super().__init__(name=f"watch-{kind}", daemon=True)
        self.kind = kind
        self.list_fn = list_fn
        self.sink = sink
        self.stop = stop
        self.log = log
        self.resync_s = resync_s
        self.watch_timeout_s = watch_timeout_s
        self.resource_version = resource_version
        """The last version seen (list, event or bookmark); None until the first list."""
        self.lists = 0
        """Lists handed over so far."""
        self.listed = threading.Event()
        """Set once a list of this reflector's own has been handed over."""
        self._resync_at: float | None = None

    def run(self) -> None:
        failures = 0
        while not self.stop.is_set():
            try:
                if self.resource_version is None or self._resync_due():
                    self._list()
                self._watch_once()
                failures = 0
            except _Gone:
                self.log(
                    f"watch {self.kind}: resourceVersion {self.resource_version} expired (410 Gone); "
                    "listing again"
                )
                self.resource_version = None
            except Exception as exc:  # noqa: BLE001 - a dropped connection, a restarting API server: resume
                if self.stop.is_set():
                    return
                delay = BACKOFF_S[min(failures, len(BACKOFF_S) - 1)]
                failures += 1
                self.log(f"watch {self.kind} interrupted ({_short(exc)}); resuming in {delay:.1f} s")
                self.stop.wait(delay)

    def _resync_due(self) -> bool:
        return self._resync_at is not None and time.monotonic() >= self._resync_at

    def _list(self) -> None:
        listed = list_objects(self.kind, self.list_fn)
        self.resource_version = listed.resource_version
        if self.resync_s is not None:
            self._resync_at = time.monotonic() + self.resync_s
        self.sink(listed)
        self.lists += 1
        self.listed.set()

    def _watch_once(self) -> None:
        from kubernetes.client.rest import ApiException  # see the module docstring: not at import

        timeout = self.watch_timeout_s
        if self._resync_at is not None:
            timeout = min(timeout, max(1, int(self._resync_at - time.monotonic())))
        try:
            resp = self.list_fn(
                watch=True,
                resource_version=self.resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=timeout,
                _preload_content=False,
                _request_timeout=(CONNECT_TIMEOUT_S, self.watch_timeout_s + READ_SLACK_S),
            )
        except ApiException as exc:
            if exc.status == 410:
                raise _Gone() from exc
            raise
        try:
            for line in _lines(resp):
                if self.stop.is_set():
                    return
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise _Gone()
                    raise RuntimeError(f"watch error {obj.get('code')}: {obj.get('message')}")
                version = (obj.get("metadata") or {}).get("resourceVersion")
                if version:
                    self.resource_version = str(version)
                if kind in _CHANGES:
                    self.sink(Changed(self.kind, cast(ChangeType, kind), slim(obj)))
        finally:
            resp.release_conn()


def _lines(resp: Any) -> Iterator[bytes]:
    """The newline-delimited JSON of a watch response, as it arrives (lines span chunks)."""
    pending = b""
    for chunk in resp.stream(amt=None, decode_content=True):
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            if line.strip():
                yield line
    if pending.strip():
        yield pending


def _short(exc: BaseException) -> str:
    """An exception in one log line: urllib3's are many lines long."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"[:200]

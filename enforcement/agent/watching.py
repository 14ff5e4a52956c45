"""The Pods bound to the agent's node: one list, then a watch, resumed for as long as the agent runs.

The agent needs the Pods for one thing the runtime cannot be relied on to tell it: that a Pod is
*gone* (deleted while the agent was down, a StopContainer that never arrived), so its GPU memory
and guarantee are released. It keeps no copy of the Pods: the hook hands it the Pod it decides
on, and the backend's attach labels identify the rest, which is what keeps the agent small on a
node with a thousand Pods.

Semantics of a reflector, written for this purpose:

- list with ``fieldSelector=spec.nodeName=<node>``, then watch from the list's resourceVersion
  with bookmarks, so no event between list and watch is lost;
- a watch that ends (server timeout, dropped connection, API server restart) resumes from the
  last resourceVersion seen, with a growing backoff while it keeps failing;
- ``410 Gone`` (the version was compacted away) means events were missed: list again;
- and every ``resync_s`` it lists again anyway.

Each list goes to ``on_list(uids, started_at)`` (the consumer releases what belongs to Pods not
in it); each deletion to ``on_deleted(uid)``. JSON is decoded straight from the response; the
client's model classes are never built.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

WATCH_TIMEOUT_S = 240
BACKOFF_S = (0.2, 0.5, 1.0, 2.0, 5.0)


class _Expired(Exception):
    """The watch's resourceVersion is too old (410 Gone)."""


def _json_lines(resp: Any) -> Iterator[bytes]:
    buffer = b""
    for chunk in resp.stream(amt=None, decode_content=True):
        buffer += chunk
        while True:
            line, sep, rest = buffer.partition(b"\n")
            if not sep:
                break
            buffer = rest
            if line.strip():
                yield line
    if buffer.strip():
        yield buffer


class PodWatcher(threading.Thread):
    def __init__(
        self,
        core_v1: Any,
        node: str,
        on_list: Callable[[set[str], float], None],
        on_deleted: Callable[[str], None],
        stop: threading.Event,
        log: Callable[[str], None],
        resync_s: float = 300.0,
    ) -> None:
        super().__init__(name="pod-watch", daemon=True)
        self._core = core_v1
        self._selector = f"spec.nodeName={node}"
        self._on_list = on_list
        self._on_deleted = on_deleted
        self._stop = stop
        self._log = log
        self._resync_s = resync_s
        self.resource_version: str | None = None
        self._list_due = 0.0
        self.lists = 0
        self.listed = threading.Event()

    def _list(self) -> None:
        started = time.monotonic()
        resp = self._core.list_pod_for_all_namespaces(
            field_selector=self._selector, _preload_content=False, _request_timeout=60
        )
        data = json.loads(resp.data)
        uids = {
            str(p["metadata"]["uid"]) for p in data.get("items") or () if p.get("metadata", {}).get("uid")
        }
        self.resource_version = str(data["metadata"]["resourceVersion"])
        self._list_due = time.monotonic() + self._resync_s
        self._on_list(uids, started)
        self.lists += 1
        self.listed.set()

    def run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                if self.resource_version is None or time.monotonic() >= self._list_due:
                    self._list()
                self._watch()
                failures = 0
            except _Expired:
                self._log("pod watch: resourceVersion expired (410 Gone); listing again")
                self.resource_version = None
            except Exception as exc:  # noqa: BLE001 - connection dropped, API server restarting
                if self._stop.is_set():
                    return
                delay = BACKOFF_S[min(failures, len(BACKOFF_S) - 1)]
                failures += 1
                first = str(exc).strip().splitlines()[:1]
                self._log(f"pod watch interrupted ({type(exc).__name__}: {first}); resuming in {delay:g} s")
                self._stop.wait(delay)

    def _watch(self) -> None:
        from kubernetes.client.rest import ApiException

        left = max(1, int(self._list_due - time.monotonic()))
        try:
            resp = self._core.list_pod_for_all_namespaces(
                field_selector=self._selector,
                watch=True,
                resource_version=self.resource_version,
                allow_watch_bookmarks=True,
                timeout_seconds=min(WATCH_TIMEOUT_S, left),
                _preload_content=False,
                _request_timeout=(10, WATCH_TIMEOUT_S + 30),
            )
        except ApiException as exc:
            if exc.status == 410:
                raise _Expired() from None
            raise
        try:
            for line in _json_lines(resp):
                if self._stop.is_set():
                    return
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    if obj.get("code") == 410:
                        raise _Expired()
                    raise RuntimeError(f"watch error {obj.get('code')}: {obj.get('message')}")
                meta = obj.get("metadata") or {}
                if meta.get("resourceVersion"):
                    self.resource_version = str(meta["resourceVersion"])
                if kind == "DELETED" and meta.get("uid"):
                    self._on_deleted(str(meta["uid"]))
        finally:
            resp.release_conn()

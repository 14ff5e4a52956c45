"""The node's Pod watch: list then watch from its version, resume after drops, relist after 410 Gone."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

from kubernetes.client.rest import ApiException

from enforcement import reflector
from fixtures.sandbox.noderuntime.runtime import POD_WATCH_TIMEOUT_S


def pod(name: str, rv: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}", "resourceVersion": rv}}


class Listed:
    def __init__(self, items: list[dict[str, Any]], rv: str) -> None:
        self.data = json.dumps({"metadata": {"resourceVersion": rv}, "items": items}).encode()


class Stream:
    """A watch response: JSON lines, deliberately split across chunks."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        self._raw = b"".join(json.dumps(e).encode() + b"\n" for e in events)
        self.released = False

    def stream(self, amt: Any = None, decode_content: bool = True) -> Iterator[bytes]:
        for i in range(0, len(self._raw), 7):
            yield self._raw[i : i + 7]

    def release_conn(self) -> None:
        self.released = True


class FakeCore:
    def __init__(self, script: list[Any], stop: threading.Event) -> None:
        self.script = script
        self.stop = stop
        self.calls: list[dict[str, Any]] = []

    def list_pod_for_all_namespaces(self, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        if not self.script:
            self.stop.set()
            return Stream([])
        step = self.script.pop(0)
        if isinstance(step, Exception):
            raise step
        return step


def pod_watch(
    core: FakeCore,
    node: str,
    on_list: Callable[[list[dict[str, Any]]], None],
    on_event: Callable[[str, dict[str, Any]], None],
    stop: threading.Event,
    log: Callable[[str], None],
    resync_s: float,
) -> reflector.Reflector:
    """The runtime's reflector of its node's Pods, each list and each change handed to its own callback."""

    def sink(event: reflector.Event) -> None:
        if isinstance(event, reflector.Listed):
            on_list(list(event.items))
        else:
            on_event(event.type, event.obj)

    return reflector.Reflector(
        "pods",
        reflector.pods_on_node(core, node),
        sink,
        stop,
        log,
        resync_s=resync_s,
        watch_timeout_s=POD_WATCH_TIMEOUT_S,
    )


def test_list_watch_resume_and_relist_after_gone() -> None:
    stop = threading.Event()
    a, b, c = pod("a", "10"), pod("b", "11"), pod("c", "21")
    core = FakeCore(
        [
            Listed([a], "10"),
            Stream(
                [
                    {"type": "ADDED", "object": b},
                    {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "12"}}},
                ]
            ),
            ConnectionResetError("dropped"),
            Stream([{"type": "ERROR", "object": {"code": 410, "message": "too old resource version"}}]),
            Listed([b], "20"),
            Stream([{"type": "DELETED", "object": c}]),
        ],
        stop,
    )
    lists: list[list[str]] = []
    events: list[tuple[str, str]] = []
    logs: list[str] = []
    watch = pod_watch(
        core,
        "gpu-a-0",
        lambda items: lists.append([p["metadata"]["name"] for p in items]),
        lambda kind, obj: events.append((kind, obj["metadata"]["name"])),
        stop,
        logs.append,
        resync_s=3600,
    )
    watch.start()
    watch.join(30)
    assert not watch.is_alive()
    assert lists == [["a"], ["b"]]
    assert events == [("ADDED", "b"), ("DELETED", "c")]
    assert all(call["field_selector"] == "spec.nodeName=gpu-a-0" for call in core.calls)
    watches = [call for call in core.calls if call.get("watch")]
    assert [w["resource_version"] for w in watches] == ["10", "12", "12", "20", "21"]
    assert all(w["allow_watch_bookmarks"] for w in watches)
    assert any("interrupted" in line for line in logs) and any("410" in line for line in logs)


def test_an_api_410_on_the_request_itself_relists() -> None:
    stop = threading.Event()
    core = FakeCore([Listed([], "5"), ApiException(status=410), Listed([pod("x", "9")], "9")], stop)
    lists: list[list[str]] = []
    watch = pod_watch(
        core,
        "n",
        lambda items: lists.append([p["metadata"]["name"] for p in items]),
        lambda k, o: None,
        stop,
        lambda _m: None,
        resync_s=3600,
    )
    watch.start()
    watch.join(30)
    assert lists == [[], ["x"]]


def test_periodic_resync_lists_again() -> None:
    stop = threading.Event()
    core = FakeCore([Listed([], "1"), Stream([]), Listed([], "2")], stop)
    lists: list[int] = []
    watch = pod_watch(
        core,
        "n",
        lambda items: lists.append(len(items)),
        lambda k, o: None,
        stop,
        lambda _m: None,
        resync_s=0.0,
    )
    watch.start()
    watch.join(30)
    assert lists == [0, 0]

"""The shared reflector against a scripted list function: every rule of list, watch, resume and relist.

The fake answers as ``CoreV1Api`` does with ``_preload_content=False``: a list reply has ``.data``,
a watch reply streams newline-delimited JSON in chunks that split lines. Each call takes the next
step of a script; when the script is over the fake sets ``stop`` and fails, which ends the run.
Backoff waits go to the ``stop`` event, so a ``RecordingStop`` notes them instead of sleeping.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from enforcement import reflector
from enforcement.reflector import Changed, Event, Listed, Reflector


class Reply:
    """A list reply (``data``) or a watch reply (``lines``, streamed three bytes at a time)."""

    def __init__(
        self, data: Any = None, lines: list[dict[str, Any]] | None = None, tail: bool = True
    ) -> None:
        self.data = json.dumps(data).encode() if data is not None else b""
        raw = b"\n".join(json.dumps(line).encode() for line in lines or [])
        self._raw = raw + b"\n" if raw and tail else raw
        self.released = False

    def stream(self, amt: Any = None, decode_content: bool = True) -> Iterator[bytes]:
        for i in range(0, len(self._raw), 3):
            yield self._raw[i : i + 3]

    def release_conn(self) -> None:
        self.released = True


def obj(name: str, version: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": f"uid-{name}", "resourceVersion": version}}


def listing(version: str, *items: dict[str, Any]) -> Reply:
    return Reply({"metadata": {"resourceVersion": version}, "items": list(items)})


def stream(*events: tuple[str, dict[str, Any]]) -> Reply:
    return Reply(lines=[{"type": kind, "object": o} for kind, o in events])


def gone_event() -> tuple[str, dict[str, Any]]:
    return ("ERROR", {"kind": "Status", "code": 410, "message": "too old resource version"})


class FakeList:
    """A ``list_*`` function playing ``script``; it records every call's arguments."""

    def __init__(self, script: list[Any], stop: threading.Event) -> None:
        self.script = script
        self.stop = stop
        self.calls: list[dict[str, Any]] = []
        self.replies: list[Reply] = []

    def __call__(self, **kwargs: Any) -> Reply:
        self.calls.append(kwargs)
        if not self.script:
            self.stop.set()
            raise ConnectionError("script over")
        step = self.script.pop(0)
        if isinstance(step, Exception):
            raise step
        self.replies.append(step)
        return step

    @property
    def watched_from(self) -> list[str]:
        return [call["resource_version"] for call in self.calls if call.get("watch")]

    @property
    def list_calls(self) -> int:
        return sum(1 for call in self.calls if not call.get("watch"))


class RecordingStop(threading.Event):
    """A stop event whose waits return at once and are recorded (the backoff)."""

    def __init__(self) -> None:
        super().__init__()
        self.waits: list[float] = []

    def wait(self, timeout: float | None = None) -> bool:
        self.waits.append(timeout or 0.0)
        return self.is_set()


def reflect(
    script: list[Any], **options: Any
) -> tuple[FakeList, list[Event], list[str], Reflector, RecordingStop]:
    """Runs a reflector of "pods" over ``script`` on this thread, until the script is over."""
    stop = RecordingStop()
    fn = FakeList(script, stop)
    events: list[Event] = []
    logs: list[str] = []
    watcher = Reflector("pods", fn, events.append, stop, logs.append, **options)
    watcher.run()
    return fn, events, logs, watcher, stop


def test_it_lists_then_watches_from_the_lists_version() -> None:
    heavy = obj("a", "9")
    heavy["metadata"]["managedFields"] = [{"manager": "kubectl"}]
    before = time.monotonic()
    fn, events, _, watcher, _ = reflect(
        [
            listing("10", heavy, obj("b", "10")),
            stream(("ADDED", obj("c", "11")), ("MODIFIED", obj("a", "12")), ("DELETED", obj("b", "13"))),
        ]
    )
    listed = events[0]
    assert isinstance(listed, Listed) and listed.kind == "pods" and listed.resource_version == "10"
    assert [i["metadata"]["name"] for i in listed.items] == ["a", "b"]
    assert "managedFields" not in listed.items[0]["metadata"]
    assert before <= listed.started <= time.monotonic()
    assert [(e.type, e.obj["metadata"]["name"]) for e in events[1:] if isinstance(e, Changed)] == [
        ("ADDED", "c"),
        ("MODIFIED", "a"),
        ("DELETED", "b"),
    ]
    assert len(events) == 4
    first, second = fn.calls[:2]
    assert "watch" not in first and first["_preload_content"] is False
    assert second["watch"] and second["resource_version"] == "10" and second["allow_watch_bookmarks"]
    assert second["timeout_seconds"] == reflector.WATCH_TIMEOUT_S
    assert second["_request_timeout"] == (10, reflector.WATCH_TIMEOUT_S + 30)
    assert second["_preload_content"] is False
    assert all(reply.released for reply in fn.replies[1:])
    assert watcher.listed.is_set() and watcher.lists == 1


def test_an_ended_watch_resumes_from_the_last_version_bookmarks_included_without_a_relist() -> None:
    fn, events, _, watcher, stop = reflect(
        [
            listing("10"),
            stream(("ADDED", obj("a", "11")), ("BOOKMARK", {"metadata": {"resourceVersion": "15"}})),
            Reply(lines=[{"type": "MODIFIED", "object": obj("a", "16")}], tail=False),  # no final newline
            stream(),
        ]
    )
    assert fn.watched_from == ["10", "15", "16", "16"]
    assert [type(e) for e in events] == [Listed, Changed, Changed]  # bookmarks are not handed over
    assert fn.list_calls == 1 and watcher.lists == 1
    assert stop.waits == []  # a watch that ends normally is resumed at once


def test_given_a_version_it_watches_from_there_without_listing_first() -> None:
    fn, events, _, watcher, _ = reflect([stream(("ADDED", obj("a", "8")))], resource_version="7")
    assert fn.list_calls == 0 and fn.watched_from == ["7", "8"]
    assert [type(e) for e in events] == [Changed]
    assert not watcher.listed.is_set() and watcher.lists == 0


@pytest.mark.parametrize("gone", ["event", "reply"])
def test_410_gone_relists_and_hands_the_whole_list_over(gone: str) -> None:
    first: Any = stream(gone_event()) if gone == "event" else ApiException(status=410, reason="Gone")
    fn, events, logs, watcher, _ = reflect(
        [first, listing("40", obj("b", "33"), obj("c", "39")), stream(("MODIFIED", obj("b", "41")))],
        resource_version="10",
    )
    listed = events[0]
    assert isinstance(listed, Listed) and listed.resource_version == "40"
    assert [i["metadata"]["name"] for i in listed.items] == ["b", "c"]
    assert isinstance(events[1], Changed) and events[1].type == "MODIFIED"
    assert fn.watched_from == ["10", "40", "41"]
    assert watcher.lists == 1
    assert "watch pods: resourceVersion 10 expired (410 Gone); listing again" in logs


def test_other_failures_resume_from_the_same_version_after_a_growing_backoff() -> None:
    fn, events, logs, watcher, stop = reflect(
        [
            listing("10"),
            ConnectionResetError("peer went away"),
            stream(("ERROR", {"kind": "Status", "code": 500, "message": "internal error"})),
            ApiException(status=500, reason="Internal Server Error"),
            ConnectionError("refused"),
            ConnectionError("refused"),
            ConnectionError("refused"),
            stream(),  # a watch that ends normally resets the backoff
            ConnectionError("refused"),
        ]
    )
    assert stop.waits == [0.2, 0.5, 1.0, 2.0, 5.0, 5.0, 0.2]
    assert set(fn.watched_from) == {"10"} and fn.list_calls == 1 and watcher.lists == 1
    assert [type(e) for e in events] == [Listed]
    assert "watch pods interrupted (ConnectionResetError: peer went away); resuming in 0.2 s" in logs
    assert any("watch error 500: internal error" in line for line in logs)


def test_a_failed_list_is_retried_after_the_backoff() -> None:
    fn, events, _, _, stop = reflect([ConnectionError("refused"), listing("3"), stream()])
    assert stop.waits == [0.2]
    assert [type(e) for e in events] == [Listed] and fn.watched_from == ["3", "3"]


def test_resync_lists_again_and_each_watch_ends_by_then() -> None:
    fn, events, _, watcher, _ = reflect([listing("1"), stream(), listing("2"), stream()], resync_s=0.0)
    assert [e.resource_version for e in events if isinstance(e, Listed)] == ["1", "2"]
    assert [c["timeout_seconds"] for c in fn.calls if c.get("watch")] == [1, 1]
    assert watcher.lists == 2

    fn, _, _, _, _ = reflect([listing("1"), stream()], resync_s=100.0, watch_timeout_s=120)
    timeouts = [c["timeout_seconds"] for c in fn.calls if c.get("watch")]
    assert all(98 <= t <= 100 for t in timeouts)
    assert all(c["_request_timeout"] == (10, 150) for c in fn.calls if c.get("watch"))


def test_without_resync_it_never_lists_again_on_its_own() -> None:
    fn, _, _, _, _ = reflect([listing("1"), stream(), stream(), stream()], watch_timeout_s=120)
    assert fn.list_calls == 1
    assert [c["timeout_seconds"] for c in fn.calls if c.get("watch")] == [120, 120, 120, 120]


def test_stop_ends_the_stream_at_once_and_releases_it() -> None:
    stop = RecordingStop()
    fn = FakeList([stream(("ADDED", obj("a", "11")), ("ADDED", obj("b", "12")))], stop)
    events: list[Event] = []

    def sink(event: Event) -> None:
        events.append(event)
        stop.set()

    Reflector("pods", fn, sink, stop, lambda _m: None, resource_version="10").run()
    assert [e.obj["metadata"]["name"] for e in events if isinstance(e, Changed)] == ["a"]
    assert fn.replies[0].released and len(fn.calls) == 1 and stop.waits == []


def test_stop_before_it_runs_makes_no_call() -> None:
    stop = RecordingStop()
    stop.set()
    fn = FakeList([listing("1")], stop)
    Reflector("pods", fn, lambda _e: None, stop, lambda _m: None).run()
    assert fn.calls == []


def test_stop_interrupts_the_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(reflector, "BACKOFF_S", (30.0,))
    stop = threading.Event()
    backing_off = threading.Event()

    def always_failing(**_kwargs: Any) -> Reply:
        raise ConnectionError("refused")

    def log(line: str) -> None:
        if "resuming in 30.0 s" in line:
            backing_off.set()

    watcher = Reflector("nodes", always_failing, lambda _e: None, stop, log)
    assert watcher.daemon and watcher.name == "watch-nodes"
    watcher.start()
    assert backing_off.wait(5)
    stop.set()
    watcher.join(5)
    assert not watcher.is_alive()

"""The watcher and the worker against scripted API replies: the paths a live cluster rarely takes.

A watch that ends, a 410 Gone (as an ERROR event or as the reply to the watch call), a dropped
connection; and a bind that fails after the annotations were patched. Each is scripted on a fake
``CoreV1Api`` that answers with raw JSON as the real client does with ``_preload_content=False``.
"""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from enforcement.reflector import Changed, Listed, Reflector
from fixtures.sandbox.controlplane import Sandbox, SandboxConfig
from fixtures.sandbox.errors import SandboxError
from fixtures.sandbox.scheduler import loop
from fixtures.sandbox.scheduler.loop import Scheduler, Settings
from fixtures.suite import manifests


class Reply:
    """What the client returns with ``_preload_content=False``: ``.data``, or a stream of lines."""

    def __init__(self, data: Any = None, lines: list[dict[str, Any]] | None = None) -> None:
        self.data = json.dumps(data).encode() if data is not None else b""
        self._lines = lines or []

    def stream(self, amt: Any = None, decode_content: bool = True) -> Iterator[bytes]:
        for line in self._lines:
            encoded = json.dumps(line).encode() + b"\n"
            yield encoded[:5]  # split across chunks, as a network would
            yield encoded[5:]

    def release_conn(self) -> None:
        pass


def obj(name: str, version: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "uid": name, "resourceVersion": version}}


class ScriptedList:
    """A ``list_*`` function: lists answer from ``lists``, watches play ``watches`` in order."""

    def __init__(self, lists: list[Any], watches: list[Any], stop: threading.Event) -> None:
        self.lists, self.watches, self.stop = lists, watches, stop
        self.watched_from: list[str] = []

    def __call__(self, **kwargs: Any) -> Reply:
        if not kwargs.get("watch"):
            return Reply(self.lists.pop(0))
        self.watched_from.append(kwargs["resource_version"])
        if not self.watches:
            self.stop.set()
            return Reply(lines=[])
        step = self.watches.pop(0)
        if isinstance(step, Exception):
            raise step
        return Reply(lines=step)


def run_watcher(fn: ScriptedList, stop: threading.Event) -> list[Any]:
    seen: queue.Queue[Any] = queue.Queue()
    watcher = Reflector("pods", fn, seen.put, stop, lambda _m: None, resource_version="10")
    watcher.start()
    watcher.join(10)
    assert not watcher.is_alive()
    return [seen.get_nowait() for _ in range(seen.qsize())]


def test_a_watch_that_ends_resumes_from_the_last_version_bookmarks_included() -> None:
    stop = threading.Event()
    fn = ScriptedList(
        [],
        [
            [{"type": "ADDED", "object": obj("a", "11")}, {"type": "BOOKMARK", "object": obj("", "15")}],
            [{"type": "DELETED", "object": obj("a", "16")}],
        ],
        stop,
    )
    events = run_watcher(fn, stop)
    assert [(e.type, e.obj["metadata"]["name"]) for e in events] == [("ADDED", "a"), ("DELETED", "a")]
    assert fn.watched_from == ["10", "15", "16"]


@pytest.mark.parametrize("gone", ["event", "reply"])
def test_410_gone_relists_and_hands_over_the_whole_list(gone: str) -> None:
    stop = threading.Event()
    first: Any = (
        [{"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old"}}]
        if gone == "event"
        else ApiException(status=410, reason="Gone")
    )
    listed = {"metadata": {"resourceVersion": "40"}, "items": [obj("b", "33")]}
    fn = ScriptedList([listed], [first, [{"type": "MODIFIED", "object": obj("b", "41")}]], stop)
    events = run_watcher(fn, stop)
    assert isinstance(events[0], Listed) and events[0].resource_version == "40"
    assert [i["metadata"]["name"] for i in events[0].items] == ["b"]
    assert isinstance(events[1], Changed) and events[1].type == "MODIFIED"
    assert fn.watched_from == ["10", "40", "41"]


def test_a_dropped_connection_resumes_without_a_relist() -> None:
    stop = threading.Event()
    fn = ScriptedList(
        [], [ConnectionResetError("peer went away"), [{"type": "ADDED", "object": obj("c", "12")}]], stop
    )
    events = run_watcher(fn, stop)
    assert [type(e) for e in events] == [Changed]
    assert fn.watched_from == ["10", "10", "12"]


# --------------------------------------------------------------------------- the worker


NODE = {
    "metadata": {
        "name": "n0",
        "labels": {"nvidia.com/gpu.count": "1", "nvidia.com/gpu.memory": "1000"},
        "annotations": {"gpuconf.io/gpu-uuids": "GPU-0"},
    },
    "status": {
        "conditions": [
            {"type": "Ready", "status": "True"},
            {"type": "gpu-fractioning.nvidia.com/Ready", "status": "True"},
        ]
    },
}


def pending(name: str, memory: str = "600") -> dict[str, Any]:
    made = manifests.pod(
        name,
        [manifests.container("main")],
        namespace="ns",
        uid=f"uid-{name}",
        annotations={"gpu-memory": memory},
        scheduler="s",
    )
    made["metadata"]["creationTimestamp"] = "2026-01-01T00:00:00Z"  # as the API server sets it
    return made


class FakeCore:
    """Records every write; the bind answers with ``bind_error`` if set."""

    def __init__(self, bind_error: Exception | None = None, bound_after_error: str = "") -> None:
        self.patches: list[tuple[str, dict[str, Any]]] = []
        self.binds: list[tuple[str, str]] = []
        self.status: list[str] = []
        self.events: list[str] = []
        self.calls: list[str] = []
        """"patch" and "bind", in the order they were made."""
        self.bind_error = bind_error
        self.bound_after_error = bound_after_error

    def patch_namespaced_pod(self, name: str, namespace: str, body: dict[str, Any], **_: Any) -> Reply:
        self.patches.append((name, body["metadata"]["annotations"]))
        self.calls.append("patch")
        return Reply({})

    def create_namespaced_pod_binding(
        self, name: str, namespace: str, body: dict[str, Any], **_: Any
    ) -> Reply:
        if self.bind_error is not None:
            raise self.bind_error
        self.binds.append((name, body["target"]["name"]))
        self.calls.append("bind")
        return Reply({})

    def read_namespaced_pod(self, name: str, namespace: str, **_: Any) -> Reply:
        pod = pending(name)
        pod["spec"]["nodeName"] = self.bound_after_error
        return Reply(pod)

    def patch_namespaced_pod_status(self, name: str, namespace: str, body: dict[str, Any], **_: Any) -> Reply:
        self.status.append(body["status"]["conditions"][0]["message"])
        return Reply({})

    def create_namespaced_event(self, namespace: str, body: dict[str, Any], **_: Any) -> Reply:
        self.events.append(body["reason"])
        return Reply({})


def worker(
    core: FakeCore, *pods: dict[str, Any], binders: int = 0, faults: frozenset[str] = frozenset()
) -> Scheduler:
    settings = Settings(name="s", scheduled_events=False, binders=binders, faults=faults)
    scheduler = Scheduler(core, settings, log=lambda _m: None)
    scheduler._apply(Listed("nodes", (NODE,), "1"))
    scheduler._apply(Listed("pods", pods, "2"))
    return scheduler


def run_once(scheduler: Scheduler) -> None:
    while scheduler._dirty:
        uid = scheduler._pop()
        if uid is not None:
            scheduler._schedule(uid)
    if scheduler._binders is not None:
        scheduler._binders.shutdown(wait=True)
        scheduler._drain(block=False)


def test_the_assumed_ledger_keeps_two_quick_pods_off_the_same_memory() -> None:
    core = FakeCore()
    scheduler = worker(core, pending("a"), pending("b"))
    run_once(scheduler)  # no watch event arrives in between: only the assumed entry knows about "a"
    assert core.binds == [("a", "n0")]
    assert scheduler.reasons["uid-b"].code == "insufficient-memory"
    assert core.status == ["no GPU with 600 MiB free: the largest free is 400 MiB (GPU GPU-0 of node n0)"]


def test_binder_threads_bind_what_the_worker_decided_in_order() -> None:
    core = FakeCore()
    scheduler = worker(core, pending("a", "400"), pending("b", "400"), pending("c", "400"), binders=2)
    run_once(scheduler)
    assert sorted(core.binds) == [("a", "n0"), ("b", "n0")]
    assert scheduler.reasons["uid-c"].code == "insufficient-memory"  # a and b were assumed before c
    assert scheduler._binding == {}


@pytest.mark.parametrize("binders", [0, 2])
def test_a_failed_bind_rolls_the_annotations_back(binders: int) -> None:
    core = FakeCore(bind_error=ApiException(status=409, reason="Conflict"))
    scheduler = worker(core, pending("a"), binders=binders)
    run_once(scheduler)
    (first, placed), (second, undo) = core.patches
    assert first == second == "a"
    assert placed["nvidia.com/container.main.gpus.devices"] == "GPU-0"
    assert undo == {key: None for key in placed}  # the Pod had none of these keys before
    assert scheduler.ledger.gpus() == {} and "uid-a" in scheduler.pending
    assert scheduler._later == {"uid-a"}, "tried again at the next retry tick, not at once"


def test_a_bind_whose_reply_was_lost_counts_as_bound() -> None:
    core = FakeCore(bind_error=ConnectionResetError("reply lost"), bound_after_error="n0")
    scheduler = worker(core, pending("a"))
    run_once(scheduler)
    assert len(core.patches) == 1
    assert scheduler.ledger.gpus() == {("n0", "GPU-0"): 600} and "uid-a" not in scheduler.pending


def bound(pod: dict[str, Any], annotations: dict[str, str | None] | None = None) -> dict[str, Any]:
    """``pod`` as the watch shows it once bound to n0, with ``annotations`` merged in."""
    meta = dict(pod["metadata"])
    merged = {**meta["annotations"], **(annotations or {})}
    meta["annotations"] = {k: v for k, v in merged.items() if v is not None}
    return {**pod, "metadata": meta, "spec": dict(pod["spec"], nodeName="n0")}


def test_annotations_are_written_before_the_bind() -> None:
    core = FakeCore()
    run_once(worker(core, pending("a")))
    assert core.calls == ["patch", "bind"]


def test_fault_annotate_after_bind_binds_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loop, "LATE_ANNOTATION_S", 0.0)
    core = FakeCore()
    scheduler = worker(core, pending("a"), pending("b"), faults=frozenset({"annotate-after-bind"}))
    run_once(scheduler)
    assert core.calls == ["bind", "patch"]  # the second Pod does not fit beside the first
    (_, written), *_ = core.patches
    assert written["nvidia.com/container.main.gpus.devices"] == "GPU-0"  # the same annotations, late
    # every other duty stands: while the bare bound Pod shows, its memory stays taken
    scheduler._apply(Changed("pods", "MODIFIED", bound(pending("a"))))
    assert scheduler.ledger.gpus() == {("n0", "GPU-0"): 600}
    scheduler._apply(Changed("pods", "MODIFIED", bound(pending("a"), written)))
    assert scheduler.ledger.gpus() == {("n0", "GPU-0"): 600} and not scheduler.ledger.is_assumed("uid-a")
    assert scheduler.reasons["uid-b"].code == "insufficient-memory"


def test_fault_annotate_after_bind_rolls_nothing_back_when_the_bind_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(loop, "LATE_ANNOTATION_S", 0.0)
    core = FakeCore(bind_error=ApiException(status=409, reason="Conflict"))
    scheduler = worker(core, pending("a"), faults=frozenset({"annotate-after-bind"}))
    run_once(scheduler)
    assert core.patches == [] and scheduler._later == {"uid-a"}


def feed(scheduler: Scheduler, *events: Changed | Listed) -> None:
    """Events as the watch delivers them (queued, so freed memory triggers retries), then a round."""
    for event in events:
        scheduler.queue.put(event)
    scheduler._drain(block=False)
    run_once(scheduler)


@pytest.mark.parametrize("leak", [False, True])
def test_finished_and_deleted_pods_release_their_memory_unless_leak_completed(leak: bool) -> None:
    core = FakeCore()
    faults = frozenset({"leak-completed"} if leak else ())
    scheduler = worker(core, pending("a"), pending("b"), pending("c"), faults=faults)
    run_once(scheduler)
    a = bound(pending("a"), dict(core.patches[0][1]))
    feed(
        scheduler,
        Changed("pods", "MODIFIED", a),
        Changed("pods", "MODIFIED", {**a, "status": {"phase": "Failed"}}),
    )
    if not leak:
        assert core.binds == [("a", "n0"), ("b", "n0")]
        b = bound(pending("b"), dict(core.patches[1][1]))
        feed(scheduler, Changed("pods", "MODIFIED", b), Changed("pods", "DELETED", b))
        assert core.binds == [("a", "n0"), ("b", "n0"), ("c", "n0")]
        return
    assert core.binds == [("a", "n0")]
    assert scheduler.ledger.gpus() == {("n0", "GPU-0"): 600}
    # deleted, or gone from a relist: still counted
    feed(scheduler, Changed("pods", "DELETED", a), Listed("pods", (pending("b"), pending("c")), "9"))
    assert core.binds == [("a", "n0")] and scheduler.ledger.gpus() == {("n0", "GPU-0"): 600}
    assert scheduler.reasons["uid-b"].code == "insufficient-memory"


@pytest.mark.parametrize("silent", [False, True])
def test_an_unschedulable_pod_says_why_unless_silent_unschedulable(silent: bool) -> None:
    core = FakeCore()
    faults = frozenset({"silent-unschedulable"} if silent else ())
    scheduler = worker(core, pending("big", "2000"), faults=faults)
    run_once(scheduler)
    scheduler.recorder.flush()
    assert scheduler.reasons["uid-big"].code == "insufficient-memory"  # decided the same way
    if silent:
        assert (core.status, core.events) == ([], [])
    else:
        assert core.status == [
            "no GPU with 2000 MiB free: the largest free is 1000 MiB (GPU GPU-0 of node n0)"
        ]
        assert core.events == ["FailedScheduling"]


def test_vague_unschedulable_says_why_without_naming_memory() -> None:
    core = FakeCore()
    scheduler = worker(core, pending("big", "2000"), faults=frozenset({"vague-unschedulable"}))
    run_once(scheduler)
    scheduler.recorder.flush()
    assert scheduler.reasons["uid-big"].code == "insufficient-memory"
    assert core.status == ["no GPU can take this Pod right now"] and core.events == ["FailedScheduling"]


def test_fault_place_on_retry_refuses_at_first_and_overcommits_at_a_retry_3_s_later(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = [100.0]
    monkeypatch.setattr(loop.time, "monotonic", lambda: clock[0])
    core = FakeCore()
    scheduler = worker(core, pending("big", "2000"), faults=frozenset({"place-on-retry"}))
    run_once(scheduler)
    assert scheduler.reasons["uid-big"].code == "insufficient-memory" and core.binds == []
    clock[0] += loop.LATE_PLACEMENT_S - 0.1  # a retry before the 3 s: still refused
    scheduler._retry({"uid-big"})
    run_once(scheduler)
    assert core.binds == []
    clock[0] += 0.2  # the first retry after it: placed anyway, on a GPU it does not fit
    scheduler._retry({"uid-big"})
    run_once(scheduler)
    assert core.binds == [("big", "n0")]


@pytest.mark.parametrize("blind", [False, True])
def test_fault_own_namespace_only_does_not_count_another_namespaces_pods(blind: bool) -> None:
    other = pending("other", "900")
    other["metadata"]["namespace"] = "elsewhere"
    other["spec"]["nodeName"] = "n0"
    other["metadata"]["annotations"] = {
        "nvidia.com/container.main.gpu-memory.request": "900Mi",
        "nvidia.com/container.main.gpus.devices": "GPU-0",
    }
    core = FakeCore()
    scheduler = worker(
        core, other, pending("p", "600"), faults=frozenset({"own-namespace-only"} if blind else ())
    )
    run_once(scheduler)
    assert core.binds == ([("p", "n0")] if blind else [])  # 900 + 600 MiB on a 1000 MiB GPU


def test_a_pod_given_a_toleration_is_tried_again() -> None:
    tainted = {**NODE, "spec": {"taints": [{"key": "k", "effect": "NoSchedule"}]}}
    core = FakeCore()
    scheduler = Scheduler(core, Settings(name="s", scheduled_events=False, binders=0), log=lambda _m: None)
    scheduler._apply(Listed("nodes", (tainted,), "1"))
    scheduler._apply(Listed("pods", (pending("a"),), "2"))
    run_once(scheduler)
    assert core.status == ["0/1 nodes match: 1 has taint k:NoSchedule not tolerated [n0]"]
    tolerant = pending("a")
    tolerant["spec"]["tolerations"] = [{"key": "k", "operator": "Exists"}]
    scheduler._apply(Changed("pods", "MODIFIED", tolerant))
    run_once(scheduler)
    assert core.binds == [("a", "n0")]


def test_a_bad_spec_fails_before_anything_starts(tmp_path: Path) -> None:
    box = Sandbox(SandboxConfig(state_dir=tmp_path / "sb", schedulers=("reference", "reference:bogus")))
    with pytest.raises(SandboxError, match=r"--scheduler 'reference:bogus': unknown fault 'bogus'"):
        box.up(log=lambda _m: None)
    assert not (tmp_path / "sb").exists()

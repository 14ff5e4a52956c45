"""The one Event recorder (agent, simulated kubelet, scheduler): aggregated, bounded, best effort."""

from __future__ import annotations

import threading
from typing import Any

from enforcement.events import MAX_MESSAGE, WARNING, EventRecorder, InvolvedPod

POD = {"metadata": {"namespace": "ns", "name": "p", "uid": "uid-p"}}


class FakeCore:
    def __init__(self, fail: bool = False, gate: threading.Event | None = None) -> None:
        self.created: list[dict[str, Any]] = []
        self.patched: list[tuple[str, dict[str, Any]]] = []
        self.fail = fail
        self.gate = gate
        self.entered = threading.Event()

    def create_namespaced_event(self, namespace: str, body: dict[str, Any], **_: Any) -> None:
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(5)
        if self.fail:
            raise RuntimeError("namespace ns is being terminated")
        self.created.append(body)

    def patch_namespaced_event(self, name: str, namespace: str, body: dict[str, Any], **_: Any) -> None:
        self.patched.append((name, body))


def recorder(core: FakeCore, logs: list[str] | None = None, **kw: Any) -> EventRecorder:
    return EventRecorder(core, "gpuconf-test", (logs if logs is not None else []).append, **kw)


def test_a_repeat_counts_on_the_first_event() -> None:
    core = FakeCore()
    events = recorder(core, host="node-a")
    for _ in range(3):
        events.record(POD, WARNING, "Failed", "Error: no command", "main")
    events.record(POD, WARNING, "Failed", "Error: another message", "main")
    assert len(core.created) == 2
    first = core.created[0]
    assert first["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": "ns",
        "name": "p",
        "uid": "uid-p",
        "fieldPath": "spec.containers{main}",
    }
    assert first["source"] == {"component": "gpuconf-test", "host": "node-a"}
    assert first["reportingInstance"] == "node-a" and "action" not in first
    assert [(name, body["count"]) for name, body in core.patched] == [
        (first["metadata"]["name"], 2),
        (first["metadata"]["name"], 3),
    ]


def test_forget_drops_a_pods_memory_and_the_memory_is_bounded() -> None:
    core = FakeCore()
    events = recorder(core, max_remembered=2)
    events.record(POD, WARNING, "A", "a")
    events.forget("uid-p")
    events.record(POD, WARNING, "A", "a")
    assert len(core.created) == 2 and core.patched == []
    events.record(POD, WARNING, "B", "b")
    events.record(POD, WARNING, "C", "c")
    assert events.remembered() == 2  # "A" went first
    events.record(POD, WARNING, "A", "a")
    assert len(core.created) == 5 and core.patched == []


def test_identity_prefix_action_and_a_long_message() -> None:
    core = FakeCore()
    events = recorder(core, instance="sched-host", prefix="simulated kubelet: ")
    pod = InvolvedPod("ns", "q", "uid-q")
    events.record(pod, WARNING, "FailedScheduling", "x" * 5000, action="Scheduling")
    events.record(POD, "Normal", "Started", "simulated kubelet: Started container main")
    long, started = core.created
    assert long["source"] == {"component": "gpuconf-test"} and long["reportingInstance"] == "sched-host"
    assert long["action"] == "Scheduling" and long["involvedObject"]["name"] == "q"
    assert len(long["message"]) == MAX_MESSAGE and long["message"].endswith("...")
    assert long["message"].startswith("simulated kubelet: xxx")
    assert started["message"] == "simulated kubelet: Started container main"  # the prefix once


def test_an_event_that_cannot_be_written_is_logged_never_raised() -> None:
    logs: list[str] = []
    events = recorder(FakeCore(fail=True), logs)
    events.record(POD, WARNING, "Failed", "boom")
    assert logs == [
        "could not record Event Failed on Pod ns/p: RuntimeError: namespace ns is being terminated"
    ]


def test_in_the_background_the_caller_does_not_wait_and_a_full_queue_drops() -> None:
    gate = threading.Event()
    core = FakeCore(gate=gate)
    logs: list[str] = []
    events = recorder(core, logs, background=True, queue_size=1)
    events.record(POD, WARNING, "One", "1")
    assert core.entered.wait(5)  # the worker took it and waits at the gate: the queue is empty
    events.record(POD, WARNING, "Two", "2")  # queued
    events.record(POD, WARNING, "Three", "3")  # no room
    assert core.created == [] and logs == ["Event queue full; dropped Three on Pod ns/p: 3"]
    gate.set()
    events.flush(5)
    assert [e["reason"] for e in core.created] == ["One", "Two"]

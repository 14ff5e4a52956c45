"""The agent's Pod watch: list then watch, resume from the last resourceVersion, relist on 410 Gone."""

from __future__ import annotations

import json
import threading
from typing import Any

from kubernetes.client.rest import ApiException

from enforcement.agent.agent import main
from enforcement.agent.watching import PodWatcher


class Resp:
    def __init__(self, data: Any = None, lines: list[dict[str, Any]] | None = None) -> None:
        self.data = json.dumps(data).encode() if data is not None else b""
        self._lines = lines or []

    def stream(self, amt=None, decode_content=True):
        payload = b"".join(json.dumps(e).encode() + b"\n" for e in self._lines)
        yield payload[:7]  # split mid-line: the reader must join chunks
        yield payload[7:]

    def release_conn(self) -> None:
        pass


def pod(uid: str, rv: str) -> dict[str, Any]:
    return {"metadata": {"uid": uid, "resourceVersion": rv, "name": uid}}


class FakeCore:
    """Scripted answers: each call pops the next; the test stops the watcher when the script ends."""

    def __init__(self, script: list[Any], stop: threading.Event) -> None:
        self.script = script
        self.calls: list[dict[str, Any]] = []
        self.stop = stop

    def list_pod_for_all_namespaces(self, **kwargs: Any) -> Resp:
        self.calls.append(kwargs)
        if not self.script:
            self.stop.set()
            raise ConnectionError("script over")
        step = self.script.pop(0)
        if isinstance(step, Exception):
            raise step
        return step


def run(script: list[Any]) -> tuple[FakeCore, list[Any], list[str]]:
    stop = threading.Event()
    core = FakeCore(script, stop)
    lists: list[Any] = []
    deleted: list[str] = []
    watcher = PodWatcher(
        core, "gpu-a-0", lambda uids, at: lists.append(sorted(uids)), deleted.append, stop, lambda m: None
    )
    watcher.run()
    return core, lists, deleted


def test_list_then_watch_from_its_version_with_bookmarks_and_deletions() -> None:
    core, lists, deleted = run(
        [
            Resp({"metadata": {"resourceVersion": "10"}, "items": [pod("a", "9"), pod("b", "10")]}),
            Resp(
                lines=[
                    {"type": "DELETED", "object": pod("a", "11")},
                    {"type": "BOOKMARK", "object": pod("", "15")},
                ]
            ),
            Resp(lines=[]),
        ]
    )
    assert lists == [["a", "b"]] and deleted == ["a"]
    assert core.calls[0]["field_selector"] == "spec.nodeName=gpu-a-0" and "watch" not in core.calls[0]
    assert core.calls[1]["watch"] and core.calls[1]["resource_version"] == "10"
    assert core.calls[1]["allow_watch_bookmarks"]
    assert core.calls[2]["resource_version"] == "15"  # resumed after the bookmark, no relist


def test_410_gone_lists_again_and_errors_resume_the_watch() -> None:
    core, lists, _ = run(
        [
            Resp({"metadata": {"resourceVersion": "10"}, "items": []}),
            ApiException(status=410),
            Resp({"metadata": {"resourceVersion": "20"}, "items": [pod("c", "20")]}),
            Resp(lines=[{"type": "ERROR", "object": {"code": 410, "message": "too old"}}]),
            Resp({"metadata": {"resourceVersion": "30"}, "items": []}),
            ConnectionError("API server restarting"),
            Resp(lines=[]),
        ]
    )
    assert lists == [[], ["c"], []]
    assert core.calls[-1]["resource_version"] == "30"


def test_usage_errors_exit_2(capsys) -> None:
    assert main(["--node", "n", "--hook-socket", "/tmp/x.sock", "--backend", "sim"]) == 2
    assert "--sim-dir" in capsys.readouterr().err

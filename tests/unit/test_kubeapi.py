"""``enforcement.kubeapi.CoreApi``: the same requests as ``CoreV1Api``, plain dicts back, and the
components that use it never import ``CoreV1Api``.

Both clients talk to one local HTTP server here that records every request and answers as
scripted, so what is compared is what goes on the wire (method, path and query, headers, body)
and what the caller gets back (decoded JSON, the raw response, ``ApiException``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from enforcement.agent.kube import KubeClient
from enforcement.discovery import discovery_pod
from enforcement.hook import ContainerRef
from enforcement.kubeapi import CoreApi
from enforcement.reflector import Changed, Listed, Reflector, pods_on_node

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "Bearer test-token"
DEFAULT_REPLY = {"kind": "Status", "metadata": {"name": "n", "resourceVersion": "7"}, "items": []}


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class Stub:
    """A local API server: records requests; ``replies[(method, path)]`` is (status, body, lines)."""

    url: str = ""
    seen: list[Seen] = field(default_factory=list)
    replies: dict[tuple[str, str], tuple[int, Any, list[dict[str, Any]] | None]] = field(default_factory=dict)

    def reply(self, method: str, path: str) -> tuple[int, Any, list[dict[str, Any]] | None]:
        return self.replies.get((method, path), (200, DEFAULT_REPLY, None))


@pytest.fixture
def stub() -> Iterator[Stub]:
    state = Stub()

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            headers = {k.lower(): v for k, v in self.headers.items()}
            state.seen.append(Seen(self.command, self.path, headers, json.loads(raw) if raw else None))
            status, body, lines = state.reply(self.command, self.path.split("?")[0])
            if lines is not None:
                data = b"".join(json.dumps(line).encode() + b"\n" for line in lines)
            else:
                data = json.dumps(body).encode() if body is not None else b""
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PATCH = do_DELETE = _answer

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        server.shutdown()
        server.server_close()


class TimingApiClient(client.ApiClient):
    """An ``ApiClient`` that also notes each request's ``_request_timeout`` (not seen on the wire)."""

    def __init__(self, configuration: client.Configuration) -> None:
        super().__init__(configuration)
        self.timeouts: list[Any] = []

    def call_api(self, *args: Any, _request_timeout: Any = None, **kwargs: Any) -> Any:
        self.timeouts.append(_request_timeout)
        return super().call_api(*args, _request_timeout=_request_timeout, **kwargs)


def api_client(stub: Stub) -> TimingApiClient:
    configuration = client.Configuration()
    configuration.host = stub.url
    configuration.api_key = {"authorization": TOKEN}
    return TimingApiClient(configuration)


WATCH = {
    "watch": True,
    "resource_version": "5",
    "allow_watch_bookmarks": True,
    "timeout_seconds": 240,
    "_request_timeout": (10, 270),
}
NOW = "2026-01-01T00:00:00Z"
EVENT = {
    "apiVersion": "v1",
    "kind": "Event",
    "metadata": {"name": "p.0123456789abcdef", "namespace": "ns"},
    "involvedObject": {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": "ns",
        "name": "p",
        "uid": "u",
        "fieldPath": "spec.containers{c}",
    },
    "reason": "GPUFractionEvicted",
    "message": "evicted",
    "type": "Warning",
    "source": {"component": "gpuconf-node-agent", "host": "n"},
    "reportingComponent": "gpuconf-node-agent",
    "reportingInstance": "n",
    "firstTimestamp": NOW,
    "lastTimestamp": NOW,
    "count": 1,
    "action": "Scheduling",
}
CONDITION = {"type": "X/Ready", "status": "True", "reason": "R", "message": "m", "lastHeartbeatTime": NOW}

CALLS: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = [
    # the agent
    (
        "create_namespaced_pod_eviction",
        (
            "p",
            "ns",
            {"metadata": {"name": "p", "namespace": "ns"}, "deleteOptions": {"preconditions": {"uid": "u"}}},
        ),
        {"_request_timeout": 15},
    ),
    ("patch_node_status", ("n", {"status": {"conditions": [CONDITION]}}), {"_request_timeout": 15}),
    ("patch_node_status", ("n", {"metadata": {"annotations": {"a": "b"}}}), {"_request_timeout": 15}),
    ("read_namespaced_pod", ("p", "ns"), {"_request_timeout": 5}),
    ("read_node", ("n",), {"_request_timeout": 15}),
    ("list_pod_for_all_namespaces", (), {"field_selector": "spec.nodeName=n", "_request_timeout": 60}),
    ("list_pod_for_all_namespaces", (), {"field_selector": "spec.nodeName=n", **WATCH}),
    # the Event recorder
    ("create_namespaced_event", ("ns", EVENT), {"_request_timeout": 15}),
    ("patch_namespaced_event", ("e", "ns", {"count": 2, "lastTimestamp": NOW}), {"_request_timeout": 15}),
    # the simulated kubelet
    (
        "delete_namespaced_pod",
        ("p", "ns"),
        {"body": {"gracePeriodSeconds": 0, "preconditions": {"uid": "u"}}},
    ),
    (
        "patch_namespaced_pod_status",
        ("p", "ns", {"metadata": {"uid": "u"}, "status": {"phase": "Running"}}),
        {},
    ),
    ("read_node", ("n",), {}),
    # the reference scheduler
    ("list_node", (), {"_request_timeout": 60}),
    ("list_node", (), WATCH),
    ("list_pod_for_all_namespaces", (), {"label_selector": "a=b"}),
    ("patch_namespaced_pod", ("p", "ns", {"metadata": {"annotations": {"a": "1", "b": None}}}), {}),
    (
        "create_namespaced_pod_binding",
        (
            "p",
            "ns",
            {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
                "target": {"apiVersion": "v1", "kind": "Node", "name": "n"},
            },
        ),
        {"_request_timeout": 30},
    ),
    ("create_namespaced_pod", ("ns", discovery_pod("p", "n", 2, "img")), {}),
    ("create_namespace", ({"metadata": {"name": "gpuconf-device-discovery"}},), {}),
    ("delete_namespaced_pod", ("p", "ns"), {"grace_period_seconds": 0}),
    # a JSON patch (a list) keeps its own content type
    ("patch_node_status", ("n", [{"op": "add", "path": "/metadata/labels/a", "value": "b"}]), {}),
    # the suite (fixtures.suite: its Cluster, PodWatch, cleanup, preflight, admission dry run)
    ("read_namespaced_pod", ("p", "ns"), {}),
    ("list_namespaced_pod", ("ns",), {"label_selector": "a=b", "field_selector": "status.phase=Running"}),
    ("list_namespaced_pod", ("ns",), {"limit": 1}),
    ("list_namespaced_pod", ("ns",), {"watch": True, "resource_version": "7", "allow_watch_bookmarks": True}),
    ("list_pod_for_all_namespaces", (), {"label_selector": "a=b", "field_selector": "spec.nodeName=n"}),
    ("create_namespaced_pod", ("ns", discovery_pod("p", "n", 2, "img")), {"dry_run": "All"}),
    ("read_namespaced_pod_log", ("p", "ns"), {"container": "main", "tail_lines": 80}),
    ("delete_collection_namespaced_pod", ("ns",), {"grace_period_seconds": 0}),
    ("list_namespaced_event", ("ns",), {"field_selector": "involvedObject.name=p"}),
    ("list_node", (), {"label_selector": "a=b"}),
    ("create_node", ({"metadata": {"name": "n", "labels": {"gpuconf.io/simulated": "true"}}},), {}),
    ("patch_node", ("n", {"spec": {"taints": []}}), {}),
    ("delete_node", ("n",), {}),
    ("create_namespace", ({"metadata": {"name": "ns", "labels": {"gpuconf.io/run": "r"}}},), {}),
    ("read_namespace", ("ns",), {}),
    ("list_namespace", (), {"label_selector": "gpuconf.io/suite=true"}),
    ("list_namespace", (), {}),
    ("delete_namespace", ("ns",), {"grace_period_seconds": 0}),
]


def _utc_z(value: Any) -> Any:
    """CoreV1Api validates an Event into its model and writes its times back as ``+00:00``."""
    if isinstance(value, dict):
        return {k: _utc_z(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_utc_z(v) for v in value]
    if isinstance(value, str) and value.endswith("+00:00"):
        return value[: -len("+00:00")] + "Z"
    return value


def _wire(seen: Seen) -> tuple[str, str, dict[str, str], Any]:
    headers = {k: v for k, v in seen.headers.items() if k != "content-length"}
    return seen.method, seen.path, headers, _utc_z(seen.body)


@pytest.mark.parametrize(("method", "args", "kwargs"), CALLS, ids=[c[0] for c in CALLS])
def test_each_call_sends_what_core_v1_api_sends(
    stub: Stub, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> None:
    old, new = api_client(stub), api_client(stub)
    getattr(client.CoreV1Api(old), method)(*args, _preload_content=False, **kwargs)
    getattr(CoreApi(new), method)(*args, _preload_content=False, **kwargs)
    assert len(stub.seen) == 2
    expected, got = _wire(stub.seen[0]), _wire(stub.seen[1])
    assert got == expected
    assert got[2]["authorization"] == TOKEN and got[2]["accept"] == "application/json"
    assert new.timeouts == old.timeouts == [kwargs.get("_request_timeout")]


def test_patches_are_strategic_merge_for_objects_and_json_patch_for_lists(stub: Stub) -> None:
    core = CoreApi(api_client(stub))
    core.patch_namespaced_pod("p", "ns", {"metadata": {}})
    core.patch_node_status("n", [{"op": "remove", "path": "/metadata/labels/a"}])
    core.create_namespaced_event("ns", EVENT)
    types = [s.headers.get("content-type") for s in stub.seen]
    assert types == ["application/strategic-merge-patch+json", "application/json-patch+json", None]


def test_a_reply_is_decoded_json_by_default_and_the_raw_response_on_request(stub: Stub) -> None:
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u"}, "spec": {"nodeName": "n"}}
    stub.replies[("GET", "/api/v1/namespaces/ns/pods/p")] = (200, pod, None)
    stub.replies[("DELETE", "/api/v1/namespaces/ns/pods/p")] = (200, None, None)
    core = CoreApi(api_client(stub))
    assert core.read_namespaced_pod("p", "ns") == pod
    raw = core.read_namespaced_pod("p", "ns", _preload_content=False)
    assert json.loads(raw.data) == pod
    assert core.delete_namespaced_pod("p", "ns") is None  # an empty body


@pytest.mark.parametrize(
    ("status", "kind"), [(404, client.exceptions.NotFoundException), (429, ApiException)]
)
@pytest.mark.parametrize("preload", [True, False])
def test_a_refusal_raises_the_api_exception_core_v1_api_raises(
    stub: Stub, status: int, kind: type[ApiException], preload: bool
) -> None:
    body = {"kind": "Status", "code": status, "message": "no"}
    stub.replies[("POST", "/api/v1/namespaces/ns/pods/p/eviction")] = (status, body, None)
    raised = []
    for core in (client.CoreV1Api(api_client(stub)), CoreApi(api_client(stub))):
        with pytest.raises(ApiException) as info:
            core.create_namespaced_pod_eviction(
                "p", "ns", {"metadata": {"name": "p"}}, _preload_content=preload
            )
        raised.append(info.value)
    old, new = raised
    assert type(new) is type(old) and isinstance(new, kind)
    assert (new.status, new.reason, json.loads(new.body)) == (old.status, old.reason, body)


def test_a_reflector_lists_and_watches_through_it(stub: Stub) -> None:
    listed = {"metadata": {"resourceVersion": "10"}, "items": [{"metadata": {"name": "a", "uid": "a"}}]}
    change = {"metadata": {"name": "b", "uid": "b", "resourceVersion": "11", "managedFields": [{}]}}
    stub.replies[("GET", "/api/v1/pods")] = (200, listed, None)
    stop, got = threading.Event(), []

    def sink(event: Any) -> None:
        got.append(event)
        stub.replies[("GET", "/api/v1/pods")] = (200, None, [{"type": "ADDED", "object": change}])
        if isinstance(event, Changed):
            stop.set()

    watcher = Reflector("pods", pods_on_node(CoreApi(api_client(stub)), "n"), sink, stop, lambda _m: None)
    watcher.start()
    watcher.join(10)
    assert not watcher.is_alive()
    assert isinstance(got[0], Listed) and got[0].resource_version == "10"
    assert isinstance(got[1], Changed) and got[1].obj == {
        "metadata": {"name": "b", "uid": "b", "resourceVersion": "11"}
    }
    assert stub.seen[1].path == (
        "/api/v1/pods?allowWatchBookmarks=true&fieldSelector=spec.nodeName%3Dn&resourceVersion=10"
        f"&timeoutSeconds={watcher.watch_timeout_s}&watch=true"
    )


def test_the_agents_kube_client_sorts_the_replies_as_before(stub: Stub) -> None:
    kube = KubeClient(api_client(stub), "n", lambda _m: None, condition="X/Ready")
    ref = ContainerRef("ns", "p", "u", "c")
    eviction = ("POST", "/api/v1/namespaces/ns/pods/p/eviction")
    for status, outcome in ((201, "evicted"), (429, "blocked"), (404, "gone"), (409, "gone")):
        stub.replies[eviction] = (status, {"kind": "Status"}, None)
        assert kube.evict(ref) == outcome
    assert stub.seen[0].body == {
        "metadata": {"name": "p", "namespace": "ns"},
        "deleteOptions": {"preconditions": {"uid": "u"}},
    }
    stub.replies[("GET", "/api/v1/namespaces/ns/pods/p")] = (404, {"kind": "Status"}, None)
    assert kube.read_pod("ns", "p") is None
    kube.set_condition(True, "Ready", "ok")
    patch = stub.seen[-1]
    assert patch.headers["content-type"] == "application/strategic-merge-patch+json"
    assert patch.body["status"]["conditions"][0]["type"] == "X/Ready"


# ---- the guard: no component pays for CoreV1Api again

KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "http://127.0.0.1:9"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""

# Each runs the component's own main up to where it would start serving: its clients are built
# exactly as in a sandbox, and nothing is sent.
STARTS = {
    "agent": """
        import enforcement.agent.__main__
        from enforcement.agent import agent

        class Built(Exception):
            pass

        def stop_here(*args, **kwargs):
            raise Built(kwargs["core_v1"])

        agent.make_backend = lambda args: None
        agent.Agent = stop_here
        try:
            agent.main(["--node", "n", "--kubeconfig", KUBECONFIG, "--hook-socket", "/nonexistent/hook"])
        except Built as built:
            core = built.args[0]
        """,
    "kubelet": """
        import fixtures.sandbox.noderuntime.__main__ as entry
        from fixtures.sandbox.noderuntime import runtime

        built = []
        runtime.NodeRuntime.serve = lambda self, ready=None: built.append(self.core)
        assert entry.main(["--node", "n", "--kubeconfig", KUBECONFIG, "--hook-socket", "/nonexistent/hook",
                           "--work-dir", WORK]) == 0
        core = built[0]
        """,
    "scheduler": """
        import fixtures.sandbox.scheduler.__main__ as entry
        from fixtures.sandbox.scheduler import loop

        built = []
        loop.Scheduler.run = lambda self: built.append(self.core)
        assert entry.main(["--kubeconfig", KUBECONFIG, "--name", "s"]) == 0
        core = built[0]
        """,
}


@pytest.mark.parametrize("component", sorted(STARTS))
def test_no_component_imports_core_v1_api(component: str, tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(KUBECONFIG)
    script = (
        f"KUBECONFIG, WORK = {str(kubeconfig)!r}, {str(tmp_path / 'work')!r}\n"
        + textwrap.dedent(STARTS[component])
        + textwrap.dedent("""
        import sys
        from enforcement.kubeapi import CoreApi
        assert type(core) is CoreApi, type(core)
        heavy = sorted(m for m in sys.modules if m.startswith("kubernetes.client.api."))
        print("HEAVY", heavy)
        assert "kubernetes.client.api.core_v1_api" not in sys.modules, heavy
        """)
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "HEAVY []" in done.stdout, done.stdout

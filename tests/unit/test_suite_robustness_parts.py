"""The parts that keep a run sane when the cluster misbehaves, without a cluster.

``tests/integration/test_suite_robustness.py`` shows them on the sandbox (an API server killed,
agents restarted, SIGINT, hostile Pods); these pin each part down on its own:

- a failure to talk to the API server reads as one clear line (``api_failure``), not urllib3's pool
  and retry count, and a request names a timeout even when its caller did not;
- a Pod created before its namespace's ``default`` ServiceAccount exists is retried, any other
  refusal is not;
- a Lease the API server did not take back is retried later, not forgotten; a run's leftover
  Leases go by its label;
- a Pod watch that keeps failing records the gap once;
- a flooding container's log is cut back to its end.
"""

from __future__ import annotations

import socket
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import urllib3
from kubernetes.client.rest import ApiException

from fixtures.sandbox.noderuntime.containers import cap_log
from fixtures.suite import cluster as cluster_module
from fixtures.suite import leases as leases_module
from fixtures.suite.cluster import Cluster, api_failure, service_account_missing
from fixtures.suite.podwatch import PodWatch

# ------------------------------------------------------------------------------- api_failure


def refused_connection() -> urllib3.exceptions.MaxRetryError:
    """What the Kubernetes client raises when nothing listens on the API server's port."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # free, and nobody listens on it
    pool = urllib3.HTTPConnectionPool("127.0.0.1", port, retries=urllib3.Retry(0))
    with pytest.raises(urllib3.exceptions.MaxRetryError) as raised:
        pool.request("GET", "/api/v1/namespaces/x/pods/y")
    return raised.value


def test_a_refused_connection_names_the_server_the_request_and_the_cause() -> None:
    exc = refused_connection()
    text = api_failure(exc)
    assert text is not None
    assert text.startswith("the API server at http://127.0.0.1:") and "did not answer" in text
    assert "/api/v1/namespaces/x/pods/y" in text and text.endswith("connection refused")
    assert "HTTPConnectionPool" not in text and "Max retries" not in text


def test_an_api_refusal_says_the_status_and_the_servers_message() -> None:
    exc = ApiException(status=403, reason="Forbidden")
    exc.body = '{"kind":"Status","message":"pods \\"p\\" is forbidden: no","code":403}'
    assert api_failure(exc) == 'the API server answered 403 Forbidden: pods "p" is forbidden: no'
    assert api_failure(ApiException(status=500, reason="Internal")) == "the API server answered 500 Internal"


def test_a_dropped_connection_and_other_errors() -> None:
    reset = urllib3.exceptions.ProtocolError(
        "Connection aborted.", ConnectionResetError(104, "Connection reset")
    )
    assert api_failure(reset) == "the API server did not answer: connection reset"
    from http.client import RemoteDisconnected

    dropped = urllib3.exceptions.ProtocolError(
        "Connection aborted.", RemoteDisconnected("Remote end closed connection without response")
    )
    assert (
        api_failure(dropped) == "the API server did not answer: remote end closed connection without response"
    )
    assert api_failure(KeyError("x")) is None and api_failure(AssertionError("no")) is None


def test_every_request_gets_a_timeout_unless_it_names_one(tmp_path: Path) -> None:
    seen: list[Any] = []
    api = SimpleNamespace(
        rest_client=SimpleNamespace(request=lambda *a, **kw: seen.append(kw["_request_timeout"]))
    )
    cluster_module._bound_requests(api)
    api.rest_client.request("GET", "/x", _request_timeout=None)
    api.rest_client.request("GET", "/x", _request_timeout=(10, 90))
    api.rest_client.request("GET", "/x")
    assert seen == [cluster_module.REQUEST_TIMEOUT_S, (10, 90), cluster_module.REQUEST_TIMEOUT_S]


# ------------------------------------------------------------------------------- Pod creation


def missing_service_account() -> ApiException:
    exc = ApiException(status=403, reason="Forbidden")
    exc.body = (
        '{"message":"pods \\"p\\" is forbidden: error looking up service account ns/default: '
        'serviceaccount \\"default\\" not found","code":403}'
    )
    return exc


class FakeCore:
    def __init__(self, failures: list[ApiException]) -> None:
        self.failures = failures
        self.calls = 0

    def create_namespaced_pod(self, namespace: str, body: Any, **_: Any) -> Any:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return SimpleNamespace(data=b'{"metadata": {"name": "p"}}')


def fake_cluster(core: Any) -> Cluster:
    cluster = Cluster.__new__(Cluster)
    cluster.core = core
    return cluster


def test_a_pod_waits_for_its_namespaces_service_account(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cluster_module.time, "sleep", lambda _s: None)
    core = FakeCore([missing_service_account(), missing_service_account()])
    assert fake_cluster(core).create_pod("ns", {}) == {"metadata": {"name": "p"}}
    assert core.calls == 3
    assert service_account_missing(missing_service_account())


def test_any_other_refusal_is_raised_at_once() -> None:
    forbidden = ApiException(status=403, reason="Forbidden")
    forbidden.body = '{"message":"pods is forbidden: User \\"u\\" cannot create resource","code":403}'
    core = FakeCore([forbidden])
    with pytest.raises(ApiException):
        fake_cluster(core).create_pod("ns", {})
    assert core.calls == 1 and not service_account_missing(forbidden)


def test_the_wait_for_a_service_account_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter(range(0, 10_000, 10))
    monkeypatch.setattr(cluster_module.time, "monotonic", lambda: float(next(clock)))
    monkeypatch.setattr(cluster_module.time, "sleep", lambda _s: None)
    core = FakeCore([missing_service_account() for _ in range(100)])
    with pytest.raises(ApiException):
        fake_cluster(core).create_pod("ns", {})
    assert core.calls <= cluster_module.SERVICE_ACCOUNT_WAIT_S / 10 + 2


# ------------------------------------------------------------------------------- Leases


class FakeCoordination:
    """Leases in memory; ``down`` makes every call fail as a dead API server does."""

    def __init__(self) -> None:
        self.leases: dict[str, Any] = {}
        self.down = False

    def _check(self) -> None:
        if self.down:
            raise refused_connection()

    def create_namespaced_lease(self, namespace: str, body: dict[str, Any]) -> Any:
        self._check()
        name = body["metadata"]["name"]
        if name in self.leases:
            raise ApiException(status=409, reason="Conflict")
        lease = SimpleNamespace(
            metadata=SimpleNamespace(
                name=name, uid=f"uid-{name}", resource_version="1", labels=body["metadata"]["labels"]
            ),
            spec=SimpleNamespace(holder_identity=body["spec"]["holderIdentity"]),
        )
        self.leases[name] = lease
        return lease

    def read_namespaced_lease(self, name: str, namespace: str) -> Any:
        self._check()
        if name not in self.leases:
            raise ApiException(status=404, reason="Not Found")
        return self.leases[name]

    def delete_namespaced_lease(self, name: str, namespace: str, body: Any = None) -> None:
        self._check()
        if self.leases.pop(name, None) is None:
            raise ApiException(status=404, reason="Not Found")

    def list_namespaced_lease(self, namespace: str, label_selector: str = "") -> Any:
        self._check()
        key, _, value = label_selector.partition("=")
        return SimpleNamespace(items=[x for x in self.leases.values() if x.metadata.labels.get(key) == value])


def leases_on(api: FakeCoordination, holder: str = "run-1/gw0") -> leases_module.Leases:
    cluster = SimpleNamespace(coordination=api)
    leases = leases_module.Leases(cluster, "run-1", holder)  # type: ignore[arg-type]
    leases._start_renewing = lambda: None  # type: ignore[method-assign]
    return leases


def test_a_lease_the_api_server_did_not_take_back_is_released_later() -> None:
    api = FakeCoordination()
    leases = leases_on(api)
    assert leases.try_take("node-a", "node")
    api.down = True
    with pytest.raises(urllib3.exceptions.MaxRetryError):
        leases.release(["node-a"])
    assert "node-a" in api.leases and "node-a" not in leases._held  # no longer renewed ...
    api.down = False
    leases.release_all()  # ... but given back once the API server answers
    assert api.leases == {}


def test_release_all_survives_a_dead_api_server_and_the_run_label_finds_every_lease() -> None:
    api = FakeCoordination()
    mine, worker = leases_on(api, "run-1/controller"), leases_on(api, "run-1/gw1")
    assert mine.try_take("run-run-1", "run") and worker.try_take("node-b", "node")
    api.down = True
    with pytest.raises(urllib3.exceptions.MaxRetryError):
        mine.release_all()
    api.down = False
    # A worker stopped mid-check never gave node-b back: the run's label finds it.
    assert sorted(leases_module.delete_run_leases(SimpleNamespace(coordination=api), "run-1")) == [  # type: ignore[arg-type]
        "node-b",
        "run-run-1",
    ]
    assert api.leases == {}


# ------------------------------------------------------------------------------- the Pod watch


def test_a_watch_that_keeps_failing_records_the_gap_once() -> None:
    watch = PodWatch.__new__(PodWatch)
    watch.gaps = []
    for _ in range(50):
        watch._gap("watch interrupted (MaxRetryError); resumed from 7")
    watch._gap("watch interrupted (ProtocolError); resumed from 9")
    assert watch.gaps == [
        "watch interrupted (MaxRetryError); resumed from 7",
        "watch interrupted (ProtocolError); resumed from 9",
    ]


# ------------------------------------------------------------------------------- container logs


def test_a_flooding_log_is_cut_back_to_its_end(tmp_path: Path) -> None:
    log = tmp_path / "0.log"
    lines = [f"line {i:06d}".encode() for i in range(20_000)]
    log.write_bytes(b"\n".join(lines) + b"\n")
    size = log.stat().st_size
    assert not cap_log(log, max_bytes=size, keep_bytes=1000), "at the limit: left alone"
    assert cap_log(log, max_bytes=size - 1, keep_bytes=1000)
    text = log.read_bytes()
    assert len(text) < 1200 and text.startswith(b"[simulated kubelet: the log grew past")
    kept = text.splitlines()[1:]
    assert kept[-1] == b"line 019999" and all(line.startswith(b"line ") and len(line) == 11 for line in kept)
    assert not cap_log(tmp_path / "gone.log")


def test_a_writer_appending_goes_on_at_the_new_end(tmp_path: Path) -> None:
    log = tmp_path / "0.log"
    with open(log, "ab") as writer:  # the container's stdout is opened O_APPEND, as here
        writer.write(b"x" * 5000 + b"\n")
        writer.flush()
        assert cap_log(log, max_bytes=1000, keep_bytes=100)
        writer.write(b"after\n")
        writer.flush()
    assert log.read_bytes().endswith(b"after\n") and log.stat().st_size < 300


# ------------------------------------------------------------------------------- the end of a run


def test_the_end_of_a_run_survives_an_api_server_that_is_gone(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Cleanup with no API server: it says what it could not do and returns, so the results are
    still written (before, release_all's connection error ended the run without run.json)."""
    from fixtures.suite import cleanup

    class Dead:
        def __getattr__(self, _name: str) -> Any:
            def call(*_a: Any, **_k: Any) -> Any:
                raise refused_connection()

            return call

    cluster = Cluster.__new__(Cluster)
    cluster.core = Dead()
    cluster.coordination = Dead()
    cluster.api = SimpleNamespace(configuration=SimpleNamespace(host="https://127.0.0.1:1"))
    cluster.ready = lambda timeout=5.0: False  # type: ignore[method-assign]
    monkeypatch.setattr(cleanup, "API_BACK_S", 0.2)
    monkeypatch.setattr(cluster_module.time, "sleep", lambda _s: None)
    leases = leases_module.Leases(cluster, "run-1", "run-1/controller")
    leases._held["run-run-1"] = "1"
    state = SimpleNamespace(cluster=cluster, options=SimpleNamespace(run_id="run-1"), leases=leases)
    config = SimpleNamespace(pluginmanager=SimpleNamespace(get_plugin=lambda _name: None))
    assert cleanup.cleanup_run(state, config) == []  # type: ignore[arg-type]
    said = capsys.readouterr().err
    assert "cleanup waits up to" in said and "has not been ready" in said
    assert "could not release the run's Leases (the API server at http://127.0.0.1:" in said

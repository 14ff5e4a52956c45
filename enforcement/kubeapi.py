"""The few core/v1 calls the sandbox components and the suite make, sent without the client's models.

The node agent, the simulated kubelet, the reference scheduler and the suite's ``Cluster``
(``fixtures.suite.cluster``) read and write plain dicts (the contract module reads dicts;
``enforcement.reflector`` decodes JSON itself), yet ``kubernetes.client.CoreV1Api`` costs about a
CPU-second per process to build: its ~400 methods carry pydantic ``@validate_call`` and it imports
some 260 model classes. A mutation run starts about a hundred such processes on two cores, and
every ``gpuconf run`` (and each of its xdist workers) is one more. So they talk through ``CoreApi``,
which keeps what is worth keeping of the official client, its ``ApiClient`` (kubeconfig, TLS,
the bearer token and its refresh, the connection pool, the retries of its REST layer), and
sends each request through ``ApiClient.param_serialize`` and ``ApiClient.call_api``: the same
URL, query, headers and body ``CoreV1Api`` sends, and nothing built in between.

What it keeps of ``CoreV1Api``'s surface, so that callers and their test doubles need no change:

- the **method names and keyword arguments** the components use (``field_selector``,
  ``label_selector``, ``resource_version``, ``watch``, ``allow_watch_bookmarks``,
  ``timeout_seconds``, ``grace_period_seconds``, ``_request_timeout``), in the order
  ``CoreV1Api`` puts them in the query; a list method is a ``reflector.ListFn``;
- ``_preload_content=False`` returns the **raw urllib3 response** (``.data``, ``.stream()``,
  ``.release_conn()``), as ``CoreV1Api`` does; by default the reply is **decoded JSON** (a plain
  dict where ``CoreV1Api`` returns a model; ``None`` for an empty body);
- a non-2xx reply raises ``kubernetes.client.rest.ApiException`` (the status's subclass, as
  ``ApiException.from_response`` picks it) with ``.status``, ``.reason`` and ``.body``;
- **patch types as on the wire today**: ``CoreV1Api`` labels every patch
  ``application/json-patch+json`` and its REST layer relabels an object body
  ``application/strategic-merge-patch+json``; here a dict is sent as a strategic merge patch and
  a list as a JSON patch, directly. Creates and deletes carry no ``Content-Type`` (the REST layer
  sends JSON), and every request ``Accept: application/json``, as ``CoreV1Api``'s do.

One difference, on purpose: a body goes out as the caller wrote it. ``CoreV1Api`` first validates
a dict into its model and serialises that back, which drops fields its model lacks and rewrites
``...Z`` timestamps as ``...+00:00`` (the API server reads both the same).

``tests/unit/test_kubeapi.py`` holds it to all of that against ``CoreV1Api`` on a local HTTP
server, and checks that the components' entry modules never import ``CoreV1Api``. The client is
imported only when a request is made, as in ``enforcement.reflector``: the agent's modules
import without it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Final

Timeout = float | tuple[float, float] | None
"""``_request_timeout``: total seconds, or (connect, read), as the client takes it."""
Reply = Any
"""Decoded JSON by default; with ``_preload_content=False`` the raw ``urllib3.HTTPResponse``."""

ACCEPT: Final = "application/json"
STRATEGIC_MERGE_PATCH: Final = "application/strategic-merge-patch+json"
JSON_PATCH: Final = "application/json-patch+json"
AUTH_SETTINGS: Final = ("BearerToken",)
"""What every ``CoreV1Api`` operation names: the configuration's ``authorization`` key."""


class CoreApi:
    """core/v1 on ``api_client`` (a ``kubernetes.client.ApiClient``), only the calls the agent, the
    simulated kubelet, the reference scheduler and the suite make; see the module docstring."""

    def __init__(self, api_client: Any) -> None:
        self.api_client = api_client

    # ---- Pods

    def read_namespaced_pod(
        self, name: str, namespace: str, *, _preload_content: bool = True, _request_timeout: Timeout = None
    ) -> Reply:
        return self._call(
            "GET",
            "/api/v1/namespaces/{namespace}/pods/{name}",
            {"namespace": namespace, "name": name},
            preload=_preload_content,
            timeout=_request_timeout,
        )

    def list_pod_for_all_namespaces(
        self,
        *,
        allow_watch_bookmarks: bool | None = None,
        field_selector: str | None = None,
        label_selector: str | None = None,
        resource_version: str | None = None,
        timeout_seconds: int | None = None,
        watch: bool | None = None,
        _preload_content: bool = True,
        _request_timeout: Timeout = None,
    ) -> Reply:
        return self._call(
            "GET",
            "/api/v1/pods",
            query=_list_query(
                allow_watch_bookmarks,
                field_selector,
                label_selector,
                resource_version,
                timeout_seconds,
                watch,
            ),
            preload=_preload_content,
            timeout=_request_timeout,
        )

    def list_namespaced_pod(
        self,
        namespace: str,
        *,
        allow_watch_bookmarks: bool | None = None,
        field_selector: str | None = None,
        label_selector: str | None = None,
        limit: int | None = None,
        resource_version: str | None = None,
        timeout_seconds: int | None = None,
        watch: bool | None = None,
        _preload_content: bool = True,
        _request_timeout: Timeout = None,
    ) -> Reply:
        return self._call(
            "GET",
            "/api/v1/namespaces/{namespace}/pods",
            {"namespace": namespace},
            query=_list_query(
                allow_watch_bookmarks,
                field_selector,
                label_selector,
                resource_version,
                timeout_seconds,
                watch,
                limit,
            ),
            preload=_preload_content,
            timeout=_request_timeout,
        )

    def create_namespaced_pod(
        self,
        namespace: str,
        body: Mapping[str, Any],
        *,
        dry_run: str | None = None,
        _preload_content: bool = True,
        _request_timeout: Timeout = None,
    ) -> Reply:
        return self._call(
            "POST",
            "/api/v1/namespaces/{namespace}/pods",
            {"namespace": namespace},
            query=[("dryRun", dry_run)],
            body=body,
            preload=_preload_content,
            timeout=_request_timeout,
        )

    def read_namespaced_pod_log(
        self,
        name: str,
        namespace: str,
        *,
        container: str | None = None,
        tail_lines: int | None = None,
        _preload_content: bool = True,
        _request_timeout: Timeout = None,
    ) -> Reply:
        # The log is text, not JSON: ask for it raw (``_preload_content=False``), as the suite does.
        return self._call(
            "GET",
            "/api/v1/namespaces/{namespace}/pods/{name}/log",
            {"namespace": namespace, "name": name},
            query=[("container", container), ("tailLines", tail_lines)],
            preload=_preload_content,
            timeout=_request_timeout,
        )

    def delete_collection_namespaced_pod(
        self,
        namespace: str,
        *,
        grace_period_seconds: int | None = None,
        _preload_content: bool = True,
        _request_timeout: Timeout = None,
    ) -> Reply:
        return self._call(
            "DELETE",
            "/api/v1/namespaces/{namespace}/pods",
            {"namespace": namespace},
            query=[("gracePeriodSeconds", grace_period_seconds)],
            preload=_preload_content,
            timeout=_request_timeout,
        )

    def patch_namespaced_pod(
        self,
        name: str,
        namespace: str,
        body: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        *,
        _preload_content: bool = True,
        _request_timeout: Timeout = None,
    ) -> Reply:
        return self._patch(
            "/api/v1/namespaces/{namespace}/pods/{name}",
            {"namespace": namespace, "name": name},
            body,
            _preload_content,
            _request_timeout,
        )

    def patch_namespaced_pod_status(
        self,
        name: str,
        namespace: str,
        body: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        *,
        _preload_content: bool = True,
        _request_timeout: Timeout = None,
    ) -> Reply:
        return self._patch(
            "/api/v1/namespaces/{namespace}/pods/{name}/status",
            {"namespace": namespace, "name": name},
            body,
            _preload_content,
            _request_timeout,
        )

    def delete_namespaced_pod(
        self,
        name: str,
        namespace: str,
        *,
        grace_period_seconds: int | None = None,
        body: Mapping[str, Any] | None = None,
        _preload_content: bool = True,
        _request_timeout: Timeout = None,
    ) -> Reply:
        return self._call(
            "DELETE",
            "/api/v1/namespaces/{namespace}/pods/{name}",
            {"namespace": namespace, "name": name},
            query=[("gracePeriodSeconds", grace_period_seconds)],
            body=body,
            preload=_preload_content,
            timeout=_request_timeout,
        )

    def create_namespaced_pod_binding(
        self,
        name: str,
        namespace: str,
        body: Mapping[str, Any],
        *,
        _preload_content: bool = True,
        _request_timeout: Timeout = None,
    ) -> Reply:
        return self._call(
            "POST",
            "/api/v1/namespaces/{namespace}/pods/{name}/binding",
            {"namespace": namespace, "name": name},
            body=body,
            preload=_preload_content,
            timeout=_request_timeout,
        )

    def create_namespaced_pod_eviction(
        self,
        name: str,
        namespace: str,
        body: Mapping[str, Any],
        *,
        _preload_content: bool = True,
        _request_timeout: Timeout = None,
    ) -> Reply:
        return self._call(
            "POST",
            "/api/v1/namespaces/{namespace}/pods/{name}/eviction",
            {"namespace": namespace, "name": name},
            body=body,
            preload=_preload_content,
            timeout=_request_timeout,
        )

    # ---- Nodes

    def read_node(
        self, name: str, *, _preload_content: bool = True, _request_timeout: Timeout = None
    ) -> Reply:
        return self._call(
            "GET", "/api/v1/nodes/{name}", {"name": name}, preload=_preload_content, timeout=_request_timeout
        )

    def list_node(
        self,
        *,
        allow_watch_bookmarks: bool | None = None,
        field_selector: str | None = None,
        label_selector: str | None = None,
        resource_version: str | None = None,
        timeout_seconds: int | None = None,
        watch: bool | None = None,
        _preload_content: bool = True,
        _request_timeout: Timeout = None,
    ) -> Reply:
        return self._call(
            "GET",
            "/api/v1/nodes",
            query=_list_query(
                allow_watch_bookmarks,
                field_selector,
                label_selector,
                resource_version,
                timeout_seconds,
                watch,
            ),
            preload=_preload_content,
            timeout=_request_timeout,
        )

    def create_node(
        self, body: Mapping[str, Any], *, _preload_content: bool = True, _request_timeout: Timeout = None
    ) -> Reply:
        return self._call(
            "POST", "/api/v1/nodes", body=body, preload=_preload_content, timeout=_request_timeout
        )

    def patch_node(
        self,
        name: str,
        body: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        *,
        _preload_content: bool = True,
        _request_timeout: Timeout = None,
    ) -> Reply:
        return self._patch("/api/v1/nodes/{name}", {"name": name}, body, _preload_content, _request_timeout)

    def delete_node(
        self, name: str, *, _preload_content: bool = True, _request_timeout: Timeout = None
    ) -> Reply:
        return self._call(
            "DELETE",
            "/api/v1/nodes/{name}",
            {"name": name},
            preload=_preload_content,
            timeout=_request_timeout,
        )

    def patch_node_status(
        self,
        name: str,
        body: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        *,
        _preload_content: bool = True,
        _request_timeout: Timeout = None,
    ) -> Reply:
        return self._patch(
            "/api/v1/nodes/{name}/status", {"name": name}, body, _preload_content, _request_timeout
        )

    # ---- Events and Namespaces

    def create_namespaced_event(
        self,
        namespace: str,
        body: Mapping[str, Any],
        *,
        _preload_content: bool = True,
        _request_timeout: Timeout = None,
    ) -> Reply:
        return self._call(
            "POST",
            "/api/v1/namespaces/{namespace}/events",
            {"namespace": namespace},
            body=body,
            preload=_preload_content,
            timeout=_request_timeout,
        )

    def patch_namespaced_event(
        self,
        name: str,
        namespace: str,
        body: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        *,
        _preload_content: bool = True,
        _request_timeout: Timeout = None,
    ) -> Reply:
        return self._patch(
            "/api/v1/namespaces/{namespace}/events/{name}",
            {"namespace": namespace, "name": name},
            body,
            _preload_content,
            _request_timeout,
        )

    def create_namespace(
        self, body: Mapping[str, Any], *, _preload_content: bool = True, _request_timeout: Timeout = None
    ) -> Reply:
        return self._call(
            "POST", "/api/v1/namespaces", body=body, preload=_preload_content, timeout=_request_timeout
        )

    def list_namespaced_event(
        self,
        namespace: str,
        *,
        field_selector: str | None = None,
        label_selector: str | None = None,
        _preload_content: bool = True,
        _request_timeout: Timeout = None,
    ) -> Reply:
        return self._call(
            "GET",
            "/api/v1/namespaces/{namespace}/events",
            {"namespace": namespace},
            query=_list_query(None, field_selector, label_selector, None, None, None),
            preload=_preload_content,
            timeout=_request_timeout,
        )

    def read_namespace(
        self, name: str, *, _preload_content: bool = True, _request_timeout: Timeout = None
    ) -> Reply:
        return self._call(
            "GET",
            "/api/v1/namespaces/{name}",
            {"name": name},
            preload=_preload_content,
            timeout=_request_timeout,
        )

    def list_namespace(
        self,
        *,
        label_selector: str | None = None,
        _preload_content: bool = True,
        _request_timeout: Timeout = None,
    ) -> Reply:
        return self._call(
            "GET",
            "/api/v1/namespaces",
            query=_list_query(None, None, label_selector, None, None, None),
            preload=_preload_content,
            timeout=_request_timeout,
        )

    def delete_namespace(
        self,
        name: str,
        *,
        grace_period_seconds: int | None = None,
        _preload_content: bool = True,
        _request_timeout: Timeout = None,
    ) -> Reply:
        return self._call(
            "DELETE",
            "/api/v1/namespaces/{name}",
            {"name": name},
            query=[("gracePeriodSeconds", grace_period_seconds)],
            preload=_preload_content,
            timeout=_request_timeout,
        )

    # ---- the one way a request is sent

    def _patch(
        self,
        path: str,
        params: Mapping[str, str],
        body: Mapping[str, Any] | Sequence[Mapping[str, Any]],
        preload: bool,
        timeout: Timeout,
    ) -> Reply:
        # A list is a JSON patch (operations); an object a strategic merge patch, as CoreV1Api's
        # REST layer relabels it (conditions merge by their type, annotations by key).
        kind = JSON_PATCH if isinstance(body, list | tuple) else STRATEGIC_MERGE_PATCH
        return self._call(
            "PATCH", path, params, body=body, content_type=kind, preload=preload, timeout=timeout
        )

    def _call(
        self,
        method: str,
        path: str,
        params: Mapping[str, str] | None = None,
        *,
        query: Sequence[tuple[str, Any]] = (),
        body: Any = None,
        content_type: str | None = None,
        preload: bool,
        timeout: Timeout,
    ) -> Reply:
        from kubernetes.client.exceptions import ApiException  # see the module docstring: not at import

        headers = {"Accept": ACCEPT}
        if content_type is not None:
            headers["Content-Type"] = content_type
        # param_serialize adds what CoreV1Api's requests carry besides: the default headers
        # (User-Agent), the bearer token (refreshed where the kubeconfig says so), the host.
        request = self.api_client.param_serialize(
            method=method,
            resource_path=path,
            path_params=dict(params) if params else None,
            query_params=[(key, value) for key, value in query if value is not None],
            header_params=headers,
            body=body,
            auth_settings=list(AUTH_SETTINGS),
        )
        response = self.api_client.call_api(*request, _request_timeout=timeout)
        if not 200 <= response.status <= 299:
            response.read()  # the body goes in the exception, as CoreV1Api's has it
            raise ApiException.from_response(http_resp=response, body=None, data=None)
        if not preload:
            return response.response
        data = response.read()
        return json.loads(data) if data else None


def _list_query(
    allow_watch_bookmarks: bool | None,
    field_selector: str | None,
    label_selector: str | None,
    resource_version: str | None,
    timeout_seconds: int | None,
    watch: bool | None,
    limit: int | None = None,
) -> list[tuple[str, Any]]:
    """A list or watch's query, in the order CoreV1Api writes it."""
    return [
        ("allowWatchBookmarks", allow_watch_bookmarks),
        ("fieldSelector", field_selector),
        ("labelSelector", label_selector),
        ("limit", limit),
        ("resourceVersion", resource_version),
        ("timeoutSeconds", timeout_seconds),
        ("watch", watch),
    ]


__all__ = ["CoreApi", "Reply", "Timeout"]

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

Each call is one row of a table (``CoreApi``'s attributes: method, path, positional and keyword
arguments) sent by one function, ``CoreApi._send``: the calls differ only in those, so writing each
out by hand gave twenty-five copies of one body to keep alike. A row's function has the signature
``CoreV1Api``'s method has for those arguments (``inspect.signature`` shows it, and a wrong or missing
argument raises ``TypeError`` as a hand-written method would); mypy sees ``Callable[..., Reply]``.

``tests/unit/test_kubeapi.py`` holds it to all of that against ``CoreV1Api`` on a local HTTP
server, and checks that the components' entry modules never import ``CoreV1Api``. The client is
imported only when a request is made, as in ``enforcement.reflector``: the agent's modules
import without it.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Mapping
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
QUERY: Final = (
    "allow_watch_bookmarks",
    "container",
    "dry_run",
    "field_selector",
    "grace_period_seconds",
    "label_selector",
    "limit",
    "resource_version",
    "tail_lines",
    "timeout_seconds",
    "watch",
)
"""Every query parameter a call here takes, in the order ``CoreV1Api`` writes them (its wire name is
the camel case: ``allowWatchBookmarks``)."""
LIST: Final = (
    "allow_watch_bookmarks",
    "field_selector",
    "label_selector",
    "resource_version",
    "timeout_seconds",
    "watch",
)
"""A list or watch's keywords: a list method is a ``reflector.ListFn``."""

_ARGUMENT = inspect.Parameter.POSITIONAL_OR_KEYWORD
_KEYWORD = inspect.Parameter.KEYWORD_ONLY


def _request(
    method: str, path: str, *positional: str, keywords: tuple[str, ...] = ()
) -> Callable[..., Reply]:
    """One call of ``CoreApi``: ``positional`` are the path's parameters and a required ``body``, in
    ``CoreV1Api``'s order; ``keywords`` its query parameters (and an optional ``body``), all optional."""
    signature = inspect.Signature(
        [
            inspect.Parameter("self", _ARGUMENT),
            *(inspect.Parameter(name, _ARGUMENT) for name in positional),
            *(inspect.Parameter(name, _KEYWORD, default=None) for name in keywords),
            inspect.Parameter("_preload_content", _KEYWORD, default=True, annotation=bool),
            inspect.Parameter("_request_timeout", _KEYWORD, default=None, annotation=Timeout),
        ],
        return_annotation=Reply,
    )

    def call(*args: Any, **kwargs: Any) -> Reply:
        bound = signature.bind(*args, **kwargs)  # TypeError on a wrong argument, as a def would
        bound.apply_defaults()
        given = dict(bound.arguments)
        core: CoreApi = given.pop("self")
        return core._send(method, path, given)

    call.__signature__ = signature  # type: ignore[attr-defined]
    return call


class CoreApi:
    """core/v1 on ``api_client`` (a ``kubernetes.client.ApiClient``), only the calls the agent, the
    simulated kubelet, the reference scheduler and the suite make; see the module docstring."""

    def __init__(self, api_client: Any) -> None:
        self.api_client = api_client

    # ---- Pods
    read_namespaced_pod = _request("GET", "/api/v1/namespaces/{namespace}/pods/{name}", "name", "namespace")
    list_pod_for_all_namespaces = _request("GET", "/api/v1/pods", keywords=LIST)
    list_namespaced_pod = _request(
        "GET", "/api/v1/namespaces/{namespace}/pods", "namespace", keywords=(*LIST, "limit")
    )
    create_namespaced_pod = _request(
        "POST", "/api/v1/namespaces/{namespace}/pods", "namespace", "body", keywords=("dry_run",)
    )
    # The log is text, not JSON: the suite asks for it raw (``_preload_content=False``).
    read_namespaced_pod_log = _request(
        "GET",
        "/api/v1/namespaces/{namespace}/pods/{name}/log",
        "name",
        "namespace",
        keywords=("container", "tail_lines"),
    )
    delete_collection_namespaced_pod = _request(
        "DELETE", "/api/v1/namespaces/{namespace}/pods", "namespace", keywords=("grace_period_seconds",)
    )
    patch_namespaced_pod = _request(
        "PATCH", "/api/v1/namespaces/{namespace}/pods/{name}", "name", "namespace", "body"
    )
    patch_namespaced_pod_status = _request(
        "PATCH", "/api/v1/namespaces/{namespace}/pods/{name}/status", "name", "namespace", "body"
    )
    delete_namespaced_pod = _request(
        "DELETE",
        "/api/v1/namespaces/{namespace}/pods/{name}",
        "name",
        "namespace",
        keywords=("grace_period_seconds", "body"),
    )
    create_namespaced_pod_binding = _request(
        "POST", "/api/v1/namespaces/{namespace}/pods/{name}/binding", "name", "namespace", "body"
    )
    create_namespaced_pod_eviction = _request(
        "POST", "/api/v1/namespaces/{namespace}/pods/{name}/eviction", "name", "namespace", "body"
    )

    # ---- Nodes
    read_node = _request("GET", "/api/v1/nodes/{name}", "name")
    list_node = _request("GET", "/api/v1/nodes", keywords=LIST)
    create_node = _request("POST", "/api/v1/nodes", "body")
    patch_node = _request("PATCH", "/api/v1/nodes/{name}", "name", "body")
    delete_node = _request("DELETE", "/api/v1/nodes/{name}", "name")
    patch_node_status = _request("PATCH", "/api/v1/nodes/{name}/status", "name", "body")

    # ---- Events and Namespaces
    create_namespaced_event = _request("POST", "/api/v1/namespaces/{namespace}/events", "namespace", "body")
    patch_namespaced_event = _request(
        "PATCH", "/api/v1/namespaces/{namespace}/events/{name}", "name", "namespace", "body"
    )
    list_namespaced_event = _request(
        "GET",
        "/api/v1/namespaces/{namespace}/events",
        "namespace",
        keywords=("field_selector", "label_selector"),
    )
    create_namespace = _request("POST", "/api/v1/namespaces", "body")
    read_namespace = _request("GET", "/api/v1/namespaces/{name}", "name")
    list_namespace = _request("GET", "/api/v1/namespaces", keywords=("label_selector",))
    delete_namespace = _request(
        "DELETE", "/api/v1/namespaces/{name}", "name", keywords=("grace_period_seconds",)
    )

    # ---- the one way a request is sent

    def _send(self, method: str, path: str, given: Mapping[str, Any]) -> Reply:
        from kubernetes.client.exceptions import ApiException  # see the module docstring: not at import

        body = given.get("body")
        headers = {"Accept": ACCEPT}
        if method == "PATCH":
            # A list is a JSON patch (operations); an object a strategic merge patch, as CoreV1Api's
            # REST layer relabels it (conditions merge by their type, annotations by key). Creates
            # and deletes carry no Content-Type, as CoreV1Api's do.
            headers["Content-Type"] = JSON_PATCH if isinstance(body, list | tuple) else STRATEGIC_MERGE_PATCH
        params = {name: given[name] for name in ("namespace", "name") if "{" + name + "}" in path}
        query = [(_camel(name), given[name]) for name in QUERY if given.get(name) is not None]
        # param_serialize adds what CoreV1Api's requests carry besides: the default headers
        # (User-Agent), the bearer token (refreshed where the kubeconfig says so), the host.
        request = self.api_client.param_serialize(
            method=method,
            resource_path=path,
            path_params=params or None,
            query_params=query,
            header_params=headers,
            body=body,
            auth_settings=list(AUTH_SETTINGS),
        )
        response = self.api_client.call_api(*request, _request_timeout=given["_request_timeout"])
        if not 200 <= response.status <= 299:
            response.read()  # the body goes in the exception, as CoreV1Api's has it
            raise ApiException.from_response(http_resp=response, body=None, data=None)
        if not given["_preload_content"]:
            return response.response
        data = response.read()
        return json.loads(data) if data else None


def _camel(name: str) -> str:
    first, *rest = name.split("_")
    return first + "".join(word.title() for word in rest)


__all__ = ["CoreApi", "Reply", "Timeout"]

"""Apply ClusterRoles and ClusterRoleBindings idempotently.

The node agent, the simulated kubelet and the reference scheduler each describe the exact
rights they need as plain manifests (so the same data serves a real cluster's YAML and the
sandbox); this is the one place that writes such manifests to an API server. Existing
objects are replaced, not merged, so a narrowed rule really narrows.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def apply(rbac_api: Any, objects: Iterable[Mapping[str, Any]]) -> list[str]:
    """Create each ClusterRole/ClusterRoleBinding, or replace it when it exists; returns their names.

    ``rbac_api`` is a ``kubernetes.client.RbacAuthorizationV1Api`` with rights to manage RBAC.
    """
    from kubernetes.client.rest import ApiException

    names: list[str] = []
    for body in objects:
        if body["kind"] == "ClusterRole":
            create, replace = rbac_api.create_cluster_role, rbac_api.replace_cluster_role
        elif body["kind"] == "ClusterRoleBinding":
            create, replace = rbac_api.create_cluster_role_binding, rbac_api.replace_cluster_role_binding
        else:
            kind, name = body["kind"], body["metadata"]["name"]
            raise ValueError(f"{kind} {name}: only ClusterRoles and ClusterRoleBindings are applied here")
        try:
            create(body, _preload_content=False)
        except ApiException as exc:
            if exc.status != 409:
                raise
            replace(body["metadata"]["name"], body, _preload_content=False)
        names.append(body["metadata"]["name"])
    return names

"""The agent's Kubernetes rights, as data: one ClusterRole with exactly the calls it makes.

| rule | call | where |
|---|---|---|
| pods get | read a Pod a Synchronize names that the agent has no record of | ``handler`` |
| pods list, watch | the node's Pods (``fieldSelector=spec.nodeName=<node>``) | ``watching`` |
| pods/eviction create | evict a borrower under GPU memory pressure | ``evictor`` |
| events create, patch | Events on Pods (patch: the count of a repeated Event) | ``kube`` |
| nodes get | compare the Node's GPU UUIDs with the backend's at start | ``agent`` |
| nodes/status patch | the condition ``gpu-fractioning.nvidia.com/Ready`` | ``agent`` (health loop) |

Nothing else: no node list or watch (the agent reads only its own Node), no Pod writes (eviction
goes through the Eviction API so PodDisruptionBudgets are honoured). ``enforcement/deploy`` holds
the same rules as YAML for a real cluster; a unit test keeps the two equal.

``ensure_rbac(rbac_api, user)`` creates (or corrects) the ClusterRole and binds it to one user,
for the sandbox (each node's agent has its own client certificate) and for tests.
"""

from __future__ import annotations

from typing import Any, Final

from enforcement import clusterrbac

RBAC_GROUP: Final = "rbac.authorization.k8s.io"
ROLE_NAME: Final = "gpuconf-node-agent"
LABELS: Final = {"app.kubernetes.io/name": "gpuconf-node-agent", "app.kubernetes.io/part-of": "gpuconf"}

RULES: Final[tuple[dict[str, Any], ...]] = (
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["pods/eviction"], "verbs": ["create"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create", "patch"]},
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},
    {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
)


def cluster_role() -> dict[str, Any]:
    return {
        "apiVersion": f"{RBAC_GROUP}/v1",
        "kind": "ClusterRole",
        "metadata": {"name": ROLE_NAME, "labels": dict(LABELS)},
        "rules": [dict(rule) for rule in RULES],
    }


def binding_name(kind: str, name: str) -> str:
    return f"{ROLE_NAME}:{kind.lower()}:{name.replace(':', '.').replace('/', '.')}"[:253]


def cluster_role_binding(subject: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": f"{RBAC_GROUP}/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": binding_name(subject["kind"], subject["name"]), "labels": dict(LABELS)},
        "roleRef": {"apiGroup": RBAC_GROUP, "kind": "ClusterRole", "name": ROLE_NAME},
        "subjects": [subject],
    }


def user_subject(user: str) -> dict[str, Any]:
    return {"apiGroup": RBAC_GROUP, "kind": "User", "name": user}


def ensure_rbac(rbac_api: Any, user: str) -> list[str]:
    """Create or correct the ClusterRole and a binding of it to ``user``; returns the objects' names.

    ``rbac_api`` is a ``kubernetes.client.RbacAuthorizationV1Api`` with rights to manage RBAC.
    Idempotent: existing objects are replaced with exactly these rules and subjects.
    """
    return clusterrbac.apply(rbac_api, (cluster_role(), cluster_role_binding(user_subject(user))))

"""conformance/deploy/: the suite's image, Job, RBAC and Sonobuoy plugin, checked against the code.

The ClusterRole must allow every API call the suite's code makes and nothing it does not: the test
finds each call (``<api>.<method>(...)`` on the Kubernetes client) in the suite's modules, maps it
to the resource and verb it needs, and compares both ways. The manifests are also applied with a
server-side dry run against a real API server in ``tests/integration/test_vendor_scheduler.py``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "conformance" / "deploy"

SUITE_CODE = sorted(
    [
        *(ROOT / "fixtures" / "suite").glob("*.py"),
        *(ROOT / "conformance").glob("test_*.py"),
        ROOT / "conformance" / "expect.py",
        ROOT / "conformance" / "dryrun.py",
    ]
)
"""The code a suite run executes (the sandbox, the reference scheduler and kubelet, and ``gpuconf
lint`` are other programs, with RBAC of their own)."""

METHODS: dict[str, tuple[str, str, str]] = {
    # method: (api group, resource, verb)
    "create_namespace": ("", "namespaces", "create"),
    "read_namespace": ("", "namespaces", "get"),
    "list_namespace": ("", "namespaces", "list"),
    "delete_namespace": ("", "namespaces", "delete"),
    "create_namespaced_pod": ("", "pods", "create"),
    "read_namespaced_pod": ("", "pods", "get"),
    "list_namespaced_pod": ("", "pods", "list"),
    "list_pod_for_all_namespaces": ("", "pods", "list"),
    "delete_namespaced_pod": ("", "pods", "delete"),
    "delete_collection_namespaced_pod": ("", "pods", "deletecollection"),
    "read_namespaced_pod_log": ("", "pods/log", "get"),
    "list_namespaced_event": ("", "events", "list"),
    "list_node": ("", "nodes", "list"),
    "read_node": ("", "nodes", "get"),
    "create_node": ("", "nodes", "create"),
    "patch_node": ("", "nodes", "patch"),
    "delete_node": ("", "nodes", "delete"),
    "patch_node_status": ("", "nodes/status", "patch"),
    "create_namespaced_lease": ("coordination.k8s.io", "leases", "create"),
    "read_namespaced_lease": ("coordination.k8s.io", "leases", "get"),
    "list_namespaced_lease": ("coordination.k8s.io", "leases", "list"),
    "replace_namespaced_lease": ("coordination.k8s.io", "leases", "update"),
    "delete_namespaced_lease": ("coordination.k8s.io", "leases", "delete"),
    "list_custom_resource_definition": ("apiextensions.k8s.io", "customresourcedefinitions", "list"),
    "list_daemon_set_for_all_namespaces": ("apps", "daemonsets", "list"),
}
API_OBJECTS = {"core", "coordination", "policy"}
"""The attributes of ``fixtures.suite.cluster.Cluster`` that hold Kubernetes API clients."""
API_CLASSES = {"ApiextensionsV1Api", "AppsV1Api"}
"""Clients the suite makes on the spot (``client.AppsV1Api(cluster.api).list_…``)."""
SIMULATED_ONLY = {("", "nodes", "create"), ("", "nodes", "patch"), ("", "nodes", "delete")}
SIMULATED_ONLY |= {("", "nodes/status", "patch")}


def load(name: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


def calls_in_code() -> dict[tuple[str, str, str], list[str]]:
    """Every (group, resource, verb) the suite's code needs, with where."""
    found: dict[tuple[str, str, str], list[str]] = {}
    unknown: list[str] = []
    for path in SUITE_CODE:
        tree = ast.parse(path.read_text())
        # Local names bound to an API client (``api = self.cluster.coordination``) count as it.
        aliases = set(API_OBJECTS) | {
            target.id
            for node in ast.walk(tree)
            if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Attribute)
            and node.value.attr in API_OBJECTS
            for target in node.targets
            if isinstance(target, ast.Name)
        }
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            owner = node.func.value
            owner_name = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
            if isinstance(owner, ast.Call) and isinstance(owner.func, ast.Attribute):
                owner_name = owner.func.attr if owner.func.attr in API_CLASSES else ""
                if owner_name:
                    aliases = aliases | {owner_name}
            if owner_name not in aliases:
                continue
            where = f"{path.relative_to(ROOT)}:{node.lineno}"
            method = node.func.attr
            if method not in METHODS:
                unknown.append(f"{where} {owner_name}.{method}")
                continue
            found.setdefault(METHODS[method], []).append(where)
            if any(k.arg == "watch" for k in node.keywords):
                found.setdefault(("", METHODS[method][1], "watch"), []).append(where)
    assert not unknown, f"API calls this test does not know how to map to RBAC: {unknown}"
    return found


def rules_of(role: dict[str, Any]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_the_clusterroles_allow_exactly_the_calls_the_suite_makes() -> None:
    roles = {r["metadata"]["name"]: r for r in load("clusterrole.yaml")}
    base, simulated = rules_of(roles["gpuconf-suite"]), rules_of(roles["gpuconf-suite-simulated-nodes"])
    needed = calls_in_code()
    missing = {need: where for need, where in needed.items() if need not in base | simulated}
    assert not missing, f"calls with no rule in conformance/deploy/clusterrole.yaml: {missing}"
    unused = (base | simulated) - set(needed)
    assert not unused, f"rules no call of the suite needs: {sorted(unused)}"
    assert simulated == SIMULATED_ONLY, "only the simulated-node writes belong in the optional role"
    assert not base & SIMULATED_ONLY, "the base role must not create Nodes (real clusters never need it)"
    assert any("test_readiness.py" in w for w in needed[("", "nodes", "create")])


def test_the_job_runs_as_the_bound_service_account_in_cluster() -> None:
    (job,) = load("job.yaml")
    (account,) = load("serviceaccount.yaml")
    (binding,) = load("clusterrolebinding.yaml")
    (namespace,) = load("namespace.yaml")
    spec = job["spec"]["template"]["spec"]
    assert job["metadata"]["namespace"] == account["metadata"]["namespace"] == namespace["metadata"]["name"]
    assert spec["serviceAccountName"] == account["metadata"]["name"]
    assert binding["roleRef"]["name"] == "gpuconf-suite"
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": account["metadata"]["name"],
            "namespace": namespace["metadata"]["name"],
        }
    ]
    (container,) = spec["containers"]
    assert not any(a.startswith("--kubeconfig") for a in container["args"]), (
        "in a Pod: in-cluster configuration"
    )
    assert any(a.startswith("--scheduler-name=") for a in container["args"])
    assert job["spec"]["backoffLimit"] == 0, "a failed run is a verdict, not something to retry"
    assert spec["restartPolicy"] == "Never"


def test_no_manifest_names_a_registry() -> None:
    for path in DEPLOY.iterdir():
        text = path.read_text()
        for image in re.findall(r"image:\s*(\S+)", text):
            assert "/" not in image.split(":")[0], f"{path.name}: image {image} names a registry"
    dockerfile = (DEPLOY / "Dockerfile").read_text()
    assert 'ENTRYPOINT ["gpuconf", "run"]' in dockerfile
    assert "$REGISTRY" in dockerfile


def test_the_sonobuoy_plugin_definition() -> None:
    (plugin,) = load("sonobuoy-plugin.yaml")
    meta = plugin["sonobuoy-config"]
    assert meta["driver"] == "Job"
    assert meta["result-format"] == "junit"
    assert meta["plugin-name"] == "gpuconf"
    spec = plugin["spec"]
    env = {e["name"]: e["value"] for e in spec["env"]}
    mounts = {m["name"]: m["mountPath"] for m in spec["volumeMounts"]}
    assert mounts["results"] == env["SONOBUOY_RESULTS_DIR"]
    assert spec["command"] == ["gpuconf", "run"]
    assert not any(a.startswith("--kubeconfig") for a in spec["args"])


def test_kustomization_lists_every_manifest_but_the_plugin() -> None:
    (kustomization,) = load("kustomization.yaml")
    manifests = {p.name for p in DEPLOY.glob("*.yaml")} - {"kustomization.yaml", "sonobuoy-plugin.yaml"}
    assert set(kustomization["resources"]) == manifests

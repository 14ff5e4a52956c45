"""The sandbox behaves like a real cluster: its API server, RBAC and controllers are the real ones."""

from __future__ import annotations

import json
import threading
import time
import uuid

import pytest
from kubernetes import client, watch
from kubernetes.client.rest import ApiException

from enforcement.contract import NODE_GPU_UUIDS
from fixtures.sandbox.controlplane import Sandbox
from fixtures.sandbox.nodes import CONDITION_FRACTIONING_READY
from fixtures.sandbox.topology import gpu_uuid
from fixtures.suite import manifests
from fixtures.suite.waiting import wait_until

pytestmark = pytest.mark.sandbox


def pod(name: str, node: str | None = None) -> dict:
    main = manifests.container("main", image="gpuconf/workload:test", command=("true",))
    return manifests.pod(name, [main], node_name=node, restart_policy="Always")


def gone(read) -> bool:
    try:
        read()
    except ApiException as exc:
        return exc.status == 404
    return False


def test_api_server_is_the_real_upstream_one(sandbox: Sandbox) -> None:
    info = client.VersionApi(sandbox.api_client()).get_code()
    assert info.git_version == "v1.36.3"
    assert (info.major, info.minor) == ("1", "36")


def test_nodes_are_labelled_like_gpu_feature_discovery(sandbox: Sandbox) -> None:
    nodes = {n.metadata.name: n for n in sandbox.core_v1().list_node().items}
    assert set(nodes) == {"gpu-a-0", "gpu-a-1"}
    for name, node in nodes.items():
        labels = node.metadata.labels
        assert labels["nvidia.com/gpu.count"] == "4"
        assert labels["nvidia.com/gpu.memory"] == "143771"
        assert labels["nvidia.com/gpu.product"] == "NVIDIA-H200"
        assert labels["nvidia.com/gpu.present"] == "true"
        assert labels["gpuconf.io/simulated"] == "true"
        assert node.status.capacity["nvidia.com/gpu"] == "4"
        assert node.status.allocatable["nvidia.com/gpu"] == "4"
        conditions = {c.type: c.status for c in node.status.conditions}
        assert conditions["Ready"] == "True"
        assert conditions[CONDITION_FRACTIONING_READY] == "True"
        assert not node.spec.taints, "a scheduler would see the node as not ready"
        uuids = node.metadata.annotations[NODE_GPU_UUIDS].split(",")
        assert uuids == [gpu_uuid(name, i) for i in range(4)]
    assert not set(nodes["gpu-a-0"].metadata.annotations[NODE_GPU_UUIDS].split(",")) & set(
        nodes["gpu-a-1"].metadata.annotations[NODE_GPU_UUIDS].split(",")
    )


def test_pod_can_be_created_in_a_new_namespace_at_once(sandbox: Sandbox) -> None:
    core = sandbox.core_v1()
    name = f"t-{uuid.uuid4().hex[:10]}"
    core.create_namespace({"metadata": {"name": name}})
    try:
        created = core.create_namespaced_pod(name, pod("first"))  # no wait for the ServiceAccount
        assert created.metadata.namespace == name
        wait_until(lambda: _has_default_sa(core, name), "the default ServiceAccount")
    finally:
        core.delete_namespace(name)
    wait_until(lambda: gone(lambda: core.read_namespace(name)), f"namespace {name} to finish terminating")


def _has_default_sa(core, namespace: str) -> bool:
    try:
        core.read_namespaced_service_account("default", namespace)
        return True
    except ApiException:
        return False


def test_pods_can_be_watched_created_and_deleted(sandbox: Sandbox, namespace: str) -> None:
    core = sandbox.core_v1()
    seen: list[tuple[str, str]] = []
    ready = threading.Event()

    def follow() -> None:
        w = watch.Watch()
        ready.set()
        for event in w.stream(core.list_namespaced_pod, namespace, timeout_seconds=30):
            seen.append((event["type"], event["object"].metadata.name))
            if event["type"] == "DELETED":
                w.stop()

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    ready.wait(5)
    time.sleep(0.5)  # the watch request must be open before the create
    core.create_namespaced_pod(namespace, pod("watched"))
    core.delete_namespaced_pod("watched", namespace)
    thread.join(30)
    assert ("ADDED", "watched") in seen
    assert ("DELETED", "watched") in seen
    assert gone(lambda: core.read_namespaced_pod("watched", namespace))


def test_pod_is_bound_through_the_binding_subresource(sandbox: Sandbox, namespace: str) -> None:
    core = sandbox.core_v1()
    core.create_namespaced_pod(namespace, pod("to-bind"))
    body = client.V1Binding(
        metadata=client.V1ObjectMeta(name="to-bind"),
        target=client.V1ObjectReference(api_version="v1", kind="Node", name="gpu-a-1"),
    )
    # The generated client cannot deserialise the Binding reply (it has no `target`); read it raw.
    resp = core.create_namespaced_binding(namespace, body, _preload_content=False)
    assert resp.status == 201
    assert core.read_namespaced_pod("to-bind", namespace).spec.node_name == "gpu-a-1"
    with pytest.raises(ApiException) as err:  # a bound Pod cannot be bound again
        core.create_namespaced_binding(namespace, body, _preload_content=False)
    assert err.value.status == 409


def test_pod_is_evicted_through_the_eviction_subresource(sandbox: Sandbox, namespace: str) -> None:
    core = sandbox.core_v1()
    core.create_namespaced_pod(namespace, pod("unbound"))
    core.create_namespaced_pod(namespace, pod("bound", node="gpu-a-0"))
    for name in ("unbound", "bound"):
        eviction = client.V1Eviction(metadata=client.V1ObjectMeta(name=name, namespace=namespace))
        core.create_namespaced_pod_eviction(name, namespace, eviction)
    # Never scheduled: deleted at once. Bound: terminating until its (simulated) kubelet confirms.
    assert gone(lambda: core.read_namespaced_pod("unbound", namespace))
    bound = core.read_namespaced_pod("bound", namespace)
    assert bound.metadata.deletion_timestamp is not None
    core.delete_namespaced_pod("bound", namespace, grace_period_seconds=0)


def test_rbac_denies_a_client_without_rights(sandbox: Sandbox, namespace: str) -> None:
    user = f"nobody-{uuid.uuid4().hex[:6]}"
    kubeconfig = sandbox.issue_kubeconfig(user, user)
    nobody = sandbox.core_v1(kubeconfig)
    with pytest.raises(ApiException) as err:
        nobody.list_namespaced_pod(namespace)
    assert err.value.status == 403
    assert f'User "{user}" cannot list resource "pods"' in json.loads(err.value.body)["message"]
    # The same user with a Role in this namespace: RBAC is evaluated, not everything refused.
    rbac = client.RbacAuthorizationV1Api(sandbox.api_client())
    rbac.create_namespaced_role(
        namespace,
        {
            "metadata": {"name": "pod-reader"},
            "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["list"]}],
        },
    )
    rbac.create_namespaced_role_binding(
        namespace,
        {
            "metadata": {"name": "pod-reader"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "pod-reader"},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}],
        },
    )
    wait_until(lambda: _can_list(nobody, namespace), "the RoleBinding to take effect", timeout=10)
    with pytest.raises(ApiException) as err:
        nobody.list_namespaced_pod("default")
    assert err.value.status == 403


def _can_list(core, namespace: str) -> bool:
    try:
        core.list_namespaced_pod(namespace)
        return True
    except ApiException:
        return False


def test_owner_references_are_garbage_collected(sandbox: Sandbox, namespace: str) -> None:
    core = sandbox.core_v1()
    owner = core.create_namespaced_config_map(namespace, {"metadata": {"name": "owner"}})
    ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner.metadata.uid}
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "child", "ownerReferences": [ref]}})
    core.delete_namespaced_config_map("owner", namespace)
    wait_until(
        lambda: gone(lambda: core.read_namespaced_config_map("child", namespace)),
        "the garbage collector to delete the dependent",
    )

"""``fixtures.suite.admission``: a dry run tells whether the cluster admits suite-placed Pods.

It creates nothing.

The refusal is played by a ValidatingAdmissionPolicy that, like KAI's admission, lets nobody but
the binder write ``gpus.devices``; its binding is confined to the test's namespace (by label) so
that nothing else on the shared sandbox is touched.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from kubernetes import client

from fixtures.sandbox.controlplane import Sandbox
from fixtures.suite.admission import PROBE_NAME, SKIP_REASON, placement_refused
from fixtures.suite.cluster import Cluster
from fixtures.suite.waiting import wait_until

pytestmark = pytest.mark.sandbox


@pytest.fixture
def refusing_namespace(sandbox: Sandbox, namespace: str) -> Iterator[str]:
    api = client.AdmissionregistrationV1Api(sandbox.api_client())
    name = f"gpuconf-test-binder-only-{uuid.uuid4().hex[:6]}"
    label = {"gpuconf.io/test-refuses-devices": name}
    sandbox.core_v1().patch_namespace(namespace, {"metadata": {"labels": label}})
    api.create_validating_admission_policy(
        {
            "metadata": {"name": name},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {
                    "resourceRules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE"],
                            "resources": ["pods"],
                        }
                    ]
                },
                "validations": [
                    {
                        "expression": "!has(object.metadata.annotations) || "
                        "!object.metadata.annotations.exists(k, k.endsWith('.gpus.devices'))",
                        "message": "only the binder may write gpus.devices",
                    }
                ],
            },
        }
    )
    api.create_validating_admission_policy_binding(
        {
            "metadata": {"name": name},
            "spec": {
                "policyName": name,
                "validationActions": ["Deny"],
                "matchResources": {"namespaceSelector": {"matchLabels": label}},
            },
        }
    )
    try:
        yield namespace
    finally:
        api.delete_validating_admission_policy_binding(name)
        api.delete_validating_admission_policy(name)


def test_a_cluster_that_admits_placed_pods_is_not_refused(sandbox: Sandbox, namespace: str) -> None:
    cluster = Cluster(sandbox.kubeconfig)
    node = cluster.gpu_nodes()[0]
    assert placement_refused(cluster, namespace, node, "gpuconf/workload:test") is None
    assert cluster.read_pod(namespace, PROBE_NAME) is None, "a dry run must create nothing"


def test_an_admission_that_refuses_suite_written_devices_is_reported(
    sandbox: Sandbox, refusing_namespace: str
) -> None:
    cluster = Cluster(sandbox.kubeconfig)
    node = cluster.gpu_nodes()[0]
    # The policy is enforced once the API server has loaded it (a second or so).
    reason = wait_until(
        lambda: placement_refused(cluster, refusing_namespace, node, "gpuconf/workload:test"),
        "the admission policy to refuse the dry run",
        30.0,
    )
    assert reason.startswith(SKIP_REASON)
    assert "only the binder may write gpus.devices" in reason
    assert cluster.read_pod(refusing_namespace, PROBE_NAME) is None

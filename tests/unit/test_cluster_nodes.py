"""GPU nodes the suite must leave alone on a shared cluster: MIG-partitioned GPUs and GPUs held whole.

The suite places its fractions only where a fraction belongs: never on a MIG-partitioned node,
and never counting a GPU that a Pod holds whole (``nvidia.com/gpu``) as free or idle. What it
leaves out is said, per node, in the preflight report and the HTML report.
"""

from __future__ import annotations

from typing import Any

import pytest

from fixtures.suite import cluster as cluster_module
from fixtures.suite.cluster import (
    Cluster,
    GpuNode,
    in_cluster,
    left_out,
    mig_partitioned,
    whole_gpu_holders,
    whole_gpus_requested,
)
from fixtures.suite.preflight import PreflightReport
from fixtures.suite.scope import busy_nodes as _busy_nodes


def node(name: str = "gpu-0", *, labels: dict[str, str] | None = None, **status: Any) -> dict[str, Any]:
    base = {
        "nvidia.com/gpu.count": "4",
        "nvidia.com/gpu.memory": "81920",
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
    }
    return {
        "metadata": {"name": name, "labels": {**base, **(labels or {})}},
        "spec": {},
        "status": {
            "conditions": [
                {"type": "Ready", "status": "True"},
                {"type": "gpu-fractioning.nvidia.com/Ready", "status": "True"},
            ],
            **status,
        },
    }


def pod(
    name: str, node_name: str | None, gpus: int = 0, phase: str = "Running", init: int = 0
) -> dict[str, Any]:
    def container(count: int) -> dict[str, Any]:
        limits = {"nvidia.com/gpu": str(count)} if count else {}
        return {"name": "c", "resources": {"limits": limits}}

    spec: dict[str, Any] = {"containers": [container(gpus)]}
    if init:
        spec["initContainers"] = [container(init)]
    if node_name:
        spec["nodeName"] = node_name
    return {"metadata": {"namespace": "team", "name": name}, "spec": spec, "status": {"phase": phase}}


# ------------------------------------------------------------------------------- MIG


def test_a_plain_gpu_node_is_not_mig_partitioned_even_when_mig_capable() -> None:
    plain = node(labels={"nvidia.com/mig.capable": "true", "nvidia.com/mig.config": "all-disabled"})
    assert mig_partitioned(plain) == ""
    gpu = GpuNode.from_dict(plain)
    assert gpu is not None and gpu.usable_for_fractions and gpu.mig == ""


@pytest.mark.parametrize(
    ("labels", "status", "says"),
    [
        ({}, {"allocatable": {"nvidia.com/mig-1g.10gb": "7"}}, "allocatable nvidia.com/mig-1g.10gb=7"),
        ({}, {"capacity": {"nvidia.com/mig-3g.40gb": "2"}}, "capacity nvidia.com/mig-3g.40gb=2"),
        ({"nvidia.com/mig-2g.20gb.count": "3"}, {}, "label nvidia.com/mig-2g.20gb.count=3"),
        ({"nvidia.com/mig.config": "all-1g.10gb"}, {}, "label nvidia.com/mig.config=all-1g.10gb"),
        (
            {"nvidia.com/mig.strategy": "single", "nvidia.com/gpu.product": "A100-SXM4-80GB-MIG-1g.10gb"},
            {},
            "nvidia.com/mig.strategy=single",
        ),
    ],
)
def test_mig_partitioned_nodes_are_recognised_and_never_usable(
    labels: dict[str, str], status: dict[str, Any], says: str
) -> None:
    raw = node(labels=labels, **status)
    assert says in mig_partitioned(raw)
    gpu = GpuNode.from_dict(raw)
    assert gpu is not None
    assert not gpu.usable_for_fractions
    assert gpu.why_unusable().startswith("MIG-partitioned (")


def test_zero_mig_devices_do_not_count() -> None:
    raw = node(labels={"nvidia.com/mig-1g.10gb.count": "0"}, allocatable={"nvidia.com/mig-1g.10gb": "0"})
    assert mig_partitioned(raw) == ""


def test_single_strategy_on_a_whole_gpu_is_not_mig() -> None:
    assert mig_partitioned(node(labels={"nvidia.com/mig.strategy": "single"})) == ""


# ------------------------------------------------------------------------------- whole GPUs


def test_whole_gpus_requested_counts_containers_and_the_largest_init_container() -> None:
    assert whole_gpus_requested(pod("a", "gpu-0", gpus=2)) == 2
    assert whole_gpus_requested(pod("b", "gpu-0", gpus=1, init=3)) == 3
    assert whole_gpus_requested(pod("c", "gpu-0")) == 0
    requests_only = pod("d", "gpu-0")
    requests_only["spec"]["containers"][0]["resources"] = {"requests": {"nvidia.com/gpu": "1"}}
    assert whole_gpus_requested(requests_only) == 1


def test_whole_gpu_holders_count_only_bound_unfinished_pods() -> None:
    pods = [
        pod("train", "gpu-0", gpus=2),
        pod("infer", "gpu-0", gpus=1),
        pod("done", "gpu-1", gpus=4, phase="Succeeded"),
        pod("pending", None, gpus=1, phase="Pending"),
        pod("fraction", "gpu-1"),
    ]
    assert whole_gpu_holders(pods) == {"gpu-0": [("team/train", 2), ("team/infer", 1)]}


class FakeCluster:
    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self._pods = pods

    def unfinished_pods(self) -> list[dict[str, Any]]:
        return self._pods


def test_busy_nodes_counts_whole_gpus_apart_from_guarantees() -> None:
    annotated = pod("frac", "gpu-2")
    annotated["metadata"]["annotations"] = {
        "nvidia.com/container.c.gpu-memory.request": "1024Mi",
        "nvidia.com/container.c.gpus.devices": "0",
    }
    guaranteed, whole = _busy_nodes(FakeCluster([pod("train", "gpu-0", gpus=3), annotated]))  # type: ignore[arg-type]
    assert guaranteed == {"gpu-2"}
    assert whole == {"gpu-0": 3}


def test_left_out_names_every_node_and_why() -> None:
    nodes = [
        GpuNode.from_dict(node("gpu-0")),
        GpuNode.from_dict(node("gpu-1", labels={"nvidia.com/mig.config": "all-1g.10gb"})),
        GpuNode.from_dict(node("gpu-2")),
    ]
    cordoned = node("gpu-3")
    cordoned["spec"]["unschedulable"] = True
    nodes.append(GpuNode.from_dict(cordoned))
    found = left_out([n for n in nodes if n is not None], {"gpu-2": [("team/train", 2)]})
    by_node = {e["node"]: e for e in found}
    assert set(by_node) == {"gpu-1", "gpu-2", "gpu-3"}
    assert by_node["gpu-1"]["excluded"] == "all" and "MIG-partitioned" in by_node["gpu-1"]["reason"]
    assert by_node["gpu-2"]["excluded"] == "idle"
    assert (
        "2 of 4 GPU(s) held whole" in by_node["gpu-2"]["reason"]
        and "team/train" in by_node["gpu-2"]["reason"]
    )
    assert by_node["gpu-3"]["reason"] == "cordoned"
    assert PreflightReport(left_out=found).as_dict()["leftOut"] == found


def test_the_html_report_says_what_was_left_out() -> None:
    from reports.html import left_out_rows
    from reports.model import RunRecord

    record = RunRecord(
        run_id="r",
        started=0.0,
        finished=1.0,
        target={},
        options={},
        results=[],
        preflight={
            "leftOut": [
                {"node": "gpu-1", "reason": "MIG-partitioned (label x)", "excluded": "all"},
                {"node": "gpu-2", "reason": "1 of 4 GPU(s) held whole", "excluded": "idle"},
            ]
        },
    )
    rows = left_out_rows(record)
    assert rows == [
        ("Node gpu-1", "left out: MIG-partitioned (label x)"),
        ("Node gpu-2", "left out of checks needing idle GPUs: 1 of 4 GPU(s) held whole"),
    ]


# ------------------------------------------------------------------------------- in-cluster


def test_in_cluster_needs_both_the_service_host_and_the_token(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = tmp_path / "token"
    monkeypatch.setattr(cluster_module, "SERVICE_ACCOUNT_TOKEN", str(token))
    monkeypatch.delenv("GPUCONF_IN_CLUSTER")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    assert not in_cluster()
    token.write_text("t")
    assert not in_cluster()
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.0.0.1")
    assert in_cluster()
    monkeypatch.setenv("GPUCONF_IN_CLUSTER", "0")
    assert not in_cluster(), "GPUCONF_IN_CLUSTER=0: a CI runner in a Pod keeps to the sandbox"
    monkeypatch.delenv("GPUCONF_IN_CLUSTER")
    token.unlink()
    assert not in_cluster()


def test_cluster_in_cluster_reads_the_mounted_service_account(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kubernetes.config import incluster_config

    token, ca = tmp_path / "token", tmp_path / "ca.crt"
    token.write_text("secret-token")
    ca.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    monkeypatch.setattr(incluster_config, "SERVICE_TOKEN_FILENAME", str(token))
    monkeypatch.setattr(incluster_config, "SERVICE_CERT_FILENAME", str(ca))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "443")
    found = Cluster(in_cluster=True)
    assert found.server == "https://10.96.0.1:443"
    assert found.api.configuration.ssl_ca_cert == str(ca)
    assert found.api.configuration.api_key["BearerToken"].lower() == "bearer secret-token"


def test_cluster_in_cluster_outside_a_pod_is_a_cluster_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)
    with pytest.raises(cluster_module.ClusterError, match="in-cluster configuration"):
        Cluster(in_cluster=True)

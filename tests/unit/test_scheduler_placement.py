"""The reference scheduler's decision, rule by rule, without a cluster.

``placement.decide`` is pure, so each case builds Nodes and bound Pods as plain dicts, asks
for one decision and states exactly which node, GPUs and annotations it must give (or which
reason it must refuse with). The annotations are read back through the contract module, so
"what the scheduler wrote" is judged the way the node agent and the suite will read it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from enforcement.contract import audit_gpus, audit_pod, read_placement
from fixtures.sandbox.scheduler.faults import FAULTS
from fixtures.sandbox.scheduler.ledger import Ledger
from fixtures.sandbox.scheduler.placement import MARKER, Decision, NodeInfo, Unschedulable, decide
from fixtures.suite import manifests

MIB = 143771  # an H200, as the sandbox's nodes say


def uuids(node: str, count: int) -> list[str]:
    return [f"GPU-{node}-{i}" for i in range(count)]


def node(
    name: str,
    gpus: int = 4,
    memory: int | None = MIB,
    *,
    ready: bool = True,
    fractioning: bool = True,
    cordoned: bool = False,
    with_uuids: bool = True,
) -> dict[str, Any]:
    labels = {"nvidia.com/gpu.count": str(gpus)}
    if memory is not None:
        labels["nvidia.com/gpu.memory"] = str(memory)
    annotations = {"gpuconf.io/gpu-uuids": ",".join(uuids(name, gpus))} if with_uuids else {}
    conditions = [
        {"type": "Ready", "status": "True" if ready else "False"},
        {"type": "gpu-fractioning.nvidia.com/Ready", "status": "True" if fractioning else "False"},
    ]
    return {
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": {"unschedulable": True} if cordoned else {},
        "status": {"conditions": conditions},
    }


def pod(
    annotations: Mapping[str, str] | None = None,
    name: str = "p",
    containers: Sequence[str] = ("main",),
) -> dict[str, Any]:
    made = manifests.pod(
        name,
        [manifests.container(c, image="x") for c in containers],
        namespace="ns",
        uid=f"uid-{name}",
        annotations=annotations,
        scheduler="s",
    )
    made["metadata"].setdefault("annotations", {})  # the binds below merge into it
    return made


def nv(container: str, suffix: str) -> str:
    return f"nvidia.com/container.{container}.{suffix}"


def held(node_name: str, gpu: int, mib: int, mode: str = "time-slicing", name: str = "") -> dict[str, Any]:
    """A bound Pod holding ``mib`` on one GPU (placed by anyone)."""
    name = name or f"held-{node_name}-{gpu}-{mib}-{mode}"
    placed = pod(
        {
            nv("main", "gpu-memory.request"): f"{mib}Mi",
            nv("main", "gpu-compute.mode"): mode,
            nv("main", "gpus.devices"): uuids(node_name, 8)[gpu],
        },
        name=name,
    )
    placed["spec"]["nodeName"] = node_name
    return placed


class Cluster:
    """Nodes and a ledger, and the helper that binds a decision into it (as the loop does)."""

    def __init__(self, *nodes: dict[str, Any], pods: Sequence[dict[str, Any]] = ()) -> None:
        self.node_objects = {n["metadata"]["name"]: n for n in nodes}
        self.nodes = [NodeInfo.from_node(n) for n in nodes]
        self.ledger = Ledger()
        self.bound: list[dict[str, Any]] = []
        for p in pods:
            self.ledger.observe(p, self.node_objects.get(p["spec"]["nodeName"]))
            self.bound.append(p)

    def decide(self, p: dict[str, Any], policy: str = "binpack", faults: Sequence[str] = (), **kw: Any):
        return decide(p, self.nodes, self.ledger, policy=policy, faults=frozenset(faults), **kw)  # type: ignore[arg-type]

    def place(self, p: dict[str, Any], policy: str = "binpack", faults: Sequence[str] = ()) -> dict[str, Any]:
        result = self.decide(p, policy, faults)
        assert isinstance(result, Decision), result
        return self.bind(p, result)

    def bind(self, p: dict[str, Any], decision: Decision) -> dict[str, Any]:
        out = {**p, "metadata": dict(p["metadata"]), "spec": dict(p["spec"], nodeName=decision.node)}
        merged = {**p["metadata"]["annotations"], **decision.patch, MARKER: "s"}
        out["metadata"]["annotations"] = {k: v for k, v in merged.items() if v is not None}
        self.ledger.assume(out, self.node_objects[decision.node])
        self.bound.append(out)
        return out


def two_nodes(**kw: Any) -> Cluster:
    return Cluster(node("gpu-a-0"), node("gpu-a-1"), **kw)


def gpus_of(placed: dict[str, Any]) -> tuple[str, ...]:
    fractions, _ = read_placement(placed)
    (fraction,) = fractions.values()
    return fraction.devices


# --------------------------------------------------------------------------- dialects


def test_gpu_fraction_becomes_absolute_mib_of_the_node_with_a_portion() -> None:
    cluster = two_nodes()
    result = cluster.decide(pod({"gpu-fraction": "0.5", "gpu-fraction.limit": "0.8"}))
    assert isinstance(result, Decision)
    assert result.node == "gpu-a-0"
    assert result.annotations == {
        nv("main", "gpu-memory.request"): "71885Mi",  # floor(143771 x 0.5)
        nv("main", "gpu-memory.limit"): "115016Mi",  # floor(143771 x 0.8)
        nv("main", "gpu-compute.mode"): "time-slicing",
        nv("main", "gpus.devices"): "GPU-gpu-a-0-0",
        nv("main", "gpu-compute.portion"): "0.5",
    }


def test_absolute_dialect_is_written_back_whole_with_devices_and_no_portion() -> None:
    cluster = two_nodes()
    annotations = {nv("main", "gpu-memory.request"): "20Gi", nv("main", "gpu-compute.mode"): "sm-sharing"}
    result = cluster.decide(pod(annotations))
    assert isinstance(result, Decision)
    assert result.annotations == {
        nv("main", "gpu-memory.request"): "20480Mi",
        nv("main", "gpu-memory.limit"): "20480Mi",
        nv("main", "gpu-compute.mode"): "sm-sharing",
        nv("main", "gpus.devices"): "GPU-gpu-a-0-0",
    }
    assert result.patch[nv("main", "gpu-compute.portion")] is None  # removed if anyone set it


def test_gpu_memory_dialect_with_limit() -> None:
    result = two_nodes().decide(pod({"gpu-memory": "4096", "gpu-memory.limit": "8Gi"}))
    assert isinstance(result, Decision)
    assert (result.request_mib, result.limit_mib, result.mode) == (4096, 8192, "time-slicing")
    assert result.annotations[nv("main", "gpu-memory.limit")] == "8192Mi"


def test_fraction_goes_to_the_named_container() -> None:
    p = pod({"gpu-fraction": "0.25", "gpu-fraction-container-name": "worker"}, containers=("side", "worker"))
    result = two_nodes().decide(p)
    assert isinstance(result, Decision)
    assert result.container == "worker"
    assert all(".worker." in key for key in result.annotations)


def test_portion_is_sized_by_each_node_and_reserve_is_held_back() -> None:
    cluster = Cluster(node("small", memory=16384), node("big", memory=81920))
    result = cluster.decide(pod({"gpu-fraction": "0.5"}), reserve_mib=1024)
    assert isinstance(result, Decision)
    # binpack: the fullest fit is the smaller GPU; (16384 - 1024) x 0.5
    assert (result.node, result.request_mib) == ("small", 7680)


def test_indices_are_written_when_a_node_lists_no_uuids() -> None:
    cluster = Cluster(node("plain", with_uuids=False))
    result = cluster.decide(pod({"gpu-memory": "100", "gpu-fraction-num-devices": "2"}))
    assert isinstance(result, Decision)
    assert result.devices == ("0", "1")


def test_every_written_placement_reads_back_clean() -> None:
    cluster = two_nodes()
    for i, asked in enumerate(
        [
            {"gpu-fraction": "0.5"},
            {"gpu-memory": "1000", "gpu-fraction-num-devices": "3"},
            {nv("main", "gpu-memory.request"): "8Gi", nv("main", "gpu-compute.mode"): "sm-sharing"},
        ]
    ):
        placed = cluster.place(pod(asked, name=f"p{i}"))
        assert audit_pod(placed, cluster.node_objects[placed["spec"]["nodeName"]]) == []
    assert audit_gpus(cluster.bound, cluster.node_objects.values()) == []


# --------------------------------------------------------------------------- memory fit


def test_a_gpu_keeps_its_sum_of_requests_within_memory() -> None:
    cluster = two_nodes(pods=[held("gpu-a-0", 0, 100_000)])
    result = cluster.decide(pod({"gpu-memory": "50000"}))
    assert isinstance(result, Decision)
    assert result.devices == ("GPU-gpu-a-0-1",)  # GPU 0 has 43771 MiB free: too little


def test_a_request_that_exactly_fills_the_gpu_fits() -> None:
    cluster = two_nodes(pods=[held("gpu-a-0", 0, 100_000)])
    result = cluster.decide(pod({"gpu-memory": str(MIB - 100_000)}))
    assert isinstance(result, Decision)
    assert result.devices == ("GPU-gpu-a-0-0",)


def test_binpack_fills_one_gpu_before_the_next() -> None:
    cluster = two_nodes()
    devices = [gpus_of(cluster.place(pod({"gpu-fraction": "0.3"}, name=f"p{i}"))) for i in range(4)]
    assert devices == [("GPU-gpu-a-0-0",)] * 3 + [("GPU-gpu-a-0-1",)]


def test_spread_takes_the_emptiest_gpu_alternating_nodes() -> None:
    cluster = two_nodes()
    placed = [cluster.place(pod({"gpu-fraction": "0.3"}, name=f"p{i}"), policy="spread") for i in range(4)]
    assert [(p["spec"]["nodeName"], gpus_of(p)) for p in placed] == [
        ("gpu-a-0", ("GPU-gpu-a-0-0",)),
        ("gpu-a-1", ("GPU-gpu-a-1-0",)),
        ("gpu-a-0", ("GPU-gpu-a-0-1",)),
        ("gpu-a-1", ("GPU-gpu-a-1-1",)),
    ]


def test_the_choice_does_not_depend_on_the_order_nodes_are_given() -> None:
    a, b = node("gpu-a-0"), node("gpu-a-1")
    pods = [held("gpu-a-1", 2, 5000), held("gpu-a-0", 1, 5000)]
    for policy in ("binpack", "spread"):
        answers = {
            repr(Cluster(*order, pods=pods).decide(pod({"gpu-memory": "1000"}), policy=policy))
            for order in ((a, b), (b, a))
        }
        assert len(answers) == 1, answers


def test_finished_pods_free_their_share() -> None:
    done = held("gpu-a-0", 0, MIB)
    done["status"] = {"phase": "Succeeded"}
    cluster = Cluster(node("gpu-a-0", gpus=1), pods=[done])
    assert isinstance(cluster.decide(pod({"gpu-memory": "1000"})), Decision)


# --------------------------------------------------------------------------- modes


def test_modes_are_tracked_per_gpu_so_one_node_runs_both() -> None:
    cluster = Cluster(node("gpu-a-0", gpus=2), pods=[held("gpu-a-0", 0, 1000, "sm-sharing")])
    result = cluster.decide(pod({"gpu-memory": "1000"}))  # time-slicing
    assert isinstance(result, Decision)
    assert (result.node, result.devices) == ("gpu-a-0", ("GPU-gpu-a-0-1",))
    same = cluster.decide(pod({"gpu-memory": "1000", nv("main", "gpu-compute.mode"): "sm-sharing"}))
    assert isinstance(same, Decision)
    assert same.devices == ("GPU-gpu-a-0-0",)  # binpack joins the GPU of its own mode


# --------------------------------------------------------------------------- several devices


def test_num_devices_gets_distinct_gpus_of_one_node() -> None:
    cluster = two_nodes(pods=[held("gpu-a-0", 1, MIB)])
    result = cluster.decide(pod({"gpu-fraction": "0.5", "gpu-fraction-num-devices": "4"}))
    assert isinstance(result, Decision)
    assert result.node == "gpu-a-1"  # gpu-a-0 has only three GPUs with room
    assert result.devices == tuple(uuids("gpu-a-1", 4))
    placed = cluster.bind(pod({"gpu-fraction": "0.5", "gpu-fraction-num-devices": "4"}), result)
    assert audit_pod(placed, cluster.node_objects["gpu-a-1"]) == []


def test_num_devices_binpacks_within_the_node() -> None:
    cluster = two_nodes(pods=[held("gpu-a-1", 2, 1000), held("gpu-a-1", 3, 2000)])
    result = cluster.decide(pod({"gpu-memory": "1000", "gpu-fraction-num-devices": "2"}))
    assert isinstance(result, Decision)
    assert (result.node, result.devices) == ("gpu-a-1", ("GPU-gpu-a-1-3", "GPU-gpu-a-1-2"))


# --------------------------------------------------------------------------- readiness


@pytest.mark.parametrize(
    "unready",
    [{"ready": False}, {"fractioning": False}, {"cordoned": True}],
    ids=["not-ready", "fractioning-not-ready", "cordoned"],
)
def test_only_ready_fractioning_nodes_take_fractions(unready: dict[str, bool]) -> None:
    cluster = Cluster(node("gpu-a-0", **unready), node("gpu-a-1"))
    result = cluster.decide(pod({"gpu-fraction": "0.5"}))
    assert isinstance(result, Decision)
    assert result.node == "gpu-a-1"


def test_a_pod_without_a_fraction_needs_only_a_ready_node() -> None:
    cluster = Cluster(node("gpu-a-0", ready=False), node("gpu-a-1", fractioning=False), node("gpu-a-2"))
    result = cluster.decide(pod())
    assert isinstance(result, Decision)
    assert (result.node, result.container, dict(result.patch)) == ("gpu-a-1", None, {})


def test_pods_without_a_fraction_binpack_or_spread_by_pod_count() -> None:
    cluster = two_nodes()
    first = cluster.decide(pod(name="x"))
    assert isinstance(first, Decision)
    cluster.bind(pod(name="x"), first)
    packed, spread = cluster.decide(pod(name="y")), cluster.decide(pod(name="y"), policy="spread")
    assert isinstance(packed, Decision) and isinstance(spread, Decision)
    assert (first.node, packed.node, spread.node) == ("gpu-a-0", "gpu-a-0", "gpu-a-1")


# --------------------------------------------------------------------------- untrusted devices


def test_devices_the_pod_set_itself_are_overwritten_and_reported() -> None:
    cluster = two_nodes(pods=[held("gpu-a-1", 0, MIB)])
    annotations = {
        "gpu-memory": "1000",
        nv("main", "gpus.devices"): "GPU-gpu-a-1-0",
        nv("side", "gpus.devices"): "GPU-gpu-a-1-1",
    }
    result = cluster.decide(pod(annotations, containers=("main", "side")))
    assert isinstance(result, Decision)
    # binpack prefers the fuller node, but not the full GPU the Pod named
    assert (result.node, result.devices) == ("gpu-a-1", ("GPU-gpu-a-1-1",))
    assert result.patch[nv("main", "gpus.devices")] == "GPU-gpu-a-1-1"
    assert result.patch[nv("side", "gpus.devices")] is None
    assert dict(result.overwritten) == {"main": "GPU-gpu-a-1-0", "side": "GPU-gpu-a-1-1"}


def test_a_pod_without_a_fraction_loses_devices_it_set() -> None:
    result = two_nodes().decide(pod({nv("main", "gpus.devices"): "GPU-gpu-a-0-0"}))
    assert isinstance(result, Decision)
    assert dict(result.patch) == {nv("main", "gpus.devices"): None}
    assert dict(result.overwritten) == {"main": "GPU-gpu-a-0-0"}


def test_a_half_placed_pod_is_read_as_its_author_wrote_it() -> None:
    # patched by a gpuconf scheduler that died before the bind: gpu-fraction still rules
    first = two_nodes().decide(pod({"gpu-fraction": "0.5"}))
    assert isinstance(first, Decision)
    leftover = pod({"gpu-fraction": "0.5", **first.annotations, MARKER: "s"})
    again = two_nodes().decide(leftover)
    assert isinstance(again, Decision)
    assert again.annotations == first.annotations
    assert dict(again.overwritten) == {}


# --------------------------------------------------------------------------- why not


def test_no_ready_node_names_each_node() -> None:
    cluster = Cluster(node("gpu-a-0", ready=False), node("gpu-a-1", fractioning=False))
    result = cluster.decide(pod({"gpu-fraction": "0.5"}))
    assert result == Unschedulable(
        "no-ready-node",
        "no ready node: 0/2 nodes are Ready with gpu-fractioning.nvidia.com/Ready=True "
        "(gpu-a-0: Ready is not True; gpu-a-1: gpu-fractioning.nvidia.com/Ready is not True)",
    )
    assert Cluster().decide(pod()) == Unschedulable(
        "no-ready-node", "no ready node: the cluster has no nodes"
    )


def test_insufficient_memory_names_the_largest_free() -> None:
    cluster = Cluster(node("gpu-a-0", gpus=2), pods=[held("gpu-a-0", 0, 100_000), held("gpu-a-0", 1, 90_000)])
    result = cluster.decide(pod({"gpu-memory": "60000"}))
    assert result == Unschedulable(
        "insufficient-memory",
        "no GPU with 60000 MiB free: the largest free is 53771 MiB (GPU GPU-gpu-a-0-1 of node gpu-a-0)",
    )


def test_insufficient_memory_for_a_portion_says_so() -> None:
    cluster = Cluster(node("gpu-a-0", gpus=1), pods=[held("gpu-a-0", 0, 100_000)])
    result = cluster.decide(pod({"gpu-fraction": "0.5"}))
    assert isinstance(result, Unschedulable)
    assert result.message == (
        "no GPU with 71885 MiB free (gpu-fraction 0.5 of a GPU there): the largest free is 43771 MiB "
        "(GPU GPU-gpu-a-0-0 of node gpu-a-0)"
    )


def test_mode_conflict_on_every_candidate() -> None:
    pods = [held("gpu-a-0", 0, 1000, "time-slicing"), held("gpu-a-0", 1, 1000, "time-slicing")]
    cluster = Cluster(node("gpu-a-0", gpus=2), pods=pods)
    result = cluster.decide(pod({"gpu-memory": "1000", nv("main", "gpu-compute.mode"): "sm-sharing"}))
    assert result == Unschedulable(
        "mode-conflict",
        "mode conflict on every candidate: each of the 2 GPU(s) with enough free memory already runs "
        "time-slicing workloads, and this Pod asks for sm-sharing",
    )


def test_too_few_gpus_names_the_best_node() -> None:
    cluster = two_nodes(pods=[held("gpu-a-0", 0, MIB), held("gpu-a-1", 0, MIB), held("gpu-a-1", 1, MIB)])
    result = cluster.decide(pod({"gpu-memory": "1000", "gpu-fraction-num-devices": "4"}))
    assert result == Unschedulable(
        "too-few-gpus",
        "too few GPUs: need 4 GPUs with 1000 MiB free (time-slicing) on one node, best node gpu-a-0 has 3",
    )
    bigger = two_nodes().decide(pod({"gpu-memory": "1000", "gpu-fraction-num-devices": "5"}))
    assert bigger == Unschedulable("too-few-gpus", "too few GPUs: need 5 on one node, the largest node has 4")


def test_an_invalid_request_is_refused_with_the_contract_violation() -> None:
    result = two_nodes().decide(pod({"gpu-fraction": "1.5"}))
    assert isinstance(result, Unschedulable)
    assert result.code == "invalid-request"
    assert result.message.startswith(
        "the Pod's GPU request is invalid: Pod ns/p container 'main': gpu-fraction:"
    )
    assert "[fraction-value, error]" in result.message


def test_no_gpu_node() -> None:
    result = Cluster(node("cpu-0", gpus=0, memory=None)).decide(pod({"gpu-memory": "10"}))
    assert isinstance(result, Unschedulable)
    assert result.code == "no-gpu-node"


# --------------------------------------------------------------------------- seeded faults


def test_fault_overcommit_piles_onto_a_full_gpu() -> None:
    cluster = Cluster(node("gpu-a-0", gpus=2), pods=[held("gpu-a-0", 0, MIB)])
    placed = cluster.place(pod({"gpu-memory": "1000"}), faults=["overcommit"])
    assert gpus_of(placed) == ("GPU-gpu-a-0-0",)
    assert [v.rule for v in audit_gpus(cluster.bound, cluster.node_objects.values())] == ["gpu-overcommit"]


def test_fault_mix_modes_joins_a_gpu_of_the_other_mode() -> None:
    cluster = Cluster(node("gpu-a-0", gpus=2), pods=[held("gpu-a-0", 0, 1000, "sm-sharing")])
    placed = cluster.place(pod({"gpu-memory": "1000"}), faults=["mix-modes"])
    assert gpus_of(placed) == ("GPU-gpu-a-0-0",)
    assert [v.rule for v in audit_gpus(cluster.bound, cluster.node_objects.values())] == ["mode-mixing"]


@pytest.mark.parametrize(
    ("fault", "absent", "rules"),
    [
        ("omit-limit", "gpu-memory.limit", ["limit-missing"]),
        ("omit-devices", "gpus.devices", ["devices-missing"]),
        ("omit-request", "gpu-memory.request", []),  # the contract lets a limit stand for the request
    ],
)
def test_fault_omits_one_annotation(fault: str, absent: str, rules: list[str]) -> None:
    cluster = two_nodes()
    annotations = {nv("main", "gpu-memory.request"): "4Gi", nv("main", "gpu-memory.limit"): "8Gi"}
    placed = cluster.place(pod(annotations), faults=[fault])
    written = placed["metadata"]["annotations"]
    assert nv("main", absent) not in written
    assert {nv("main", s) for s in ("gpu-memory.request", "gpu-memory.limit", "gpus.devices")} - {
        nv("main", absent)
    } <= set(written)
    assert [v.rule for v in audit_pod(placed, cluster.node_objects["gpu-a-0"])] == rules


@pytest.mark.parametrize(("asked", "got"), [(1, 2), (3, 2)])
def test_fault_wrong_device_count(asked: int, got: int) -> None:
    cluster = two_nodes()
    placed = cluster.place(
        pod({"gpu-memory": "1000", "gpu-fraction-num-devices": str(asked)}), faults=["wrong-device-count"]
    )
    assert len(gpus_of(placed)) == got
    assert [v.rule for v in audit_pod(placed, cluster.node_objects["gpu-a-0"])] == ["devices-count"]


def test_fault_request_gt_limit() -> None:
    cluster = two_nodes()
    placed = cluster.place(pod({"gpu-memory": "4096"}), faults=["request-gt-limit"])
    written = placed["metadata"]["annotations"]
    assert (written[nv("main", "gpu-memory.request")], written[nv("main", "gpu-memory.limit")]) == (
        "4096Mi",
        "2048Mi",
    )
    assert "request-exceeds-limit" in {v.rule for v in audit_pod(placed)}


def test_fault_wrong_container_name() -> None:
    cluster = two_nodes()
    placed = cluster.place(pod({nv("main", "gpu-memory.request"): "4Gi"}), faults=["wrong-container-name"])
    written = placed["metadata"]["annotations"]
    assert not any(k.startswith("nvidia.com/container.main.") for k in written)
    assert written[nv("main-x", "gpu-memory.request")] == "4096Mi"
    assert "unknown-container" in {v.rule for v in audit_pod(placed)}


def test_fault_trust_pod_devices_keeps_them_and_goes_where_they_are() -> None:
    cluster = two_nodes(pods=[held("gpu-a-1", 3, MIB)])
    annotations = {"gpu-memory": "1000", nv("main", "gpus.devices"): "GPU-gpu-a-1-3"}
    result = cluster.decide(pod(annotations), faults=["trust-pod-devices"])
    assert isinstance(result, Decision)
    assert (result.node, result.devices, dict(result.overwritten)) == ("gpu-a-1", ("GPU-gpu-a-1-3",), {})
    assert result.annotations[nv("main", "gpus.devices")] == "GPU-gpu-a-1-3"


def test_fault_trust_fitting_pod_devices_keeps_them_only_where_the_request_fits() -> None:
    cluster = two_nodes(pods=[held("gpu-a-1", 3, MIB), held("gpu-a-1", 2, 1000, "sm-sharing")])
    for own, kept in (("GPU-gpu-a-1-3", False), ("GPU-gpu-a-1-2", True)):  # full; room (the other mode)
        result = cluster.decide(
            pod({"gpu-memory": "1000", nv("main", "gpus.devices"): own}), faults=["trust-fitting-pod-devices"]
        )
        assert isinstance(result, Decision)
        assert (result.devices == (own,)) is kept
        assert (result.annotations[nv("main", "gpus.devices")] == own) is kept
        assert dict(result.overwritten) == ({} if kept else {"main": own})


def test_fault_ignore_node_ready_prefers_a_node_that_is_not_ready() -> None:
    cluster = Cluster(node("gpu-a-0"), node("gpu-a-1", fractioning=False))
    result = cluster.decide(pod({"gpu-fraction": "0.5"}), faults=["ignore-node-ready"])
    assert isinstance(result, Decision)
    assert result.node == "gpu-a-1"
    assert cluster.decide(pod(), faults=[]) == Decision("gpu-a-0", {})
    assert Cluster(node("gpu-a-0"), node("gpu-a-1", ready=False)).decide(
        pod(), faults=["ignore-node-ready"]
    ) == Decision("gpu-a-1", {})


def test_fault_devices_not_on_node() -> None:
    cluster = two_nodes()
    placed = cluster.place(pod({"gpu-memory": "1000"}), faults=["devices-not-on-node"])
    assert placed["spec"]["nodeName"] == "gpu-a-0"
    assert gpus_of(placed) == ("GPU-gpu-a-1-0",)
    assert [v.rule for v in audit_pod(placed, cluster.node_objects["gpu-a-0"])] == ["devices-unknown"]
    alone = Cluster(node("gpu-a-0")).place(pod({"gpu-memory": "1000"}), faults=["devices-not-on-node"])
    assert gpus_of(alone)[0].startswith("GPU-00000000-")


def test_fault_portion_of_wrong_size_sizes_a_portion_for_an_80_gb_gpu() -> None:
    cluster = two_nodes()
    asked = {"gpu-fraction": "0.5", "gpu-fraction.limit": "0.75"}
    placed = cluster.place(pod(asked), faults=["portion-of-wrong-size"])
    written = placed["metadata"]["annotations"]
    # 0.5 and 0.75 of 81920 MiB, not of the node's 143771 MiB (label nvidia.com/gpu.memory)
    assert (written[nv("main", "gpu-memory.request")], written[nv("main", "gpu-memory.limit")]) == (
        "40960Mi",
        "61440Mi",
    )
    assert written[nv("main", "gpu-compute.portion")] == "0.5"
    assert audit_pod(placed, cluster.node_objects["gpu-a-0"]) == []  # well-formed, only the size is wrong
    # every other duty stands: what it writes must still fit the GPU's real memory
    small = Cluster(node("small", memory=16384)).decide(
        pod({"gpu-fraction": "0.5"}), faults=["portion-of-wrong-size"]
    )
    assert isinstance(small, Unschedulable) and small.message.startswith("no GPU with 40960 MiB free")
    # absolute requests are untouched
    absolute = two_nodes().decide(pod({"gpu-memory": "4096"}), faults=["portion-of-wrong-size"])
    assert isinstance(absolute, Decision) and absolute.request_mib == 4096


def test_fault_leak_completed_never_gives_a_finished_pods_memory_back() -> None:
    full = held("gpu-a-0", 0, MIB)
    done = {**full, "status": {"phase": "Succeeded"}}
    for leak, fits in ((False, True), (True, False)):
        cluster = Cluster(node("gpu-a-0", gpus=1))
        cluster.ledger = Ledger(release_finished=not leak)  # how the loop builds it for "leak-completed"
        cluster.ledger.observe(full, cluster.node_objects["gpu-a-0"])
        cluster.ledger.observe(done, cluster.node_objects["gpu-a-0"])
        assert isinstance(cluster.decide(pod({"gpu-memory": "1000"})), Decision) is fits
    # deleted: the same
    cluster.ledger.release(f"uid-{full['metadata']['name']}")
    assert cluster.ledger.gpus() == {("gpu-a-0", "GPU-gpu-a-0-0"): MIB}


def test_fault_inflate_request_writes_more_than_the_author_asked_for_an_absolute_request() -> None:
    asked = {nv("main", "gpu-memory.request"): "1000Mi", nv("main", "gpu-memory.limit"): "2000Mi"}
    written = two_nodes().place(pod(asked), faults=["inflate-request"])["metadata"]["annotations"]
    assert (written[nv("main", "gpu-memory.request")], written[nv("main", "gpu-memory.limit")]) == (
        "1100Mi",
        "2200Mi",
    )
    # a portion is converted as ever (portion-conversion judges that)
    portion = two_nodes().place(pod({"gpu-fraction": "0.5"}), faults=["inflate-request"])
    assert portion["metadata"]["annotations"][nv("main", "gpu-memory.request")] == f"{MIB // 2}Mi"


def test_fault_limit_to_gpu_only_when_the_author_gave_no_limit() -> None:
    bare = two_nodes().place(pod({"gpu-memory": "1000"}), faults=["limit-to-gpu"])
    assert bare["metadata"]["annotations"][nv("main", "gpu-memory.limit")] == f"{MIB}Mi"
    asked = {"gpu-memory": "1000", "gpu-memory.limit": "1500Mi"}
    limited = two_nodes().place(pod(asked), faults=["limit-to-gpu"])
    assert limited["metadata"]["annotations"][nv("main", "gpu-memory.limit")] == "1500Mi"


def test_fault_default_sm_sharing_only_when_the_author_gave_no_mode() -> None:
    bare = two_nodes().place(pod({"gpu-memory": "1000"}), faults=["default-sm-sharing"])
    assert bare["metadata"]["annotations"][nv("main", "gpu-compute.mode")] == "sm-sharing"
    asked = {"gpu-memory": "1000", nv("main", "gpu-compute.mode"): "time-slicing"}
    kept = two_nodes().place(pod(asked), faults=["default-sm-sharing"])
    assert kept["metadata"]["annotations"][nv("main", "gpu-compute.mode")] == "time-slicing"


def test_fault_overcommit_slightly_takes_up_to_two_percent_past_a_gpus_memory() -> None:
    for fault, over, fits in (([], 1, False), (["overcommit-slightly"], MIB // 100, True)):
        cluster = Cluster(node("gpu-a-0", gpus=1), pods=[held("gpu-a-0", 0, MIB - 1000)])
        result = cluster.decide(pod({"gpu-memory": str(1000 + over)}), faults=fault)
        assert isinstance(result, Decision) is fits
    far = Cluster(node("gpu-a-0", gpus=1), pods=[held("gpu-a-0", 0, MIB - 1000)])
    assert isinstance(
        far.decide(pod({"gpu-memory": str(1000 + MIB // 20)}), faults=["overcommit-slightly"]), Unschedulable
    )


def test_fault_leak_failed_keeps_a_failed_pods_memory_but_not_a_succeeded_ones() -> None:
    full = held("gpu-a-0", 0, MIB)
    for phase, leak, fits in (("Failed", True, False), ("Succeeded", True, True), ("Failed", False, True)):
        cluster = Cluster(node("gpu-a-0", gpus=1))
        cluster.ledger = Ledger(release_failed=not leak)  # how the loop builds it for "leak-failed"
        cluster.ledger.observe(full, cluster.node_objects["gpu-a-0"])
        cluster.ledger.observe({**full, "status": {"phase": phase}}, cluster.node_objects["gpu-a-0"])
        assert isinstance(cluster.decide(pod({"gpu-memory": "1000"})), Decision) is fits
    # deleted, a leaked Failed Pod is released
    cluster.ledger.release(f"uid-{full['metadata']['name']}")
    assert cluster.ledger.gpus() == {}


SM_SHARING = {nv("main", "gpu-compute.mode"): "sm-sharing"}
TIME_SLICING = {nv("main", "gpu-compute.mode"): "time-slicing"}


def test_fault_mode_check_sm_only_lets_time_slicing_join_sm_sharing_but_not_the_reverse() -> None:
    sm_held = Cluster(node("gpu-a-0", gpus=2), pods=[held("gpu-a-0", 0, 1000, "sm-sharing")])
    joined = sm_held.place(pod({"gpu-memory": "1000", **TIME_SLICING}), faults=["mode-check-sm-only"])
    assert gpus_of(joined) == ("GPU-gpu-a-0-0",)
    assert [v.rule for v in audit_gpus(sm_held.bound, sm_held.node_objects.values())] == ["mode-mixing"]
    ts_held = Cluster(node("gpu-a-0", gpus=2), pods=[held("gpu-a-0", 0, 1000, "time-slicing")])
    kept = ts_held.place(pod({"gpu-memory": "1000", **SM_SHARING}), faults=["mode-check-sm-only"])
    assert gpus_of(kept) == ("GPU-gpu-a-0-1",)


def test_fault_absent_mode_fits_any_only_for_a_pod_without_a_mode() -> None:
    for asked, gpu in (({}, "GPU-gpu-a-0-0"), (TIME_SLICING, "GPU-gpu-a-0-1")):
        cluster = Cluster(node("gpu-a-0", gpus=2), pods=[held("gpu-a-0", 0, 1000, "sm-sharing")])
        placed = cluster.place(pod({"gpu-memory": "1000", **asked}), faults=["absent-mode-fits-any"])
        assert gpus_of(placed) == (gpu,)
        assert placed["metadata"]["annotations"][nv("main", "gpu-compute.mode")] == "time-slicing"


def test_fault_mode_check_first_device_checks_only_the_first_gpu_of_several() -> None:
    two = {"gpu-memory": "1000", "gpu-fraction-num-devices": "2", **TIME_SLICING}
    sm = [held("gpu-a-0", i, 1000, "sm-sharing", name=f"sm-{i}") for i in (1, 2)]
    assert isinstance(Cluster(node("gpu-a-0", gpus=3), pods=sm).decide(pod(two)), Unschedulable)
    cluster = Cluster(node("gpu-a-0", gpus=3), pods=sm)
    placed = cluster.place(pod(two), faults=["mode-check-first-device"])
    assert gpus_of(placed)[0] == "GPU-gpu-a-0-0" and gpus_of(placed)[1] != "GPU-gpu-a-0-0"
    assert [v.rule for v in audit_gpus(cluster.bound, cluster.node_objects.values())] == ["mode-mixing"]
    one = Cluster(node("gpu-a-0", gpus=3), pods=sm)
    alone = one.place(pod({"gpu-memory": "1000", **TIME_SLICING}), faults=["mode-check-first-device"])
    assert gpus_of(alone) == ("GPU-gpu-a-0-0",)


def test_fault_charge_first_device_only_leaves_a_multi_device_pods_other_gpus_free() -> None:
    pair = pod({"gpu-memory": str(MIB - 1000), "gpu-fraction-num-devices": "2"}, name="pair")
    for leak in (False, True):
        cluster = Cluster(node("gpu-a-0", gpus=2))
        cluster.ledger = Ledger(
            first_device_only=leak
        )  # how the loop builds it for "charge-first-device-only"
        assert gpus_of(cluster.place(pair)) == ("GPU-gpu-a-0-0", "GPU-gpu-a-0-1")
        small = pod({"gpu-memory": "2000"}, name="small")
        result = cluster.decide(small)
        if not leak:
            assert isinstance(result, Unschedulable)
            continue
        assert isinstance(result, Decision)
        assert gpus_of(cluster.bind(small, result)) == ("GPU-gpu-a-0-1",)
        assert [v.rule for v in audit_gpus(cluster.bound, cluster.node_objects.values())] == [
            "gpu-overcommit"
        ]


def test_fault_ignore_foreign_pods_counts_only_its_own() -> None:
    foreign = held("gpu-a-0", 0, MIB, name="foreign")  # bound by someone else (scheduler "default-scheduler")
    foreign["spec"]["schedulerName"] = "default-scheduler"
    for only, fits in ((None, False), ("s", True)):
        cluster = Cluster(node("gpu-a-0", gpus=1))
        cluster.ledger = Ledger(only_scheduler=only)  # the loop passes its own name for "ignore-foreign-pods"
        cluster.ledger.observe(foreign, cluster.node_objects["gpu-a-0"])
        assert isinstance(cluster.decide(pod({"gpu-memory": "1000"})), Decision) is fits
    own = Cluster(node("gpu-a-0", gpus=1))
    own.ledger = Ledger(only_scheduler="s")
    own.ledger.observe(
        {**foreign, "spec": {**foreign["spec"], "schedulerName": "s"}}, own.node_objects["gpu-a-0"]
    )
    assert isinstance(own.decide(pod({"gpu-memory": "1000"})), Unschedulable)  # its own Pods still count


def test_every_fault_has_a_unit_test() -> None:
    # here for the decision; in test_scheduler_loop.py for the faults that live in the loop
    here = Path(__file__).parent
    source = "".join(
        (here / f).read_text() for f in ("test_scheduler_placement.py", "test_scheduler_loop.py")
    )
    assert [name for name in FAULTS if f'"{name}"' not in source] == []


# --------------------------------------------------------------------------- known-good, at random

_REQUESTS = st.one_of(
    st.builds(lambda f: {"gpu-fraction": f"{f:.2f}"}, st.floats(0.05, 0.95)),
    st.builds(lambda m: {"gpu-memory": str(m)}, st.integers(1, MIB)),
    st.builds(
        lambda m, mode, n: {
            nv("main", "gpu-memory.request"): f"{m}Mi",
            nv("main", "gpu-compute.mode"): mode,
            "gpu-fraction-num-devices": str(n),
        },
        st.integers(1, 80_000),
        st.sampled_from(["time-slicing", "sm-sharing"]),
        st.integers(1, 3),
    ),
)


@settings(max_examples=60, deadline=None)
@given(requests=st.lists(_REQUESTS, min_size=1, max_size=25), policy=st.sampled_from(["binpack", "spread"]))
def test_whatever_is_placed_the_cluster_stays_within_the_contract(
    requests: list[dict[str, str]], policy: str
) -> None:
    cluster = two_nodes()
    for i, asked in enumerate(requests):
        result = cluster.decide(pod(asked, name=f"p{i}"), policy=policy)
        if isinstance(result, Decision):
            placed = cluster.bind(pod(asked, name=f"p{i}"), result)
            assert audit_pod(placed, cluster.node_objects[result.node]) == []
    assert audit_gpus(cluster.bound, cluster.node_objects.values()) == []


def _with_condition(made: dict[str, Any], status: str | None) -> dict[str, Any]:
    """``made`` with its fractioning readiness condition set to ``status`` (None: removed)."""
    kept = [c for c in made["status"]["conditions"] if c["type"] != "gpu-fractioning.nvidia.com/Ready"]
    if status is not None:
        kept.append({"type": "gpu-fractioning.nvidia.com/Ready", "status": status})
    made["status"]["conditions"] = kept
    return made


@pytest.mark.parametrize("status", ["False", "Unknown", None])
def test_a_node_whose_fractioning_condition_is_not_true_takes_no_fraction(status: str | None) -> None:
    cluster = Cluster(_with_condition(node("gpu-a-0"), status))
    assert isinstance(cluster.decide(pod({"gpu-fraction": "0.5"})), Unschedulable)
    placed = cluster.decide(pod({"gpu-fraction": "0.5"}), faults=["refuse-only-not-ready-false"])
    assert isinstance(placed, Decision) is (status != "False")


def test_fault_trust_compatible_pod_devices_keeps_them_only_where_memory_and_mode_fit() -> None:
    cluster = two_nodes(pods=[held("gpu-a-1", 3, MIB), held("gpu-a-1", 2, 1000, "sm-sharing")])
    # full; room but the other mode; room and the same mode; an index (of the first node that has it)
    for own, kept in (
        ("GPU-gpu-a-1-3", False),
        ("GPU-gpu-a-1-2", False),
        ("GPU-gpu-a-1-1", True),
        ("2", True),
    ):
        asked = {"gpu-memory": "1000", nv("main", "gpus.devices"): own}
        result = cluster.decide(pod(asked), faults=["trust-compatible-pod-devices"])
        assert isinstance(result, Decision)
        assert (result.annotations[nv("main", "gpus.devices")] == own) is kept, own


def test_fault_limit_to_unguaranteed_cuts_the_limit_to_what_the_gpu_has_left() -> None:
    busy = [held("gpu-a-0", i, MIB - 20000) for i in range(4)]
    asked = {nv("main", "gpu-memory.request"): "10000Mi", nv("main", "gpu-memory.limit"): "60000Mi"}
    right = Cluster(node("gpu-a-0"), pods=busy).decide(pod(asked))
    wrong = Cluster(node("gpu-a-0"), pods=busy).decide(pod(asked), faults=["limit-to-unguaranteed"])
    assert isinstance(right, Decision) and isinstance(wrong, Decision)
    assert (right.limit_mib, wrong.limit_mib) == (60000, 20000)
    assert wrong.annotations[nv("main", "gpu-memory.limit")] == "20000Mi"
    idle = Cluster(node("gpu-a-0")).decide(pod(asked), faults=["limit-to-unguaranteed"])
    assert isinstance(idle, Decision) and idle.limit_mib == 60000  # plenty left: the fault does not show


def test_fault_mode_check_last_device_is_caught_by_a_pair_whose_compatible_gpu_is_either_end() -> None:
    # Two GPUs with room: 0 runs time-slicing, 3 sm-sharing; 1 and 2 are full.
    pods = [
        held("gpu-a-0", 0, MIB // 2, "time-slicing"),
        held("gpu-a-0", 1, MIB - 1000, "sm-sharing"),
        held("gpu-a-0", 2, MIB - 1000, "sm-sharing"),
        held("gpu-a-0", 3, MIB // 2, "sm-sharing"),
    ]
    for mode in (TIME_SLICING, SM_SHARING):
        pair = pod({"gpu-memory": "10000", "gpu-fraction-num-devices": "2", **mode})
        assert isinstance(Cluster(node("gpu-a-0"), pods=pods).decide(pair), Unschedulable)
    caught = []
    for policy in ("binpack", "spread"):
        for mode in (TIME_SLICING, SM_SHARING):
            pair = pod({"gpu-memory": "10000", "gpu-fraction-num-devices": "2", **mode})
            cluster = Cluster(node("gpu-a-0"), pods=pods)
            result = cluster.decide(pair, policy, faults=["mode-check-last-device"])
            if isinstance(result, Decision):
                cluster.bind(pair, result)
                assert [v.rule for v in audit_gpus(cluster.bound, cluster.node_objects.values())] == [
                    "mode-mixing"
                ]
                caught.append((policy, mode[nv("main", "gpu-compute.mode")]))
    assert {p for p, _ in caught} == {"binpack", "spread"}  # one of the two pairs, whatever the order
    single = Cluster(node("gpu-a-0"), pods=pods).place(
        pod({"gpu-memory": "10000", **TIME_SLICING}), faults=["mode-check-last-device"]
    )
    assert gpus_of(single) == ("GPU-gpu-a-0-0",)


def test_fault_devices_as_indices_writes_indices_of_the_same_gpus() -> None:
    cluster = Cluster(node("gpu-a-0"), pods=[held("gpu-a-0", 0, 1000)])
    asked = pod({"gpu-memory": "1000", "gpu-fraction-num-devices": "2"})
    right = cluster.decide(asked)
    wrong = cluster.decide(asked, faults=["devices-as-indices"])
    assert isinstance(right, Decision) and isinstance(wrong, Decision)
    assert right.devices == ("GPU-gpu-a-0-0", "GPU-gpu-a-0-1") and wrong.devices == ("0", "1")
    assert wrong.annotations[nv("main", "gpus.devices")] == "0,1"

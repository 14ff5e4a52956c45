"""The Pod's own constraints on its node, without a cluster: nodeSelector, affinity, taints, cordons.

First the semantics one rule at a time (``constraints``, as Kubernetes applies them), then what
the placement makes of them for fractional and whole Pods: where the Pod goes, and the message
it stays Pending with when no node will do.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from fixtures.sandbox.scheduler.constraints import NodeConstraints, Refusal, Taint, node_taints
from fixtures.sandbox.scheduler.ledger import Ledger
from fixtures.sandbox.scheduler.placement import Decision, NodeInfo, Unschedulable, decide
from fixtures.suite import manifests

MIB = 143771
HOST = "kubernetes.io/hostname"


def node(
    name: str,
    labels: Mapping[str, str] | None = None,
    taints: Sequence[Mapping[str, str]] = (),
    *,
    cordoned: bool = False,
    ready: bool = True,
    fractioning: bool = True,
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "labels": {
                HOST: name,
                "nvidia.com/gpu.count": "2",
                "nvidia.com/gpu.memory": str(MIB),
                **(labels or {}),
            },
            "annotations": {"gpuconf.io/gpu-uuids": f"GPU-{name}-0,GPU-{name}-1"},
        },
        "spec": {"taints": [dict(t) for t in taints], **({"unschedulable": True} if cordoned else {})},
        "status": {
            "conditions": [
                {"type": "Ready", "status": str(ready)},
                {"type": "gpu-fractioning.nvidia.com/Ready", "status": str(fractioning)},
            ]
        },
    }


def pod(fraction: bool = True, name: str = "p", **spec: Any) -> dict[str, Any]:
    return manifests.pod(
        name,
        [manifests.container("main")],
        namespace="ns",
        uid=f"uid-{name}",
        annotations={"gpu-memory": "1000"} if fraction else None,
        scheduler="s",
        spec=spec,
    )


def affinity(*terms: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}
    }


def expr(key: str, operator: str, *values: str) -> dict[str, Any]:
    return {"key": key, "operator": operator, "values": list(values)}


def place(nodes: Sequence[dict[str, Any]], p: dict[str, Any], faults: Sequence[str] = ()) -> Any:
    return decide(p, [NodeInfo.from_node(n) for n in nodes], Ledger(), faults=frozenset(faults))


def refusal(p: dict[str, Any], n: dict[str, Any]) -> Refusal | None:
    info = NodeInfo.from_node(n)
    return NodeConstraints.of(p).refusal(info.name, info.label_map, info.taints, info.cordoned)


NO_SCHEDULE = {"key": "k", "value": "v", "effect": "NoSchedule"}


# --------------------------------------------------------------------------- nodeSelector


def test_node_selector_needs_every_label_with_its_value() -> None:
    n = node("a", {"pool": "x", "empty": ""})
    assert refusal(pod(nodeSelector={"pool": "x", HOST: "a"}), n) is None
    assert refusal(pod(nodeSelector={"pool": "y"}), n) == Refusal("node-selector", "pool=y")
    assert refusal(pod(nodeSelector={"absent": ""}), n) == Refusal("node-selector", "absent=")
    assert refusal(pod(nodeSelector={"empty": ""}), n) is None  # present with the empty value


# --------------------------------------------------------------------------- affinity


@pytest.mark.parametrize(
    ("requirement", "matches"),
    [
        (expr("zone", "In", "z1", "z2"), True),
        (expr("zone", "In", "z2"), False),
        (expr("absent", "In", "z1"), False),
        (expr("zone", "NotIn", "z2"), True),
        (expr("zone", "NotIn", "z1"), False),
        (expr("absent", "NotIn", "z1"), True),  # NotIn holds where the label is missing
        (expr("zone", "Exists"), True),
        (expr("absent", "Exists"), False),
        (expr("zone", "DoesNotExist"), False),
        (expr("absent", "DoesNotExist"), True),
        (expr("cores", "Gt", "7"), True),
        (expr("cores", "Gt", "8"), False),
        (expr("cores", "Lt", "9"), True),
        (expr("cores", "Lt", "+8"), False),
        (expr("cores", "Gt", "-1"), True),
        (expr("zone", "Gt", "1"), False),  # the label is not an integer
        (expr("absent", "Lt", "100"), False),
        (expr("big", "Gt", "1"), False),  # beyond 64 bits: not an integer to Kubernetes
    ],
)
def test_match_expression_operators(requirement: dict[str, Any], matches: bool) -> None:
    n = node("a", {"zone": "z1", "cores": "8", "big": str(2**63)})
    got = refusal(pod(affinity=affinity({"matchExpressions": [requirement]})), n)
    assert (got is None) is matches, got


@pytest.mark.parametrize(
    "malformed",
    [
        expr("zone", "In"),  # In and NotIn need values
        expr("zone", "NotIn"),
        expr("zone", "Exists", "z1"),  # Exists and DoesNotExist take none
        expr("absent", "DoesNotExist", "z1"),
        expr("cores", "Gt", "1", "2"),  # Gt and Lt take exactly one integer
        expr("cores", "Lt", "1_0"),
        expr("cores", "Lt", " 9"),
        expr("zone", "Equals", "z1"),
    ],
)
def test_a_malformed_requirement_fails_its_term_only(malformed: dict[str, Any]) -> None:
    n = node("a", {"zone": "z1", "cores": "8"})
    alone = pod(affinity=affinity({"matchExpressions": [malformed]}))
    assert refusal(alone, n) is not None
    with_other = pod(
        affinity=affinity({"matchExpressions": [malformed]}, {"matchExpressions": [expr("zone", "In", "z1")]})
    )
    assert refusal(with_other, n) is None


def test_terms_are_ored_requirements_within_a_term_anded() -> None:
    n = node("a", {"zone": "z1", "pool": "p"})
    both = {"matchExpressions": [expr("zone", "In", "z1"), expr("pool", "In", "q")]}
    assert refusal(pod(affinity=affinity(both)), n) == Refusal("node-affinity", "zone in (z1), pool in (q)")
    either = affinity(both, {"matchExpressions": [expr("pool", "In", "p")]})
    assert refusal(pod(affinity=either), n) is None
    fields_too = {
        "matchExpressions": [expr("zone", "In", "z1")],
        "matchFields": [expr("metadata.name", "In", "b")],
    }
    assert refusal(pod(affinity=affinity(fields_too)), n) is not None


def test_an_empty_term_matches_no_node() -> None:
    assert refusal(pod(affinity=affinity({})), node("a")) == Refusal("node-affinity", "(empty term)")
    assert (
        refusal(pod(affinity=affinity({}, {"matchFields": [expr("metadata.name", "In", "a")]})), node("a"))
        is None
    )


@pytest.mark.parametrize(
    ("field", "matches"),
    [
        (expr("metadata.name", "In", "a"), True),
        (expr("metadata.name", "In", "b"), False),
        (expr("metadata.name", "NotIn", "b"), True),
        (expr("metadata.name", "NotIn", "a"), False),
        (expr("metadata.name", "In", "a", "b"), False),  # matchFields takes exactly one value
        (expr("metadata.name", "Exists"), False),  # and only In or NotIn
    ],
)
def test_match_fields_on_the_node_name(field: dict[str, Any], matches: bool) -> None:
    got = refusal(pod(affinity=affinity({"matchFields": [field]})), node("a"))
    assert (got is None) is matches, got


def test_node_selector_and_affinity_must_both_hold() -> None:
    p = pod(nodeSelector={HOST: "a"}, affinity=affinity({"matchExpressions": [expr(HOST, "In", "b")]}))
    assert refusal(p, node("a")) == Refusal("node-affinity", f"{HOST} in (b)")
    assert refusal(p, node("b")) == Refusal("node-selector", f"{HOST}=a")


# --------------------------------------------------------------------------- taints and cordons


@pytest.mark.parametrize(
    ("toleration", "tolerated"),
    [
        ({"key": "k", "operator": "Equal", "value": "v", "effect": "NoSchedule"}, True),
        ({"key": "k", "value": "v"}, True),  # no operator: Equal; no effect: every effect
        ({"key": "k", "value": "w"}, False),
        ({"key": "k", "operator": "Exists"}, True),
        ({"key": "other", "operator": "Exists"}, False),
        ({"operator": "Exists"}, True),  # empty key with Exists: every taint
        ({"operator": "Exists", "effect": "NoExecute"}, False),
        ({"key": "k", "operator": "Exists", "effect": "NoExecute"}, False),
        ({"key": "k", "operator": "Gt", "value": "v"}, False),
    ],
)
def test_tolerations(toleration: dict[str, str], tolerated: bool) -> None:
    got = refusal(pod(tolerations=[toleration]), node("a", taints=[NO_SCHEDULE]))
    assert got == (None if tolerated else Refusal("taint", "k=v:NoSchedule"))


def test_only_no_schedule_and_no_execute_taints_filter() -> None:
    taints = [
        {"key": "soft", "effect": "PreferNoSchedule"},
        {"key": "evict", "effect": "NoExecute"},
        NO_SCHEDULE,
    ]
    assert node_taints(node("a", taints=taints)) == (
        Taint("evict", "", "NoExecute"),
        Taint("k", "v", "NoSchedule"),
    )
    assert refusal(pod(), node("a", taints=taints)) == Refusal(
        "taint", "evict:NoExecute"
    )  # the first not tolerated
    tolerant = pod(tolerations=[{"key": "evict", "operator": "Exists"}])
    assert refusal(tolerant, node("a", taints=taints)) == Refusal("taint", "k=v:NoSchedule")
    assert refusal(pod(), node("a", taints=[{"key": "soft", "effect": "PreferNoSchedule"}])) is None


def test_a_cordon_is_tolerated_only_as_the_unschedulable_taint() -> None:
    cordoned = node("a", cordoned=True)
    assert refusal(pod(), cordoned) == Refusal("cordoned")
    assert refusal(pod(tolerations=[{"key": "k", "operator": "Exists"}]), cordoned) == Refusal("cordoned")
    daemon = {"key": "node.kubernetes.io/unschedulable", "operator": "Exists", "effect": "NoSchedule"}
    assert refusal(pod(tolerations=[daemon]), cordoned) is None
    assert refusal(pod(tolerations=[{"operator": "Exists"}]), cordoned) is None


def test_one_reason_per_node_cordon_then_taint_then_selector_then_affinity() -> None:
    n = node("a", taints=[NO_SCHEDULE], cordoned=True)
    p = pod(nodeSelector={HOST: "b"}, affinity=affinity({"matchFields": [expr("metadata.name", "In", "b")]}))
    assert refusal(p, n) == Refusal("cordoned")
    assert refusal(p, node("a", taints=[NO_SCHEDULE])) == Refusal("taint", "k=v:NoSchedule")
    assert refusal(p, node("a")) == Refusal("node-selector", f"{HOST}=b")


def test_a_changed_label_taint_or_cordon_is_a_changed_node() -> None:
    before = NodeInfo.from_node(node("a"))
    assert NodeInfo.from_node(node("a")) == before
    for changed in (node("a", {"pool": "x"}), node("a", taints=[NO_SCHEDULE]), node("a", cordoned=True)):
        assert NodeInfo.from_node(changed) != before


# --------------------------------------------------------------------------- placement


@pytest.mark.parametrize("fraction", [True, False], ids=["fraction", "whole"])
def test_node_selector_and_affinity_choose_the_node(fraction: bool) -> None:
    nodes = [node("gpu-a-0"), node("gpu-a-1"), node("gpu-a-2")]
    # binpack (or Pod count) would take gpu-a-0, the first by name
    assert place(nodes, pod(fraction)).node == "gpu-a-0"
    assert place(nodes, pod(fraction, nodeSelector={HOST: "gpu-a-1"})).node == "gpu-a-1"
    not_first = affinity({"matchExpressions": [expr(HOST, "NotIn", "gpu-a-0", "gpu-a-1")]})
    assert place(nodes, pod(fraction, affinity=not_first)).node == "gpu-a-2"
    by_name = affinity({"matchFields": [expr("metadata.name", "In", "gpu-a-1")]})
    assert place(nodes, pod(fraction, affinity=by_name)).node == "gpu-a-1"


@pytest.mark.parametrize("fraction", [True, False], ids=["fraction", "whole"])
def test_taints_and_cordons_keep_pods_off_unless_tolerated(fraction: bool) -> None:
    nodes = [node("gpu-a-0", taints=[NO_SCHEDULE]), node("gpu-a-1", cordoned=True), node("gpu-a-2")]
    assert place(nodes, pod(fraction)).node == "gpu-a-2"
    tolerant = pod(
        fraction, tolerations=[{"key": "k", "operator": "Equal", "value": "v", "effect": "NoSchedule"}]
    )
    assert place(nodes, tolerant).node == "gpu-a-0"


@pytest.mark.parametrize("fraction", [True, False], ids=["fraction", "whole"])
def test_a_pod_that_fits_no_node_says_why_per_node(fraction: bool) -> None:
    nodes = [
        node("gpu-a-0", taints=[NO_SCHEDULE]),
        node("gpu-a-1"),
        node("gpu-a-2"),
        node("gpu-a-3", cordoned=True),
    ]
    result = place(nodes, pod(fraction, nodeSelector={HOST: "x"}))
    assert result == Unschedulable(
        "no-matching-node",
        "0/4 nodes match: 1 is cordoned [gpu-a-3], 1 has taint k=v:NoSchedule not tolerated [gpu-a-0], "
        f"2 do not match the Pod's nodeSelector ({HOST}=x) [gpu-a-1, gpu-a-2]",
    )


def test_the_message_counts_nodes_that_match_but_are_not_ready() -> None:
    nodes = [node("gpu-a-0", ready=False), node("gpu-a-1", fractioning=False), node("gpu-a-2")]
    only = affinity({"matchExpressions": [expr(HOST, "NotIn", "gpu-a-2")]})
    assert place(nodes, pod(affinity=only)) == Unschedulable(
        "no-matching-node",
        f"0/3 nodes match: 1 does not match the Pod's required node affinity ({HOST} notin (gpu-a-2)) "
        "[gpu-a-2], 1 is not Ready [gpu-a-0], 1 has gpu-fractioning.nvidia.com/Ready not True [gpu-a-1]",
    )
    # a whole Pod needs only Ready: gpu-a-1 takes it
    assert place(nodes, pod(False, affinity=only)) == Decision("gpu-a-1", {})


def test_many_nodes_for_one_reason_are_named_up_to_three() -> None:
    nodes = [node(f"gpu-a-{i}") for i in range(5)]
    result = place(nodes, pod(nodeSelector={"pool": "b"}))
    assert isinstance(result, Unschedulable)
    assert result.message == (
        "0/5 nodes match: 5 do not match the Pod's nodeSelector (pool=b) "
        "[gpu-a-0, gpu-a-1, gpu-a-2, and 2 more]"
    )


def test_many_reasons_are_named_up_to_six() -> None:
    nodes = [node(f"n{i}", taints=[{"key": f"t{i}", "effect": "NoSchedule"}]) for i in range(8)]
    result = place(nodes, pod())
    assert isinstance(result, Unschedulable)
    assert result.message.startswith("0/8 nodes match: 1 has taint t0:NoSchedule not tolerated [n0], ")
    assert result.message.endswith("1 has taint t5:NoSchedule not tolerated [n5], 2 more for other reasons")


def test_without_any_constraint_the_old_reasons_stand() -> None:
    nodes = [node("gpu-a-0", ready=False)]
    result = place(nodes, pod())
    assert isinstance(result, Unschedulable) and result.code == "no-ready-node"


def test_a_memory_shortfall_also_names_the_nodes_not_considered() -> None:
    nodes = [node("gpu-a-0"), node("gpu-a-1", taints=[NO_SCHEDULE])]
    big = pod()
    big["metadata"]["annotations"] = {"gpu-memory": str(MIB + 1)}
    assert place(nodes, big) == Unschedulable(
        "insufficient-memory",
        f"no GPU with {MIB + 1} MiB free: the largest free is {MIB} MiB (GPU GPU-gpu-a-0-0 of node gpu-a-0); "
        "not considered: 1 has taint k=v:NoSchedule not tolerated [gpu-a-1]",
    )


def test_ignore_node_ready_still_honours_the_pods_constraints() -> None:
    # the fault breaks the readiness rule only: the unready node it prefers must still be one the Pod allows
    nodes = [node("gpu-a-0", fractioning=False), node("gpu-a-1", fractioning=False), node("gpu-a-2")]
    p = pod(nodeSelector={HOST: "gpu-a-1"})
    assert place(nodes, p, faults=["ignore-node-ready"]).node == "gpu-a-1"
    tainted = [node("gpu-a-0", taints=[NO_SCHEDULE], ready=False), node("gpu-a-1")]
    assert place(tainted, pod(), faults=["ignore-node-ready"]).node == "gpu-a-1"


def test_trust_pod_devices_does_not_follow_devices_to_a_node_the_pod_excludes() -> None:
    nodes = [node("gpu-a-0"), node("gpu-a-1")]
    p = pod(nodeSelector={HOST: "gpu-a-0"})
    p["metadata"]["annotations"]["nvidia.com/container.main.gpus.devices"] = "GPU-gpu-a-1-0"
    result = place(nodes, p, faults=["trust-pod-devices"])
    assert isinstance(result, Decision)
    assert result.node == "gpu-a-0"

"""Node readiness: fractions go only where the node agent says it can fence them.

The node agent publishes ``gpu-fractioning.nvidia.com/Ready=True`` on the nodes it serves; a
fraction placed elsewhere would run unfenced. The check first shows that the not-ready node could
otherwise take the Pod (Ready, untainted, a GPU with room for it), so that a pass means the
condition kept the Pod off, not a lack of room. The check needs a GPU node whose condition is not
True. A real cluster may have one (a node whose agent is down or not installed): the check uses it
and only watches, since the Pod it makes there must stay Pending anyway. Where the cluster's GPU
nodes are simulated (the suite's own sandbox, a fake GPU operator), it adds, for its duration, a
simulated GPU node whose condition is False; on a real cluster it never creates nodes.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

import pytest

from fixtures.suite.checks import Needs, check
from fixtures.suite.cluster import CONDITION_FRACTIONING_READY, HOSTNAME_LABEL, LABEL_SIMULATED, GpuNode
from fixtures.suite.frame import LABEL_RUN, LABEL_SUITE, Suite


def _not_ready_nodes(suite: Suite) -> list[GpuNode]:
    return [
        n
        for n in suite.cluster.gpu_nodes(suite.options.gpu_node_selector)
        if n.ready and n.fractioning_ready is not True and not n.cordoned and not n.taints
    ]


def _add_simulated_node(suite: Suite) -> GpuNode:
    """A simulated GPU node like the leased one, with the agent's condition False; deleted by the
    run's cleanup."""
    model = suite.node
    name = f"gc-notready-{suite.namespace[-4:]}"
    labels: dict[str, Any] = {
        k: v
        for k, v in (model.raw.get("metadata", {}).get("labels") or {}).items()
        if k.startswith("nvidia.com/")
    }
    labels.update(
        {HOSTNAME_LABEL: name, LABEL_SIMULATED: "true", LABEL_RUN: suite.options.run_id, LABEL_SUITE: "true"}
    )
    core = suite.cluster.core
    core.create_node({"metadata": {"name": name, "labels": labels}})
    suite.evidence.fact("addedNode", name)
    # A new Node gets the not-ready taint from admission; lift it, so that only the agent's condition
    # (the rule under test) keeps fractions away, as on a node whose kubelet is up but agent is not.
    core.patch_node(name, {"spec": {"taints": []}})
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    def condition(kind: str, status: str, reason: str) -> dict[str, str]:
        return {
            "type": kind,
            "status": status,
            "reason": reason,
            "message": "gpuconf node-readiness check",
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }

    capacity = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(model.gpu_count)}
    core.patch_node_status(
        name,
        {
            "status": {
                "capacity": capacity,
                "allocatable": capacity,
                "conditions": [
                    condition("Ready", "True", "SimulatedNode"),
                    condition(CONDITION_FRACTIONING_READY, "False", "AgentNotRunning"),
                ],
            }
        },
    )
    node = GpuNode.from_dict(suite.cluster.read_node(name) or {})
    if node is None:
        # The suite's own set-up did not hold (an error, never a verdict on the scheduler).
        raise RuntimeError(f"the simulated node {name} the suite added does not read back as a GPU node")
    return node


SHARE = 0.1
"""What the Pod asks for of one GPU of the node that is not ready."""


def _must_have_room(suite: Suite, target: GpuNode, share: float) -> None:
    """The not-ready node has a GPU with ``share`` of its memory free, by what every namespace's Pods
    hold there; otherwise the check cannot judge (an error: a refusal would prove nothing)."""
    if target.memory_mib <= 0 or target.gpu_count <= 0:
        raise RuntimeError(
            f"node {target.name} publishes no GPU memory or count: no fraction fits there anyway"
        )
    need = math.floor(target.memory_mib * share)
    loads = suite.loads_on(target)
    gpus = target.uuids or tuple(str(i) for i in range(target.gpu_count))
    free = {gpu: target.memory_mib - (loads[gpu].request_mib if gpu in loads else 0) for gpu in gpus}
    suite.evidence.fact("notReadyNodeRoom", {"needMiB": need, "freeMiBPerGpu": free})
    if not any(mib >= need for mib in free.values()):
        raise RuntimeError(
            f"node {target.name} has no GPU with {need} MiB free: a Pod kept off it proves nothing about "
            "its readiness condition"
        )


@check(
    id="node-readiness",
    level="MUST",
    statement=(
        "The scheduler MUST NOT place a fraction on a node without gpu-fractioning.nvidia.com/Ready=True."
    ),
    profiles=("scheduler",),
    seed="000/4",
    needs=Needs(nodes=1, gpus=1, idle=False),
)
def test_node_readiness(suite: Suite) -> None:
    candidates = _not_ready_nodes(suite)
    if candidates:
        target = candidates[0]
    elif suite.node.simulated:
        target = _add_simulated_node(suite)
    else:
        pytest.skip(
            "no GPU node lacks gpu-fractioning.nvidia.com/Ready=True, and on real GPUs the suite adds none"
        )
    suite.evidence.fact("notReadyNode", target.describe())
    # A pass means something only if the node could take the Pod but for its condition: Ready,
    # untainted, uncordoned (chosen so above) and a GPU with room for the request.
    _must_have_room(suite, target, SHARE)
    control = suite.scheduled_pod("control", suite.request(share=SHARE))
    refused = suite.scheduled_pod("on-not-ready", suite.request(share=SHARE, node=target), on=[target])
    suite.must_be_bound(control, "it asks for 0.1 of a GPU on a ready node")
    suite.must_stay_unbound(
        refused, f"node {target.name} does not have {CONDITION_FRACTIONING_READY}=True", "node-readiness"
    )
    suite.evidence.pod(refused, pending=suite.unschedulable(refused))

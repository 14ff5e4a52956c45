"""Readiness: fractions go only where the node agent says it can fence them, and it says so honestly.

The node agent publishes ``gpu-fractioning.nvidia.com/Ready=True`` on the nodes it serves; a
fraction placed elsewhere would run unfenced. "Not True" has three forms, and each must keep
fractions off: ``False`` (the agent says it cannot fence), ``Unknown`` (the operator's controller
stopped: reason ``ControllerUnavailable``, KAI's fit error "Condition ... is Unknown") and no such
condition at all (no agent). A scheduler that refuses only an explicit ``False`` passes the first
and places on the other two, so the check judges all three, one Pod pinned to a node in each state,
in one unbound window. It first shows that each such node could otherwise take the Pod (Ready,
untainted, a GPU with room for it), so that a pass means the condition kept the Pod off, not a
lack of room. A real cluster may have such nodes (an agent down or not installed): the check uses
them and only watches, since the Pods it makes there must stay Pending anyway. Where the cluster's
GPU nodes are simulated (the suite's own sandbox, a fake GPU operator), it adds, for its duration,
a simulated GPU node for each state it found no node in; on a real cluster it never creates nodes,
and a state no node of the cluster is in is named as not judged.

Agent readiness (``agent-readiness``, the node's side of the same rule): a node agent that cannot
fence, its backend gone, must say so (the condition False within its declared period), must not
start a fractional container meanwhile, and must say it is ready again once the backend is back.
The backend is taken away through the simulated device's outage hook (``fixtures.suite.simoutage``);
a node that announces none (a real GPU, whose driver a test cannot take away) is not judged, and
the check says so. Its Pod is placed by the suite (``spec.nodeName``) in both profiles: it judges
the node, and no correct scheduler binds a fraction to a node that is not ready (node-readiness
judges that).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any, Final

import pytest

from conformance.judgements import judge_condition_turn, judge_held, waiting_reason
from fixtures.suite import manifests
from fixtures.suite.checks import Needs, check
from fixtures.suite.cluster import CONDITION_FRACTIONING_READY, HOSTNAME_LABEL, LABEL_SIMULATED, GpuNode
from fixtures.suite.frame import LABEL_RUN, LABEL_SUITE, CheckFailed, Suite, fail
from fixtures.suite.reaction import hold_s, readiness_window_s
from fixtures.suite.scenario import CONTAINER, NotJudged, node_devices, plan
from fixtures.suite.simoutage import OutageError, outage_hook, resume, simulated_outage
from fixtures.suite.waiting import WaitTimeout, wait_until
from workloads.plan import hold

STATES: Final = ("False", "Unknown", "absent")
"""The forms of "not True" a readiness condition takes, each judged on a node of its own."""
REASONS: Final = {"False": "AgentNotRunning", "Unknown": "ControllerUnavailable"}


def _state(node: GpuNode) -> str:
    """``node``'s readiness condition as one of ``STATES`` (or "True")."""
    for cond in (node.raw.get("status") or {}).get("conditions") or []:
        if cond.get("type") == node.readiness_condition:
            status = str(cond.get("status"))
            return status if status in ("True", "False") else "Unknown"
    return "absent"


def _declared_condition(suite: Suite) -> str:
    """The readiness condition the node implementation under test writes (generation 1 names another)."""
    return (suite.options.node_part().conditions or (CONDITION_FRACTIONING_READY,))[0]


def _condition_of(node: GpuNode, declared: str) -> dict[str, Any]:
    """What the node says of its readiness (for the evidence)."""
    for cond in (node.raw.get("status") or {}).get("conditions") or []:
        if cond.get("type") == node.readiness_condition:
            return {k: cond.get(k) for k in ("type", "status", "reason", "message")}
    return {
        "type": declared,
        "status": None,
        "note": "the node has no readiness condition of any implementation",
    }


def _not_ready_nodes(suite: Suite) -> dict[str, GpuNode]:
    """One usable node per state of ``STATES`` the cluster has one in (Ready, untainted, uncordoned)."""
    found: dict[str, GpuNode] = {}
    for n in suite.cluster.gpu_nodes(suite.options.gpu_node_selector):
        if n.ready and n.fractioning_ready is not True and not n.cordoned and not n.taints:
            found.setdefault(_state(n), n)
    return found


def _add_simulated_node(suite: Suite, state: str) -> GpuNode:
    """A simulated GPU node like the leased one, its agent's condition in ``state`` (``absent``:
    none); deleted by the run's cleanup."""
    model = suite.node
    name = f"gc-{state.lower()}-{suite.namespace[-4:]}"
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
    suite.evidence.facts.setdefault("addedNodes", []).append(name)
    # A new Node gets the not-ready taint from admission; lift it, so that only the agent's condition
    # (the rule under test) keeps fractions away, as on a node whose kubelet is up but agent is not.
    core.patch_node(name, {"spec": {"taints": []}})
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

    def condition(kind: str, status: str, reason: str, message: str) -> dict[str, str]:
        return {
            "type": kind,
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }

    conditions = [condition("Ready", "True", "SimulatedNode", "gpuconf node-readiness check")]
    if state in REASONS:
        # The node implementation's own condition (generation 1 names another), as its controller writes it.
        kind = _declared_condition(suite)
        conditions.append(
            condition(
                kind, state, REASONS[state], f"gpuconf node-readiness check: Condition {kind} is {state}"
            )
        )
    capacity = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(model.gpu_count)}
    core.patch_node_status(
        name, {"status": {"capacity": capacity, "allocatable": capacity, "conditions": conditions}}
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
    suite.evidence.fact(f"roomOn:{target.name}", {"needMiB": need, "freeMiBPerGpu": free})
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
    targets = _not_ready_nodes(suite)
    for state in STATES:
        if state in targets:
            continue
        if suite.node.simulated:
            targets[state] = _add_simulated_node(suite, state)
        else:
            suite.not_judged(
                f"a node whose readiness condition is {state}",
                "no GPU node of the cluster is in that state (Ready, untainted), and on real GPUs the "
                "suite adds none",
            )
    if not targets:
        pytest.skip(
            "no GPU node lacks gpu-fractioning.nvidia.com/Ready=True, and on real GPUs the suite adds none"
        )
    suite.evidence.fact(
        "notReadyNodes",
        {
            state: {"node": n.describe(), "condition": _condition_of(n, _declared_condition(suite))}
            for state, n in targets.items()
        },
    )
    # A pass means something only if each node could take the Pod but for its condition: Ready,
    # untainted, uncordoned (chosen so above) and a GPU with room for the request.
    for target in targets.values():
        _must_have_room(suite, target, SHARE)
    control = suite.scheduled_pod("control", suite.request(share=SHARE))
    refused: dict[str, str] = {}
    for state, target in targets.items():
        name = suite.scheduled_pod(
            f"on-{state.lower()}", suite.request(share=SHARE, node=target), on=[target]
        )
        why = (
            f"node {target.name} has no readiness condition ({_declared_condition(suite)} or another "
            "implementation's)"
            if state == "absent"
            else f"node {target.name}'s {target.readiness_condition} is {state}, not True"
        )
        suite.must_not_be_placed(
            name,
            why,
            "node-readiness",
        )
        refused[name] = state
    suite.must_be_bound(control, "it asks for 0.1 of a GPU on a ready node")
    try:
        suite.must_stay_unbound()
    except CheckFailed as exc:
        # Name every state a fraction was placed in, not only the first binding seen.
        placed = {}
        for name, state in refused.items():
            snap = suite.watch.first_bound(name)
            if snap is not None:
                placed[state] = snap.node
        raise fail(
            f"{exc} (placed where the condition is {placed}; judged: {', '.join(refused.values())})"
        ) from None
    finally:
        for name, state in refused.items():
            snap = suite.watch.first_bound(name)
            suite.evidence.pod(
                name,
                conditionState=state,
                boundTo=snap.node if snap is not None else None,
                pending=suite.unschedulable(name),
            )


HELD_AT_LEAST_S: Final = 5.0
"""The least time the container created during the outage is watched not starting (the simulated
kubelet asks the agent again 2 s after a refusal, so this covers its first retries)."""
POLL_S: Final = 0.1


def _condition(node: Mapping[str, Any] | None, types: tuple[str, ...]) -> Mapping[str, Any] | None:
    """The node's readiness condition (the first of ``types`` it carries), or None."""
    for cond in ((node or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") in types:
            return dict(cond)
    return None


def _until_status(
    read: Callable[[], Mapping[str, Any] | None], want: bool, window_s: float
) -> tuple[float | None, Mapping[str, Any] | None]:
    """Poll the condition until its status is ``want`` (True: "True"; False: anything else), for at
    most ``window_s`` and the time of one more look; (seconds it took or None, the condition seen last)."""
    began = time.monotonic()
    seen: Mapping[str, Any] | None = None

    def turned() -> bool:
        nonlocal seen
        seen = read()
        return ((seen or {}).get("status") == "True") == want

    try:
        wait_until(turned, "the node condition to turn", window_s + 2 * POLL_S, interval=POLL_S)
    except WaitTimeout:
        return None, seen
    return time.monotonic() - began, seen


def _as_fact(took_s: float | None, cond: Mapping[str, Any] | None) -> dict[str, Any]:
    cond = cond or {}
    return {
        "seconds": None if took_s is None else round(took_s, 3),
        "status": cond.get("status"),
        "reason": cond.get("reason"),
        "message": cond.get("message"),
        "lastTransitionTime": cond.get("lastTransitionTime"),
    }


@check(
    id="agent-readiness",
    level="MUST",
    statement="A node agent whose GPU backend is gone MUST turn its readiness condition False within "
    "its declared period, MUST NOT start a fractional container created on the node meanwhile, and "
    "MUST turn the condition True again within that period once the backend is back; judged where the "
    "node announces a simulated backend outage hook (a real GPU's driver cannot be taken away by a test).",
    # Not in ``stack``: its Pod is placed by the suite in any profile (no correct scheduler binds to a
    # node that is not ready; node-readiness judges that), so a stack twin would judge nothing more.
    profiles=("node",),
    seed="000/4",
    needs=Needs(nodes=1, gpus=1, idle=True),
)
def test_agent_readiness(suite: Suite) -> None:
    node = suite.node
    try:
        hook = outage_hook(suite.cluster, node.name)
    except OutageError as exc:
        raise NotJudged(str(exc)) from None
    if hook is None:
        pytest.skip(
            f"not judged: node {node.name} announces no simulated backend outage hook (annotation "
            "gpuconf.io/simulated-backend-outage): a real GPU's driver cannot be taken away by a test"
        )
    types = suite.options.node_part().conditions or (CONDITION_FRACTIONING_READY,)

    def read() -> Mapping[str, Any] | None:
        return _condition(suite.cluster.read_node(node.name), types)

    before = read()
    if (before or {}).get("status") != "True":
        raise NotJudged(f"node {node.name}'s condition is not True before the outage: {dict(before or {})}")
    window = readiness_window_s(suite.options)
    held_for = suite.timeout(hold_s(suite.options, HELD_AT_LEAST_S))
    suite.evidence.fact(
        "windowSeconds", {"condition": window, "held": held_for, "conditionTypes": list(types)}
    )
    problems: list[str] = []
    try:
        with simulated_outage(node.name, hook) as outage:
            took, cond = _until_status(read, False, window)
            suite.evidence.fact("notReady", _as_fact(took, cond))
            problem = judge_condition_turn(types[0], False, took, window, "its backend went away")
            if problem:
                problems.append(problem)
            size = max(1, math.floor(node.memory_mib * SHARE))
            held = suite.placed_pod(
                "held",
                manifests.placement_annotations(CONTAINER, size, size, node_devices(suite, node)[:1]),
                [
                    manifests.container(
                        CONTAINER,
                        image=suite.options.workload_image,
                        plan=plan("held", hold(seconds=60)),
                    )
                ],
            )
            started = time.monotonic()

            def history() -> list[Mapping[str, Any]]:
                return [snap.pod for snap in suite.watch.history(held)]

            try:
                wait_until(
                    lambda: judge_held(held, history(), CONTAINER, held_for, "") is not None,
                    f"{held} to start",
                    held_for,
                    interval=POLL_S,
                )
            except WaitTimeout:
                pass  # held for the whole window: what must hold
            watched = time.monotonic() - started
            verdict = judge_held(held, history(), CONTAINER, watched, f"node {node.name}'s backend was gone")
            suite.evidence.pod(
                held, watchedSeconds=round(watched, 3), said=waiting_reason(history(), CONTAINER)
            )
            if verdict:
                problems.append(verdict)
            unresumed = resume(outage)
            if unresumed:
                raise NotJudged(f"the simulated device was not resumed: {unresumed}")
            took, cond = _until_status(read, True, window)
            suite.evidence.fact("readyAgain", _as_fact(took, cond))
            suite.evidence.fact("outage", outage.as_dict())
            problem = judge_condition_turn(types[0], True, took, window, "its backend came back")
            if problem:
                problems.append(f"{problem}: the node does not recover")
    except OutageError as exc:
        raise NotJudged(str(exc)) from None
    if problems:
        raise fail("; ".join(problems))

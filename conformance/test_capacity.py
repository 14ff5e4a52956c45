"""Capacity: guarantees fit the GPU, are given back when Pods finish, and a Pod that fits nowhere says why.

The sizes are shares of the leased node's GPU memory (label ``nvidia.com/gpu.memory``): 0.6 of a GPU
fits once per GPU and never twice, whatever reserve a scheduler holds back (up to 40 %), so "one
per GPU" is the only correct packing and any second one on a GPU is an overcommit.
"""

from __future__ import annotations

import pytest

from enforcement.contract import audit_gpus
from fixtures.suite.checks import Needs, check
from fixtures.suite.frame import Suite, fail
from fixtures.suite.manifests import RequestForm
from fixtures.suite.waiting import WaitTimeout, wait_until

FILL = 0.6


def _fill(suite: Suite, prefix: str, plan_seconds: float | None = None) -> list[str]:
    """One Pod of 0.6 of a GPU per GPU of the leased node, each bound (a failure otherwise)."""
    names = []
    plan = None
    if plan_seconds is not None:
        plan = {"name": "brief", "steps": [{"op": "hold", "seconds": plan_seconds}]}
    for i in range(suite.node.gpu_count):
        names.append(
            suite.scheduled_pod(f"{prefix}-{i}", suite.request(share=FILL), [suite.workload(plan=plan)])
        )
    for name in names:
        suite.must_be_bound(name, f"the node has {suite.node.gpu_count} idle GPUs, one for each 0.6 share")
    return names


def gpus_must_not_be_overcommitted(suite: Suite) -> None:
    node = suite.cluster.read_node(suite.node.name)
    violations = [
        v
        for v in audit_gpus(suite.cluster.pods_on(suite.node.name), [node] if node else [])
        if v.rule == "gpu-overcommit"
    ]
    loads = {gpu: load.request_mib for gpu, load in suite.loads_on().items()}
    suite.evidence.fact("requestedMiBPerGpu", loads)
    if violations:
        raise fail("; ".join(v.message for v in violations))


@check(
    id="memory-fit",
    level="MUST",
    statement="On every GPU the sum of the guaranteed requests MUST stay within the GPU's memory: a Pod that "
    "does not fit on any GPU of its node MUST NOT be placed there.",
    profiles=("scheduler",),
    seed="003/4",
    needs=Needs(nodes=1, gpus=1, idle=True),
)
def test_memory_fit(suite: Suite) -> None:
    _fill(suite, "fill")
    extra = suite.scheduled_pod("one-too-many", suite.request(share=FILL))
    try:
        suite.must_stay_unbound(extra)
    finally:
        gpus_must_not_be_overcommitted(suite)
    suite.evidence.pod(extra, pending=suite.unschedulable(extra))


@check(
    id="release-on-completion",
    level="MUST",
    statement="When Pods finish (Succeeded or Failed), the scheduler MUST count their guarantees as free "
    "again: the same requests fit on the same GPUs.",
    profiles=("scheduler",),
    seed="000/4",
    needs=Needs(nodes=1, gpus=1, idle=True),
)
def test_release_on_completion(suite: Suite) -> None:
    first = _fill(suite, "first", plan_seconds=0.5)
    for name in first:
        suite.wait_finished(name)
    # The finished Pods stay (phase Succeeded): their guarantees must be free without anyone deleting them.
    second = [suite.scheduled_pod(f"second-{i}", suite.request(share=FILL)) for i in range(len(first))]
    for name in second:
        suite.must_be_bound(name, f"the Pods that held those GPUs finished ({', '.join(first)})")
    gpus_must_not_be_overcommitted(suite)


ACTIONABLE_WORDS = ("memory", "mib", "gib", "gpu")


@check(
    id="unschedulable-reason",
    level="SHOULD",
    statement="A request no GPU can hold SHOULD stay Pending with PodScheduled=False and a "
    "message a person can "
    "act on (it names the memory or the GPUs that are short).",
    profiles=("scheduler",),
    seed="000/4",
)
def test_unschedulable_reason(suite: Suite) -> None:
    form: RequestForm = "nvidia" if suite.form == "nvidia" else "gpu-memory"
    if form not in suite.options.supported_features:
        pytest.skip(
            "needs an absolute request form (gpu-memory or nvidia) to write a request no GPU can hold"
        )
    too_big = suite.node.memory_mib * 2
    control = suite.scheduled_pod("control", suite.request(share=0.1))
    impossible = suite.scheduled_pod("impossible", suite.request(request_mib=too_big, form=form))
    suite.must_be_bound(control, "it asks for a tenth of an idle GPU")
    suite.must_stay_unbound(impossible)

    def reason() -> tuple[str, str] | None:
        return suite.unschedulable(impossible)

    try:
        why, message = wait_until(reason, f"{impossible} to show PodScheduled=False", suite.timeout(10))
    except WaitTimeout:
        events = [e for e in suite.events(impossible) if e.get("type") == "Warning"]
        suite.evidence.pod(impossible, events=[e.get("message") for e in events])
        raise fail(
            f"{impossible} ({too_big} MiB, twice a GPU) stays Pending with no PodScheduled=False condition"
            + (f"; Events: {events[-1].get('message')}" if events else " and no Warning Event")
        ) from None
    suite.evidence.pod(impossible, unschedulable={"reason": why, "message": message})
    if not message.strip() or not any(w in message.lower() for w in ACTIONABLE_WORDS):
        raise fail(f"{impossible} is Pending ({why}) but its message does not say what is short: {message!r}")

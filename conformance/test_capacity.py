"""Capacity: guarantees fit the GPU, are given back when Pods finish, and a Pod that fits nowhere says why.

The sizes are shares of the leased node's GPU memory (label ``nvidia.com/gpu.memory``): 0.6 of a GPU
fits once per GPU and never twice, whatever reserve a scheduler holds back (up to 40 %), so "one
per GPU" is the only correct packing and any second one on a GPU is an overcommit. memory-fit puts
that 0.6 on every GPU with one multi-device Pod (its request counts on each GPU). Memory fit is
then judged to the MiB: 0.3 more on each GPU (0.9 fits within the contract's 5 % reserve), one of
them a Pod of another namespace bound directly, as another scheduler would have (it counts too),
and a last Pod that would take any GPU's guarantees half a percent past its memory must stay
unplaced.
"""

from __future__ import annotations

import math

import pytest
from kubernetes.client.rest import ApiException

from enforcement.contract import SUFFIX_DEVICES, audit_gpus, nvidia_key
from fixtures.suite.admission import REFUSED_STATUSES
from fixtures.suite.checks import Needs, check
from fixtures.suite.frame import Suite, fail
from fixtures.suite.manifests import RequestForm
from fixtures.suite.waiting import WaitTimeout, wait_until
from workloads.plan import alloc, hold, plan_wire

FILL = 0.6
TOP_UP = 0.3
"""0.6 + 0.3 of a GPU: within the usable memory of any scheduler holding back the documented 5 %."""
RULE = "gpu-overcommit"
OVER_BY = 0.005
"""How far past a GPU's memory the last Pod of memory-fit would take its guarantees: half a percent."""


def _plan(seconds: float, fails: bool = False) -> dict[str, object]:
    """Hold ``seconds``, then end Succeeded, or (``fails``) Failed: it then asks for more memory
    than any GPU has, which fails with out-of-memory on every device, real or simulated."""
    more_than_any_gpu = [alloc(1 << 30)] if fails else []  # 1 PiB
    return plan_wire("fails" if fails else "brief", hold(seconds=seconds), *more_than_any_gpu)


def _fill(suite: Suite, prefix: str, plan: dict[str, object] | None = None) -> list[str]:
    """One Pod of 0.6 of a GPU per GPU of the leased node, each bound (a failure otherwise)."""
    names = []
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
        raise fail("; ".join(f"{v.message} [{v.rule}]" for v in violations))


@check(
    id="memory-fit",
    level="MUST",
    statement="On every GPU the sum of the guaranteed requests MUST stay within the GPU's memory, counting "
    "a multi-device Pod's request on each of its GPUs and the Pods of every namespace and every "
    "scheduler: a Pod that does not fit on any GPU of its node MUST NOT be placed there.",
    profiles=("scheduler",),
    seed="003/4",
    needs=Needs(nodes=1, gpus=1, idle=True),
)
def test_memory_fit(suite: Suite) -> None:
    # The GPUs only fill up during the check, so a Pod that does not fit when it is made never
    # fits later: both such Pods are judged after one window, and again at the check's end.
    count, memory = suite.node.gpu_count, suite.node.memory_mib
    if suite.options.claims("multi-device") and count > 1:
        # One Pod across every GPU: its request is charged to each, so nothing of 0.6 fits after it.
        fill = suite.scheduled_pod("fill", suite.request(share=FILL, num_devices=count))
        snap = suite.must_be_bound(fill, f"it asks for {FILL} of each of {count} idle GPUs")
        written = snap.annotations.get(nvidia_key("main", SUFFIX_DEVICES), "").split(",")
        held_by = f"{fill}'s request, on each of its {count} GPUs"
    else:
        fills = _fill(suite, "fill")
        suite.not_judged(
            "a multi-device Pod's request charged to each of its GPUs",
            "the node has one GPU" if count < 2 else "the implementation does not claim multi-device",
        )
        written = [_devices_at_bind(suite, n) for n in fills]
        held_by = f"{', '.join(fills)}, one per GPU"
    extra = suite.scheduled_pod("one-too-many", suite.request(share=FILL))
    suite.must_not_be_placed(
        extra,
        f"every GPU of the node already holds {FILL} of its memory ({held_by}), and it asks for {FILL} more",
        RULE,
    )
    # To the MiB: top every GPU up to 0.9 (several Pods, not one large share), one of them with a Pod
    # of another namespace bound by another party, then ask for just over what is left: whichever
    # GPU took it would hold half a percent more than its memory.
    fill_mib, top_mib = math.floor(memory * FILL), math.floor(memory * TOP_UP)
    foreign = _foreign_top(suite, top_mib, written[0])
    tops = [
        suite.scheduled_pod(f"top-{i}", suite.request(request_mib=top_mib))
        for i in range(count - len(foreign))
    ]
    for name in tops:
        suite.must_be_bound(
            name,
            f"0.6 + 0.3 of a {memory} MiB GPU fits within the contract's 5 % reserve"
            + (f", and {count - len(foreign)} GPU(s) have not had their 0.3 yet" if foreign else ""),
        )
    over_mib = memory - fill_mib - top_mib + math.ceil(memory * OVER_BY)
    last = suite.scheduled_pod("just-over", suite.request(request_mib=over_mib))
    over_by = fill_mib + top_mib + over_mib - memory
    suite.must_not_be_placed(
        last,
        f"on any GPU of the node it would take the guarantees {over_by} MiB past the GPU's {memory} MiB"
        + (f" (GPU {written[0]}'s 0.3 is {foreign[0]}'s, another party's)" if foreign else ""),
        RULE,
    )
    suite.evidence.fact(
        "toTheMiB",
        {"gpuMiB": memory, "heldMiB": fill_mib + top_mib, "askedMiB": over_mib, "overByMiB": over_by},
    )
    try:
        suite.must_stay_unbound()
    finally:
        gpus_must_not_be_overcommitted(suite)
    suite.evidence.pod(extra, pending=suite.unschedulable(extra))


def _devices_at_bind(suite: Suite, name: str) -> str:
    """The gpus.devices value ``name`` carried when it was bound, as the scheduler wrote it."""
    snap = suite.watch.first_bound(name)
    if snap is None:
        raise RuntimeError(f"{name} was judged bound but the watch never saw it bound")
    return snap.annotations.get(nvidia_key("main", SUFFIX_DEVICES), "")


def _foreign_top(suite: Suite, top_mib: int, device: str) -> list[str]:
    """0.3 of ``device`` held by a Pod of another namespace, bound there directly (as another
    scheduler would have): the scheduler under test must count it. Where admission refuses a
    Pod whose placement the suite writes, that part is not judged (and the list is empty)."""
    try:
        name = suite.foreign_pod("foreign-top", top_mib, [device])
    except ApiException as exc:
        if exc.status not in REFUSED_STATUSES:
            raise
        suite.not_judged(
            "Pods of other namespaces and schedulers counted",
            f"admission refused a Pod bound directly with the suite's placement: {exc.status} {exc.reason}",
        )
        return []
    suite.evidence.fact(
        "foreignPod",
        {"pod": name, "namespace": suite.other_namespace(), "gpu": device, "requestMiB": top_mib},
    )
    return [name]


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
    # The finished Pods stay (their phase set): their guarantees must be free without anyone deleting them.
    succeeded = _fill(suite, "succeeds", _plan(0.5))
    failed = _refill(suite, "fails", succeeded, "Succeeded", _plan(0.5, fails=True))
    _refill(suite, "after", failed, "Failed")


def _refill(
    suite: Suite, prefix: str, before: list[str], phase: str, plan: dict[str, object] | None = None
) -> list[str]:
    """Once ``before`` ended ``phase``, as many Pods of the same size must be bound on the same GPUs."""
    for name in before:
        ended = (suite.wait_finished(name).get("status") or {}).get("phase")
        if ended != phase:
            raise RuntimeError(f"{name} ended {ended}, not {phase}: the check's workload plan is wrong")
    names = [
        suite.scheduled_pod(f"{prefix}-{i}", suite.request(share=FILL), [suite.workload(plan=plan)])
        for i in range(len(before))
    ]
    for name in names:
        suite.must_be_bound(name, f"the Pods that held those GPUs ended {phase} ({', '.join(before)})")
    gpus_must_not_be_overcommitted(suite)
    return names


MEMORY_WORDS = ("memory", "mib", "gib", "mi ", "gi ", "bytes")
"""A reason that names GPU memory says one of these (a reason that only says "GPU" does not)."""


@check(
    id="unschedulable-reason",
    level="SHOULD",
    statement="A request no GPU can hold SHOULD stay Pending with PodScheduled=False and a "
    "message a person can "
    "act on: it names the GPU memory that is short.",
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
    # That it is never placed is judged at the check's end (memory-fit judges placement with its
    # window); here only its explanation is waited for.
    suite.must_not_be_placed(impossible, f"it asks for {too_big} MiB, twice a GPU's memory", RULE)
    suite.must_be_bound(control, "it asks for a tenth of an idle GPU")

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
    if not any(w in f"{message.lower()} " for w in MEMORY_WORDS):
        raise fail(
            f"{impossible} is Pending ({why}) but its message does not name the GPU memory that is short: "
            f"{message!r}"
        )

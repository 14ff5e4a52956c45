"""Annotations: what the scheduler writes on a fractional container, and when.

The node agent reads the four annotations when the container is created, which can be the instant
after binding; so they must be on the Pod *when* ``spec.nodeName`` appears, not a moment later.
The Pod watch of each check sees every change in order, so "at binding" is what the API server
showed at that resourceVersion.
"""

from __future__ import annotations

import math
from typing import Final

from conformance.expect import (
    gpus_at_bind,
    limit_and_mode_present,
    placement_must_be_complete,
    portion_range,
    values_must_be_as_asked,
)
from enforcement.contract import SM_SHARING, SUFFIX_LIMIT, SUFFIX_REQUEST, TIME_SLICING, nvidia_key
from fixtures.suite.checks import Needs, check
from fixtures.suite.frame import CheckFailed, Suite, fail
from fixtures.suite.podwatch import Snapshot


@check(
    id="annotations-at-bind",
    level="MUST",
    statement="When a fractional Pod is bound, its fractional container MUST already carry "
    "nvidia.com/container.<c>.gpu-memory.request and .gpus.devices, keyed by that container's name, "
    "with values that obey the contract's parsing rules.",
    profiles=("scheduler",),
    seed="000/4",
    each_form=True,
)
def test_annotations_at_bind(suite: Suite) -> None:
    name = suite.scheduled_pod("frac", suite.request(share=0.25, limit_share=0.5))
    at_bind = suite.must_be_bound(name, "it asks for a quarter of one idle GPU")
    placed = placement_must_be_complete(suite, name, at_bind)
    suite.evidence.fact(
        "placement",
        {"requestMiB": placed.request_mib, "limitMiB": placed.limit_mib, "devices": list(placed.devices)},
    )


@check(
    id="annotations-name-the-container",
    level="MUST",
    statement="In a Pod with several containers, the scheduler MUST key the annotations by the name of the "
    "container that asked for the fraction, and MUST NOT write them for a container the Pod does not have.",
    profiles=("scheduler",),
    seed="000/4",
)
def test_annotations_name_the_container(suite: Suite) -> None:
    # The fraction is for the second container, named explicitly; the first is a plain sidecar.
    sidecar = suite.workload("sidecar")
    app = suite.workload("app")
    request = suite.request("app", share=0.2, name_container=True)
    name = suite.scheduled_pod("sidecar-pod", request, [sidecar, app])
    at_bind = suite.must_be_bound(name, "it asks for a fifth of one idle GPU")
    placement_must_be_complete(suite, name, at_bind, container="app")
    stray = [k for k in at_bind.annotations if k.startswith("nvidia.com/container.sidecar.")]
    if stray:
        raise fail(f"{name}: the sidecar, which asked for nothing, got {', '.join(stray)}")


@check(
    id="limit-and-mode-at-bind",
    level="SHOULD",
    statement="When a fractional Pod is bound, its fractional container SHOULD also carry "
    "gpu-memory.limit and gpu-compute.mode, so that request, limit, mode and devices stand side by side.",
    profiles=("scheduler",),
    seed="000/1",
)
def test_limit_and_mode_at_bind(suite: Suite) -> None:
    name = suite.scheduled_pod("frac", suite.request(share=0.25, limit_share=0.5))
    at_bind = suite.must_be_bound(name, "it asks for a quarter of one idle GPU")
    missing = limit_and_mode_present(suite, name, at_bind)
    part = suite.options.scheduler_part()
    if not part.writes_mode:
        # A mechanism: KAI's binder never writes the mode (the node then defaults to time-slicing).
        suite.not_judged("gpu-compute.mode", f"{part.implementation} never writes the mode (its description)")
        missing = [m for m in missing if not m.endswith(".gpu-compute.mode")]
    if missing:
        rule = " [limit-missing]" if nvidia_key("main", SUFFIX_LIMIT) in missing else ""
        raise fail(
            f"{name}: at binding, {', '.join(missing)} missing (the node then assumes limit = "
            f"request and time-slicing){rule}"
        )


@check(
    id="values-as-asked",
    level="MUST",
    statement="What the scheduler writes MUST be what the author asked, converted: the request (the "
    "author's MiB, or the portion of the bound GPU's memory within the documented 5 % reserve), the "
    "limit (the author's, or the request when the author gave none: never smaller, never larger), "
    "the mode (the author's; time-slicing when the author gave none) and the devices (the count "
    "asked, distinct, on the bound node).",
    profiles=("scheduler",),
    seed="000/4",
    each_form=True,
    needs=Needs(nodes=1, gpus=2, idle=True),
)
def test_values_as_asked(suite: Suite) -> None:
    # One Pod with every value written, one with the request alone (the limit and mode defaults),
    # and, where sm-sharing is supported, one asking for it (on a GPU of its own: modes never mix).
    asks = {
        "full": suite.request(share=0.25, limit_share=0.5, mode=TIME_SLICING),
        "bare": suite.request(share=0.2),
    }
    if "sm-sharing" in suite.options.supported_features:
        asks["shared"] = suite.request(share=0.15, limit_share=0.3, mode=SM_SHARING)
    names = {what: suite.scheduled_pod(what, asked) for what, asked in asks.items()}
    for what, name in names.items():
        snap = suite.must_be_bound(name, f"the node has {suite.node.gpu_count} idle GPUs for 3 small Pods")
        values_must_be_as_asked(suite, name, snap, asks[what])
    # Then the same on a busy GPU: a scheduler that takes the limit for capacity (and lowers it to
    # what the GPU has left unguaranteed) writes the author's limit only where plenty is left.
    _values_on_a_busy_gpu(suite)


BUSY_LEFT: Final = 0.3
"""At most this share of each time-slicing GPU is left unguaranteed before the busy Pod is asked for."""
BUSY_SLACK: Final = 0.01
"""A GPU with at most this share more than ``BUSY_LEFT`` left counts as busy (rounding of holders)."""
BUSY_REQUEST, BUSY_LIMIT = 0.1, 0.6
"""The busy Pod's request and limit (shares of a GPU): its limit is twice what any GPU it may land on
has left unguaranteed."""


def _unguaranteed(suite: Suite) -> tuple[list[int], dict[str, int]]:
    """MiB left unguaranteed on each GPU of the leased node that a time-slicing Pod may join (idle
    GPUs included), and per GPU that holds anything, what is left there (for the evidence)."""
    node = suite.node
    loads = {gpu: load for gpu, load in suite.loads_on().items() if load.shares}
    held = {gpu: node.memory_mib - load.request_mib for gpu, load in loads.items()}
    open_to_time_slicing = [
        node.memory_mib - load.request_mib for load in loads.values() if SM_SHARING not in load.modes
    ]
    return open_to_time_slicing + [node.memory_mib] * max(0, node.gpu_count - len(loads)), held


def _values_on_a_busy_gpu(suite: Suite) -> None:
    """Cover every GPU a time-slicing Pod may join with other Pods' guarantees (each holder placed by
    the scheduler under test, and judged as asked too), until at most ``BUSY_LEFT`` of each is left;
    then ask for a Pod whose limit is larger than anything left, and judge what is written for it."""
    memory = suite.node.memory_mib
    target = math.floor(memory * BUSY_LEFT)
    busy_enough = target + math.floor(memory * BUSY_SLACK)
    for step in range(2 * suite.node.gpu_count):
        left, _ = _unguaranteed(suite)
        roomy = [mib for mib in left if mib > busy_enough]
        if not roomy:
            break
        size = max(roomy) - target
        asked = suite.request(request_mib=size)
        holder = suite.scheduled_pod(f"holder-{step}", asked)
        snap = suite.must_be_bound(holder, f"a GPU of the node has {max(roomy)} MiB unguaranteed")
        values_must_be_as_asked(suite, holder, snap, asked)
    left, held = _unguaranteed(suite)
    suite.evidence.fact(
        "busyGpus", {"unguaranteedMiB": held, "target": f"at most {busy_enough} MiB on each time-slicing GPU"}
    )
    if any(mib > busy_enough for mib in left):
        suite.not_judged(
            "the values on a busy GPU",
            f"after {2 * suite.node.gpu_count} holders a time-slicing GPU still has "
            f"{max(left)} MiB of {memory} MiB unguaranteed (wanted at most {busy_enough})",
        )
        return
    asked = suite.request(share=BUSY_REQUEST, limit_share=BUSY_LIMIT, mode=TIME_SLICING)
    name = suite.scheduled_pod("busy", asked)
    snap = suite.must_be_bound(name, f"GPUs of the node have {max(left)} MiB unguaranteed")
    there = _on_busy_gpu(suite, name, snap, held, busy_enough)
    try:
        values_must_be_as_asked(suite, name, snap, asked)
    except CheckFailed as exc:
        raise fail(
            f"{exc} (on a busy GPU: other Pods' guarantees left {there} MiB unguaranteed there; the "
            "limit is the author's reclaim boundary, not the memory the GPU has left)"
        ) from None


def _on_busy_gpu(
    suite: Suite, name: str, snap: Snapshot, held: dict[str, int], busy_enough: int
) -> dict[str, int]:
    """Record how much was left unguaranteed on the GPU the busy Pod got; where more than its limit was
    left (a GPU the staging did not cover), its values are still judged, but not as on a busy GPU."""
    gpus = gpus_at_bind(suite, name, snap)
    there = {gpu: held.get(gpu, suite.node.memory_mib) for gpu in gpus}
    suite.evidence.pod(name, unguaranteedMiBBeforeIt=there)
    if any(mib > busy_enough for mib in there.values()):
        suite.not_judged(
            "the values on a busy GPU",
            f"{name} went to GPU(s) with {there} MiB unguaranteed, more than the {busy_enough} MiB staged",
        )
    return there


@check(
    id="portion-conversion",
    level="MUST",
    statement="A gpu-fraction request (and its gpu-fraction.limit) MUST become absolute MiB of "
    "the chosen GPU's "
    "memory: portion x the GPU's memory (label nvidia.com/gpu.memory), less at most a documented reserve "
    "of 5 %, never more.",
    profiles=("scheduler",),
    features=("gpu-fraction",),
    seed="003/4",
)
def test_portion_conversion(suite: Suite) -> None:
    portion, portion_limit = 0.3, 0.45
    name = suite.scheduled_pod(
        "portion", suite.request(share=portion, limit_share=portion_limit, form="gpu-fraction")
    )
    at_bind = suite.must_be_bound(name, "it asks for 0.3 of one idle GPU")
    placed = placement_must_be_complete(suite, name, at_bind)
    memory = suite.node.memory_mib
    problems = []
    for what, share, got in (
        ("request", portion, placed.request_mib),
        ("limit", portion_limit, placed.limit_mib),
    ):
        floor, ceiling = portion_range(memory, share)
        suite.evidence.fact(
            f"{what}MiB", {"written": got, "allowed": [floor, ceiling], "portion": share, "gpuMiB": memory}
        )
        if not floor <= got <= ceiling:
            problems.append(
                f"{what} {got} MiB is not {share} of a {memory} MiB GPU (allowed {floor}..{ceiling} MiB)"
            )
    if problems:
        key = nvidia_key("main", SUFFIX_REQUEST)
        raise fail(f"{name}: {'; '.join(problems)} ({key}={at_bind.annotations.get(key)})")

"""Compute modes: time-slicing and sm-sharing never share a GPU; a node may run both on different GPUs.

The mode is tracked per GPU, not per node. The MUST check leaves exactly one GPU with room (the one
holding a time-slicing Pod) and then asks for sm-sharing: the only way to place it is to mix, so a
correct scheduler leaves it Pending and a mixing one is caught whatever its packing policy.
"""

from __future__ import annotations

from conformance.expect import gpus_at_bind
from enforcement.contract import SM_SHARING, TIME_SLICING
from fixtures.suite.checks import Needs, check
from fixtures.suite.frame import Suite, fail


def modes_must_not_mix(suite: Suite) -> None:
    loads = suite.loads_on()
    suite.evidence.fact("modesPerGpu", {gpu: sorted(load.modes) for gpu, load in loads.items()})
    mixed = {gpu: load for gpu, load in loads.items() if load.mixed}
    if mixed:
        parts = [
            f"GPU {gpu} holds " + ", ".join(f"{s.pod} ({s.mode})" for s in load.shares)
            for gpu, load in mixed.items()
        ]
        raise fail("time-slicing and sm-sharing on one GPU: " + "; ".join(parts) + " [mode-mixing]")


@check(
    id="mode-separation",
    level="MUST",
    statement="Time-slicing and sm-sharing workloads MUST NOT be placed on the same GPU.",
    profiles=("scheduler",),
    features=("sm-sharing",),
    seed="003/4",
    needs=Needs(nodes=1, gpus=1, idle=True),
)
def test_mode_separation(suite: Suite) -> None:
    sliced = suite.scheduled_pod("sliced", suite.request(share=0.3, mode=TIME_SLICING))
    sliced_gpus = gpus_at_bind(suite, sliced, suite.must_be_bound(sliced, "it asks for 0.3 of an idle GPU"))
    # Fill every other GPU so that only the time-slicing Pod's GPU has room left.
    fillers = [
        suite.scheduled_pod(f"filler-{i}", suite.request(share=0.8, mode=TIME_SLICING))
        for i in range(suite.node.gpu_count - 1)
    ]
    for name in fillers:
        gpus_at_bind(suite, name, suite.must_be_bound(name, "an idle GPU is left for each filler"))
    shared = suite.scheduled_pod("shared", suite.request(share=0.3, mode=SM_SHARING))
    snap = suite.watch.wait_bound(shared, suite.timeout(3.0))
    if snap is not None:
        gpus = gpus_at_bind(suite, shared, snap)
        overlap = sorted(set(gpus) & set(sliced_gpus))
        if overlap:
            raise fail(
                f"{shared} (sm-sharing) was placed on GPU {', '.join(overlap)} beside {sliced} "
                "(time-slicing) [mode-mixing]"
            )
    modes_must_not_mix(suite)


@check(
    id="modes-side-by-side",
    level="SHOULD",
    statement=(
        "A node with free GPUs SHOULD run time-slicing and sm-sharing workloads at once, on different GPUs."
    ),
    profiles=("scheduler",),
    features=("sm-sharing",),
    seed="003/4",
    needs=Needs(nodes=1, gpus=2, idle=True),
)
def test_modes_side_by_side(suite: Suite) -> None:
    sliced = suite.scheduled_pod("sliced", suite.request(share=0.3, mode=TIME_SLICING))
    sliced_gpus = gpus_at_bind(suite, sliced, suite.must_be_bound(sliced, "it asks for 0.3 of an idle GPU"))
    shared = suite.scheduled_pod("shared", suite.request(share=0.3, mode=SM_SHARING))
    shared_gpus = gpus_at_bind(
        suite,
        shared,
        suite.must_be_bound(shared, f"the node has {suite.node.gpu_count - 1} other idle GPU(s)"),
    )
    if set(shared_gpus) & set(sliced_gpus):
        raise fail(f"{shared} (sm-sharing) shares a GPU with {sliced} (time-slicing) [mode-mixing]")
    modes_must_not_mix(suite)

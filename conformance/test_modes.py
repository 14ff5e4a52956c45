"""Compute modes: time-slicing and sm-sharing never share a GPU; a node may run both on different GPUs.

The mode is tracked per GPU, not per node. The MUST check stages GPUs so that each Pod it then
asks for can only be placed by mixing: sm-sharing where only a time-slicing GPU has room,
time-slicing (asked for, and by default: a Pod with no mode) where only sm-sharing GPUs have room,
and Pods of two GPUs where only one GPU with room has their mode (the separation holds on every
device). A correct scheduler leaves them all Pending, and a mixing one is caught whatever its
packing policy.

Every device of a multi-device Pod, whatever the order a scheduler considers GPUs in: a scheduler
that checks the mode of one GPU it picks (the first, or the last) and not the others is caught
only where that GPU is the one with the right mode. So the check ends with exactly two GPUs with
room for a pair, one time-slicing and one sm-sharing, and asks for a time-slicing pair and an
sm-sharing pair: each has one compatible GPU, a different one. Whatever the order (by index, by
UUID, by free memory, either way round), the compatible GPU comes first for one pair and last for
the other, so checking any single GPU of the two lets one pair mix.
"""

from __future__ import annotations

import math
from typing import Final

from conformance.expect import gpus_at_bind
from enforcement.contract import SM_SHARING, TIME_SLICING, node_gpu_uuids
from fixtures.suite.checks import Needs, check
from fixtures.suite.frame import Suite, fail

PAIR_SHARE: Final = 0.08
"""Each device of the pairs: fits a GPU at 0.85 or 0.5 guaranteed (within a 5 % reserve), not one at
0.95."""


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
    statement="Time-slicing and sm-sharing workloads MUST NOT be placed on the same GPU, either way "
    "round, on every GPU a multi-device Pod gets; a Pod that asks for no mode is time-slicing.",
    profiles=("scheduler",),
    features=("sm-sharing",),
    seed="003/4",
    needs=Needs(nodes=1, gpus=2, idle=True),
)
def test_mode_separation(suite: Suite) -> None:
    # The node only fills up, so a Pod that cannot be placed without mixing when it is made can
    # never be placed later in the check; all of them are judged after one window. Sizes are
    # shares of a GPU and fit within the contract's 5 % reserve wherever the text says "fits".
    count = suite.node.gpu_count
    multi = suite.options.claims("multi-device")
    # 1. sm-sharing on all GPUs but one (0.5 each): one Pod across them where multi-device is supported.
    if multi:
        sm_pods = [
            suite.scheduled_pod("sm-most", suite.request(share=0.5, mode=SM_SHARING, num_devices=count - 1))
        ]
    else:
        sm_pods = [
            suite.scheduled_pod(f"sm-{i}", suite.request(share=0.5, mode=SM_SHARING))
            for i in range(count - 1)
        ]
    sm_gpus: set[str] = set()
    for name in sm_pods:
        sm_gpus |= set(
            gpus_at_bind(suite, name, suite.must_be_bound(name, f"the node has {count} idle GPUs"))
        )
    # 2. Two time-slicing GPUs for one Pod: only one GPU is not sm-sharing, so only mixing on one
    #    of its devices could place it.
    if multi:
        pair = suite.scheduled_pod(
            "ts-pair", suite.request(share=PAIR_SHARE, mode=TIME_SLICING, num_devices=2)
        )
        suite.must_not_be_placed(
            pair,
            f"it asks for 2 time-slicing GPUs and only one GPU of the node is not sm-sharing "
            f"(the others hold {', '.join(sm_pods)})",
            "mode-mixing",
        )
    else:
        suite.not_judged(
            "every device of a multi-device Pod", "the implementation does not claim multi-device"
        )
    # 3. Time-slicing on the one GPU left (0.05): it must not join an sm-sharing GPU.
    sliced = suite.scheduled_pod("sliced", suite.request(share=0.05, mode=TIME_SLICING))
    sliced_gpus = gpus_at_bind(suite, sliced, suite.must_be_bound(sliced, "one GPU of the node is idle"))
    joined = sorted(set(sliced_gpus) & sm_gpus)
    if joined:
        raise fail(
            f"{sliced} (time-slicing) was placed on GPU {', '.join(joined)} beside sm-sharing "
            f"{', '.join(sm_pods)} though GPU(s) without sm-sharing had room [mode-mixing]"
        )
    # 4. sm-sharing too large for the sm-sharing GPUs (0.5 + 0.6): only the time-slicing GPU has room.
    shared = suite.scheduled_pod("sm-onto-ts", suite.request(share=0.6, mode=SM_SHARING))
    suite.must_not_be_placed(
        shared,
        f"it asks for sm-sharing and the only GPU with room for it runs time-slicing ({sliced})",
        "mode-mixing",
    )
    # 5. Fill the time-slicing GPU (0.05 + 0.8): from now on only the sm-sharing GPUs have room.
    fill = suite.scheduled_pod("ts-fill", suite.request(share=0.8, mode=TIME_SLICING))
    gpus_at_bind(suite, fill, suite.must_be_bound(fill, f"0.8 fits beside {sliced}'s 0.05 on its GPU"))
    # 6. Time-slicing, asked for and by default, where only sm-sharing GPUs have room (0.5 + 0.3).
    sliced_late = suite.scheduled_pod("ts-onto-sm", suite.request(share=0.3, mode=TIME_SLICING))
    suite.must_not_be_placed(
        sliced_late, "it asks for time-slicing and only sm-sharing GPUs have room for it", "mode-mixing"
    )
    unmoded = suite.scheduled_pod("no-mode-onto-sm", suite.request(share=0.3))
    suite.must_not_be_placed(
        unmoded,
        "it asks for no mode, which is time-slicing, and only sm-sharing GPUs have room for it",
        "mode-mixing",
    )
    # 7. (multi-device) Every sm-sharing GPU but one filled to 0.95 (0.5 + 0.45): then exactly two GPUs
    #    have room for a pair, the time-slicing one (0.85) and one sm-sharing (0.5). The time-slicing
    #    pair's compatible GPU is the first, the sm-sharing pair's the second: one of them comes first
    #    and the other last in any order a scheduler considers GPUs in.
    if multi:
        _stage_the_pairs(suite, sm_gpus, [sliced, fill])
    suite.evidence.fact(
        "staged",
        {
            "smSharingGpus": sorted(sm_gpus),
            "timeSlicingGpu": sliced_gpus,
            "notPlaceable": list(suite.unplaceable),
        },
    )
    try:
        suite.must_stay_unbound()
    finally:
        modes_must_not_mix(suite)


def _stage_the_pairs(suite: Suite, sm_gpus: set[str], time_slicing_pods: list[str]) -> None:
    """Fill every sm-sharing GPU but one, then ask for an sm-sharing pair: with the time-slicing pair
    still pending, each pair has one GPU of its mode among the only two with room for it."""
    count = suite.node.gpu_count
    fills = [
        suite.scheduled_pod(f"sm-fill-{i}", suite.request(share=0.45, mode=SM_SHARING))
        for i in range(count - 2)
    ]
    for name in fills:
        got = gpus_at_bind(
            suite, name, suite.must_be_bound(name, "sm-sharing GPUs of the node have 0.5 free")
        )
        if not set(got) <= sm_gpus:
            raise fail(
                f"{name} (sm-sharing) was placed on GPU {', '.join(got)}, not on one of the sm-sharing GPUs "
                f"{', '.join(sorted(sm_gpus))} [mode-mixing]"
            )
    memory = suite.node.memory_mib
    need = math.ceil(memory * PAIR_SHARE)
    node = suite.cluster.read_node(suite.node.name) or {}
    order = list(node_gpu_uuids(node))
    with_room = {gpu: load for gpu, load in suite.loads_on().items() if memory - load.request_mib >= need}
    room = {
        gpu: {
            "modes": sorted(load.modes),
            "unguaranteedMiB": memory - load.request_mib,
            "index": order.index(gpu) if gpu in order else (int(gpu) if gpu.isdigit() else None),
        }
        for gpu, load in with_room.items()
    }
    suite.evidence.fact("roomForAPair", {"needMiB": need, "gpus": room})
    modes = sorted(tuple(sorted(load.modes)) for load in with_room.values())
    if modes != [(SM_SHARING,), (TIME_SLICING,)]:
        suite.not_judged(
            "every device of a multi-device Pod, in either order",
            f"the staging left {len(room)} GPU(s) with room ({need} MiB) for a pair, not one time-slicing "
            f"and one sm-sharing: {room}",
        )
        return
    ts_gpu = next(g for g, load in with_room.items() if load.modes == {TIME_SLICING})
    sm_gpu = next(g for g, load in with_room.items() if load.modes == {SM_SHARING})
    pair = suite.scheduled_pod("sm-pair", suite.request(share=PAIR_SHARE, mode=SM_SHARING, num_devices=2))
    suite.must_not_be_placed(
        pair,
        f"it asks for 2 sm-sharing GPUs and only two GPUs have room for it: {sm_gpu} (sm-sharing) and "
        f"{ts_gpu} (time-slicing: {', '.join(time_slicing_pods)} run there)",
        "mode-mixing",
    )
    suite.evidence.fact(
        "pairs",
        {
            "ts-pair": {"compatible": ts_gpu, "otherWithRoom": sm_gpu},
            "sm-pair": {"compatible": sm_gpu, "otherWithRoom": ts_gpu},
            "why": "the compatible GPU comes first for one pair and last for the other in any order",
        },
    )


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

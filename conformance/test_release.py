"""Release: when a workload exits or dies, its memory and its guarantee are free at once for the next one.

docs/contract.md §5-6. A container that ends, normally or by crashing, must leave nothing behind
on its GPU: not the memory it held (a dead process frees nothing itself) and not its place on the
GPU (its guarantee, and the compute mode it held the GPU in). So the next workload on the same GPU
gets the whole of its own guarantee at its first allocation, without retrying, even in the other
compute mode, which a GPU still counting the old container would refuse.

Two GPUs, side by side: on one the first workload exits normally, on the other it dies (a device
fault ends its process with its memory still allocated). Each holds 0.6 of its GPU, so the next
workload's 0.6 fits only where the old one's was released.
"""

from __future__ import annotations

import time
from typing import Final

from conformance.judgements import within
from enforcement.contract import SM_SHARING, TIME_SLICING, Mode
from fixtures.suite.checks import Needs, check
from fixtures.suite.frame import Suite, fail
from fixtures.suite.scenario import NotJudged, Stage, plan, require
from fixtures.suite.waiting import WaitTimeout
from workloads.plan import alloc, fault, meminfo, touch

SHARE: Final = 0.6
ENDED: Final = {"exits": "exited", "dies": "died"}
NEXT_START_S: Final = 10.0
"""How long the next workload may take to start and allocate before the release counts as not done."""


@check(
    id="release-on-exit",
    level="MUST",
    statement="When a workload exits or dies, its GPU memory and its guarantee MUST be free at once: "
    "the next workload on that GPU gets its whole guarantee at its first allocation, in either compute mode.",
    profiles=("node", "stack", "probe"),
    seed="000/4",
    needs=Needs(nodes=1, gpus=2, idle=True),
)
def test_release_on_exit(suite: Suite) -> None:
    stage = Stage(suite, gpus=2)
    size = stage.mib(SHARE)
    held = within(size)  # the guarantee less the headroom a real GPU's context and pages take
    first = {
        "exits": plan("exits", alloc(held), touch()),
        "dies": plan("dies", alloc(held), touch(), fault()),
    }
    old = {
        how: stage.place(f"{how}", steps, request_mib=size, mode=TIME_SLICING, slot=slot)
        for slot, (how, steps) in enumerate(first.items())
    }
    ended = {how: stage.wait_ended(p.name) for how, p in old.items()}
    require(ended["exits"], ("ok",), f"it allocates {size} MiB within its guarantee and exits")
    require(ended["dies"], ("fault-injected",), "its fault step faults the device and ends the process")
    # The next ones ask for the other mode where the implementation has it: a GPU that still
    # counts the old container (time-slicing) would refuse them.
    mode: Mode = SM_SHARING if "sm-sharing" in suite.options.supported_features else TIME_SLICING
    following = plan("next", alloc(held), touch(), meminfo())
    after = {
        how: stage.pod(f"after-{how}", following, request_mib=size, mode=mode, slot=slot)
        for slot, how in enumerate(first)
    }
    placed_after = {how: stage.placed(name) for how, name in after.items()}
    deadline = time.monotonic() + suite.timeout(NEXT_START_S)
    problems = []
    late: dict[str, str] = {}
    seen = {}
    for how, name in after.items():
        placed = placed_after[how]
        try:
            # A node that refuses the next container (it still counts the old one) fails here at
            # once (``Stage`` turns a refusal of a valid placement into the node's failure).
            out = stage.wait_ended(
                name, timeout=max(0.1, deadline - time.monotonic()) / suite.options.timeout_scale
            )
        except WaitTimeout:
            # Neither refused nor ended in time: a start this slow shows nothing about the release
            # (the node never said no), so it is not judged, never a failure.
            late[name] = (
                f"{name} ({size} MiB, {mode}) was neither refused nor done within "
                f"{suite.timeout(NEXT_START_S):.0f} s on GPU {', '.join(placed.gpus)} after the workload "
                f"there {ENDED[how]}: {suite.describe(name)}"
            )
            continue
        seen[name] = {
            "after": how,
            "gpus": list(placed.gpus),
            "exit": out.as_dict(),
            "alloc": out.step("alloc"),
        }
        if out.status != "ok":
            step = out.step("alloc")
            problems.append(
                f"{name} could not take its {size} MiB guarantee on GPU {', '.join(placed.gpus)} after the "
                f"workload there {ENDED[how]}: {out.status} "
                f"({(step.get('oom') or step.get('pressure') or {}).get('message') or out.reason})"
            )
    suite.evidence.fact("next", seen)
    for name, text in late.items():
        suite.not_judged(f"the release before {name}", text)
    if problems:
        raise fail("; ".join(problems))
    if late:
        raise NotJudged(
            "the next workload did not start in time, so the release was not judged: "
            + "; ".join(late.values())
        )

"""The density ramp: 1, 2, 4, 8, ... workloads sharing one GPU, measured step by step.

docs/contract.md §8, the last step of seed 000's rollout path: "raise the number of sharing
workloads step by step while recording memory, compute use, latency and failure rate". Each step
starts N workloads at once on one GPU, each holding its guarantee and running kernels; it records
the memory they held, the kernel throughput of the GPU, each workload's start latency (from the
Pod's creation to its first step) and the failures. The ramp stops at the first step with a
failure, or when the next step's guarantees would no longer fit the GPU. The readings are the
evidence for the report's density curve; the check fails (SHOULD) when a step whose guarantees fit
had failures.

Only the ``stack`` profile: how many tenants one GPU takes is a question for the whole stack.
Through the scheduler the stage's fillers run in the other compute mode (where sm-sharing is
supported), so even small workloads can share only the GPU left free.
"""

from __future__ import annotations

import time
from typing import Any, Final

from conformance.judgements import kernel_rates, within
from enforcement.contract import SM_SHARING, TIME_SLICING
from fixtures.suite.checks import Needs, check
from fixtures.suite.frame import CheckFailed, Suite, fail
from fixtures.suite.scenario import Outcome, Stage, plan
from workloads.plan import MiB, alloc, compute, touch

SHARE_WITH_MODES: Final = 0.1
"""Each workload's guarantee where the fillers keep it off their GPUs by mode: 1, 2, 4, 8 fit."""
SHARE_BY_CAPACITY: Final = 0.25
"""Without sm-sharing the fillers keep others away by capacity only: workloads must exceed 0.2."""
COMPUTE_S: Final = 0.5
KERNEL_MS: Final = 20


def reading(count: int, outcomes: list[Outcome], created: dict[str, float], share_mib: int) -> dict[str, Any]:
    ok = [o for o in outcomes if o.status == "ok"]
    latencies = []
    for o in outcomes:
        started = (o.result or {}).get("started_at")
        if started is not None:
            latencies.append(max(0.0, float(started) - created[o.name]))
    rates = [float(o.step("compute").get("kernels_per_s") or 0) for o in ok]
    # The GPU's throughput: every kernel of the step over the time from the first start to the last end
    # (summing each workload's own rate would count the times they ran alone twice).
    gpu_rate = kernel_rates([o.step("compute") for o in ok if o.step("compute")])
    return {
        "workloads": count,
        "guaranteedMiB": count * share_mib,
        "heldMiB": sum(int(o.step("alloc").get("bytes") or 0) for o in ok) // MiB,
        "kernelsPerS": gpu_rate,
        "kernelsPerSEach": round(sum(rates) / len(rates), 2) if rates else 0.0,
        "startLatencyS": {
            "max": round(max(latencies), 3) if latencies else None,
            "mean": round(sum(latencies) / len(latencies), 3) if latencies else None,
        },
        "failures": {o.name: o.status or o.phase for o in outcomes if o.status != "ok"},
    }


@check(
    id="density-ramp",
    level="SHOULD",
    statement="One GPU SHOULD run 1, 2, 4, 8, ... sharing workloads, up to as many as its guarantees hold, "
    "without failures; memory held, kernel throughput, start latency and failures are recorded per step.",
    profiles=("stack",),
    seed="000/4",
    needs=Needs(nodes=1, gpus=1, idle=True),
)
def test_density_ramp(suite: Suite) -> None:
    with_modes = "sm-sharing" in suite.options.supported_features
    stage = Stage(suite, filler_mode=SM_SHARING if with_modes else None)
    share = SHARE_WITH_MODES if with_modes else SHARE_BY_CAPACITY
    size = stage.mib(share)
    work = plan(
        "tenant",
        alloc(within(size)),
        touch(),
        compute(COMPUTE_S, kernel_ms=KERNEL_MS),
    )
    readings: list[dict[str, Any]] = []
    count = 1
    stopped = ""
    while True:
        created: dict[str, float] = {}
        names = []
        for i in range(count):
            name = f"step{count}-{i}"
            created[name] = time.time()
            names.append(stage.pod(name, work, request_mib=size, mode=TIME_SLICING))
        try:
            gpus = {gpu for name in names for gpu in stage.placed(name).gpus}
        except CheckFailed as exc:
            suite.evidence.fact("rampStopped", f"the step of {count} workloads was not placed")
            raise fail(
                f"the step of {count} workloads of {size} MiB (guarantees {count * size} of "
                f"{stage.memory_mib} MiB, which fit one GPU) was not placed: {exc}"
            ) from None
        outcomes = [stage.wait_ended(name) for name in names]
        step = reading(count, outcomes, created, size)
        step["gpus"] = sorted(gpus)
        readings.append(step)
        suite.evidence.fact("ramp", readings)
        suite.evidence.fact(
            "densityRamp",
            [
                {"pods": r["workloads"], "seconds": r["startLatencyS"]["max"], "throughput": r["kernelsPerS"]}
                for r in readings
            ],
        )
        if step["failures"]:
            stopped = f"failures at {count} workloads"
            break
        if (2 * count) * share > 1.0:
            stopped = f"the guarantees of {2 * count} workloads of {share} would not fit the GPU"
            break
        count *= 2
    suite.evidence.fact("rampStopped", stopped)
    failed = readings[-1]["failures"]
    if failed:
        raise fail(
            f"with {readings[-1]['workloads']} workloads of {size} MiB sharing one GPU (guarantees "
            f"{readings[-1]['guaranteedMiB']} of {stage.memory_mib} MiB): "
            + ", ".join(f"{n} {s}" for n, s in failed.items())
        )

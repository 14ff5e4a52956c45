"""A workload stuck in a step the implementation controls is named from its progress lines
(``fixtures.suite.scenario.stuck_step``): the node's failure with the step, not a suite timeout."""

from __future__ import annotations

import io

from fixtures.suite.scenario import DEVICE_STEPS, stuck_step
from workloads.allocate import Runner
from workloads.backends import NoDevice
from workloads.plan import parse_plan

PREFIX = "gpuconf-workload (simulated H200):"


def test_the_step_begun_and_never_ended_is_the_one_it_is_stuck_in() -> None:
    log = "\n".join(
        [
            f"{PREFIX} plan 'capped', 3 step(s); devices [0: H200 1024 MiB]",
            f"{PREFIX} step 1/3: alloc ...",
            f"{PREFIX} step 1: alloc ok as expected (3.1 ms): bytes=1048576",
            f"{PREFIX} step 2/3: alloc-until-oom ...",
        ]
    )
    assert stuck_step(log) == (2, 3, "alloc-until-oom", f"{PREFIX} step 2/3: alloc-until-oom ...")
    assert "alloc-until-oom" in DEVICE_STEPS and "heartbeat" not in DEVICE_STEPS


def test_a_finished_plan_or_no_log_shows_no_stuck_step() -> None:
    assert stuck_step(None) is None and stuck_step("") is None
    out = io.StringIO()
    Runner(
        parse_plan([{"op": "ready", "path": "/dev/null"}]),
        NoDevice("no GPU here"),
        out,
        install_signal_handlers=False,
    ).run()
    assert "step 1/1: ready ..." in out.getvalue() and stuck_step(out.getvalue()) is None

"""Restart decisions, backoff and terminated reasons of the simulated kubelet."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fixtures.sandbox.noderuntime.policy import (
    AGENT_RETRY,
    CRASH_BACKOFF,
    Backoff,
    exit_code_of,
    should_restart,
    should_restart_init,
    terminated_reason,
    workload_reported_oom,
)
from workloads.report import RESULT_SCHEMA, ExitCode


@pytest.mark.parametrize(
    ("policy", "code", "restart"),
    [
        ("Always", 0, True),
        ("Always", 1, True),
        ("OnFailure", 0, False),
        ("OnFailure", 137, True),
        ("Never", 0, False),
        ("Never", 2, False),
    ],
)
def test_restart_policy(policy: str, code: int, restart: bool) -> None:
    assert should_restart(policy, code) is restart


@pytest.mark.parametrize(
    ("policy", "code", "restart"),
    [("Always", 0, False), ("Always", 1, True), ("OnFailure", 1, True), ("Never", 1, False)],
)
def test_init_containers_restart_only_on_failure_unless_never(policy: str, code: int, restart: bool) -> None:
    assert should_restart_init(policy, code) is restart


def test_signals_become_128_plus_n() -> None:
    assert exit_code_of(0) == (0, None)
    assert exit_code_of(3) == (3, None)
    assert exit_code_of(-15) == (143, 15)
    assert exit_code_of(-9) == (137, 9)


def test_backoff_doubles_up_to_its_cap() -> None:
    assert [CRASH_BACKOFF.delay(n) for n in range(0, 7)] == [0.0, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert [AGENT_RETRY.delay(n) for n in (1, 2, 5)] == [0.5, 1.0, 5.0]


def test_a_long_run_resets_the_backoff() -> None:
    b = Backoff(initial_s=1, cap_s=10, reset_after_s=60)
    assert b.next_failures(3, ran_s=1.0) == 4
    assert b.next_failures(3, ran_s=60.0) == 1


@given(st.integers(min_value=1, max_value=200))
def test_backoff_never_exceeds_the_cap_and_never_shrinks(failures: int) -> None:
    assert 0 < CRASH_BACKOFF.delay(failures) <= CRASH_BACKOFF.cap_s
    assert CRASH_BACKOFF.delay(failures + 1) >= CRASH_BACKOFF.delay(failures)


def _result(code: ExitCode) -> str:
    return json.dumps({"gpuconf_workload": RESULT_SCHEMA, "status": code.status, "exit_code": int(code)})


def test_reason_completed_and_error() -> None:
    assert terminated_reason(0, "") == "Completed"
    assert terminated_reason(1, "") == "Error"
    assert terminated_reason(137, "") == "Error"


def test_oomkilled_needs_the_workload_to_say_so() -> None:
    oom = int(ExitCode.UNEXPECTED_OOM)
    assert terminated_reason(oom, _result(ExitCode.UNEXPECTED_OOM)) == "OOMKilled"
    assert not workload_reported_oom(oom, "")  # the exit code alone is not enough
    assert not workload_reported_oom(oom, "not json")
    assert not workload_reported_oom(oom, json.dumps({"exit_code": oom}))  # not the workload's result
    assert not workload_reported_oom(oom, _result(ExitCode.ERROR))  # result and exit code disagree
    # An expected OOM is a plan that went as written, not a termination by OOM.
    assert terminated_reason(int(ExitCode.EXPECTED_OOM), _result(ExitCode.EXPECTED_OOM)) == "Error"

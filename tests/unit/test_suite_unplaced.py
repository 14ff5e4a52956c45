"""Pods that must not be placed: one window per check, sized from the scheduler's retry period, and
a never-bound judgement that sees a binding at any moment of the check (``fixtures.suite.frame``).

The Suite runs here on a Pod watch whose events the test writes itself, so the verdicts are
judged without a cluster, and without waiting: every recorded Pod is dated well in the past.
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from fixtures.suite.checks import Check
from fixtures.suite.evidence import Evidence
from fixtures.suite.frame import CheckFailed, RunOptions, Suite, Unplaceable
from fixtures.suite.podwatch import PodWatch, _snapshot


def options(**kw: Any) -> RunOptions:
    return RunOptions(
        scheduler_name="s", profiles=("scheduler",), supported_features=frozenset(), run_id="r", **kw
    )


def suite(opts: RunOptions | None = None) -> tuple[Suite, PodWatch]:
    watch = PodWatch.__new__(PodWatch)
    watch._events, watch._cond, watch.gaps = [], threading.Condition(), []
    check = Check(id="x", level="MUST", statement="x MUST hold", profiles=("scheduler",), capability="t")
    box = Suite(
        cluster=SimpleNamespace(),  # type: ignore[arg-type]
        options=opts or options(retry_period_s=0.5),
        check=check,
        profile="scheduler",
        form=None,
        namespace="ns",
        nodes=[],
        evidence=Evidence("scheduler/x", None),
        watch=watch,
    )
    return box, watch


def seen(watch: PodWatch, name: str, node: str = "") -> None:
    pod = {"metadata": {"name": name, "resourceVersion": "1"}, "spec": {"nodeName": node}}
    watch._add(_snapshot("MODIFIED", pod))


def record(box: Suite, name: str, ago: float = 100.0) -> None:
    box.unplaceable[name] = Unplaceable(name, "it fits nowhere", "gpu-overcommit", time.time() - ago)


@pytest.mark.parametrize(
    ("opts", "window"),
    [
        (options(retry_period_s=0.5), 4.0),  # the sandbox's: 3 s + two periods of 0.5 s
        (options(retry_period_s=0.5, timeout_scale=2.0), 8.0),
        (options(), 13.0),  # declared nowhere: the 5 s default
        (options(scheduler_implementation="gpuconf-reference"), 23.0),  # its retryPeriodSeconds: 10
    ],
)
def test_the_window_is_quiet_time_plus_two_retry_periods(opts: RunOptions, window: float) -> None:
    assert suite(opts)[0].unbound_window_s() == pytest.approx(window)


def test_one_window_judges_every_recorded_pod_and_names_the_rule() -> None:
    box, watch = suite()
    record(box, "a")
    record(box, "b")
    seen(watch, "b", "node-1")
    with pytest.raises(
        CheckFailed, match=r"^b was bound to node node-1 .* but it fits nowhere \[gpu-overcommit\]$"
    ):
        box.must_stay_unbound()
    seen(watch, "b")  # unbound again: the binding stays on record
    with pytest.raises(CheckFailed, match="^b was bound"):
        box.placed_must_never_have_been_bound()


def test_a_binding_after_the_window_is_caught_at_the_checks_end() -> None:
    box, watch = suite()
    record(box, "late")
    box.must_stay_unbound()  # nothing yet
    seen(watch, "late", "node-1")
    with pytest.raises(CheckFailed, match=r"^late was bound .*\[gpu-overcommit\]"):
        box.placed_must_never_have_been_bound()


def test_waiting_for_another_pod_fails_at_once_when_a_recorded_one_is_bound() -> None:
    box, watch = suite()
    record(box, "never")
    seen(watch, "never", "node-1")
    started = time.monotonic()
    with pytest.raises(CheckFailed, match=r"^never was bound"):
        box.must_be_bound("other", "it fits", timeout=30)
    assert time.monotonic() - started < 5

"""The workload's plan parser: sizes, steps, and the refusals that catch a broken check early."""

from __future__ import annotations

import pytest

from workloads.plan import (
    AllocStep,
    AllocUntilOomStep,
    ComputeStep,
    CudaDevicesStep,
    FreeStep,
    HeartbeatStep,
    HoldStep,
    PlanError,
    Until,
    parse_bytes,
    parse_plan,
)

MiB = 1 << 20


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, 0),
        (4096, 4096),
        ("4096", 4096),
        ("512Mi", 512 * MiB),
        ("1Gi", 1 << 30),
        ("1.5Gi", 3 << 29),
        ("1G", 10**9),
        ("100M", 10**8),
        ("2k", 2000),
        ("1Ti", 1 << 40),
    ],
)
def test_sizes_are_bytes_or_quantities(value: object, expected: int) -> None:
    assert parse_bytes(value, "x") == expected


@pytest.mark.parametrize("value", [-1, "1 Gi", "1GB", "Gi", "", True, 1.5, None, "-1Mi", " 1Mi"])
def test_anything_else_is_not_a_size(value: object) -> None:
    with pytest.raises(PlanError, match="^x: "):
        parse_bytes(value, "x")


def test_a_plan_is_an_object_with_steps_or_just_the_list() -> None:
    plan = parse_plan('{"name": "holder", "steps": [{"op": "alloc", "bytes": "1Gi", "chunk": "256Mi"}]}')
    assert plan.name == "holder"
    assert plan.steps == (AllocStep(nbytes=1 << 30, chunk=256 * MiB),)
    assert parse_plan([{"op": "free"}]).steps == (FreeStep(),)


def test_defaults_and_every_op_parse() -> None:
    plan = parse_plan(
        [
            {
                "op": "alloc",
                "bytes": 100,
                "chunk": 1000,
                "expect": "oom",
                "label": "a",
                "retry_on_pressure": 5,
            },
            {"op": "alloc-until-oom", "granularity": "2Mi", "limit": "1Gi", "device": 1},
            {"op": "touch", "label": "a"},
            {"op": "hold", "seconds": 1.5, "until_file": "/tmp/go", "until_signal": "SIGUSR1"},
            {"op": "heartbeat", "interval": 0.1, "count": 3},
            {"op": "meminfo"},
            {"op": "cuda-devices"},
            {"op": "smi", "expect": "any"},
            {"op": "compute", "seconds": 2, "kernel_ms": 10},
            {"op": "free", "label": "a"},
            {"op": "fault", "device": 0},
        ]
    )
    alloc, until_oom, _touch, hold, beat, _mem, cuda, smi, compute, _free, _fault = plan.steps
    assert cuda == CudaDevicesStep()
    assert alloc == AllocStep(nbytes=100, chunk=100, label="a", expect="oom", retry_on_pressure_s=5.0)
    assert until_oom == AllocUntilOomStep(granularity=2 * MiB, device=1, limit=1 << 30)
    assert hold == HoldStep(until=Until(seconds=1.5, file="/tmp/go", signal="SIGUSR1"))
    assert beat == HeartbeatStep(until=Until(count=3), interval_s=0.1)
    assert smi.expect == "any"
    assert compute == ComputeStep(seconds=2.0, kernel_s=0.01)
    assert plan.awaited_signals == frozenset({"SIGUSR1"})


@pytest.mark.parametrize(
    ("plan", "match"),
    [
        ("{", "not JSON"),
        ([], "non-empty list"),
        ({"steps": [{"op": "free"}], "nme": "x"}, r"unknown key\(s\) nme"),
        ([{"op": "malloc"}], r"steps\[0\]\.op: 'malloc' is not one of"),
        ([{"bytes": 1}], r"steps\[0\]\.op"),
        ([{"op": "alloc"}], r"steps\[0\]\(alloc\)\.bytes: required"),
        ([{"op": "alloc", "byte": 1}], r"bytes: required"),
        ([{"op": "alloc", "bytes": 1, "byte": 1}], r"unknown key\(s\) byte"),
        ([{"op": "alloc", "bytes": 0}], "at least 1 bytes"),
        ([{"op": "alloc", "bytes": 1, "expect": "crash"}], "one of ok, oom, pressure, any"),
        ([{"op": "touch", "expect": "oom"}], "one of ok, any"),
        ([{"op": "fault", "expect": "any"}], "one of ok"),
        ([{"op": "hold"}], "at least one of seconds, until_file, until_signal"),
        ([{"op": "hold", "count": 2}], "only heartbeat counts beats"),
        ([{"op": "hold", "until_signal": "SIGKILL"}], "until_signal"),
        ([{"op": "heartbeat", "count": 1, "interval": 0}], "interval"),
        ([{"op": "compute"}], "seconds: required"),
        ([{"op": "alloc", "bytes": 1, "device": -1}], "device"),
        ([{"op": "alloc", "bytes": 1, "device": True}], "device"),
        ([{"op": "free"}, "free"], r"steps\[1\]: expected an object"),
    ],
)
def test_mistakes_are_refused_with_the_path_of_the_value(plan: object, match: str) -> None:
    with pytest.raises(PlanError, match=match):
        parse_plan(plan)  # type: ignore[arg-type]

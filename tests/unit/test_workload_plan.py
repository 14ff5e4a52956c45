"""The workload's plan parser: sizes, steps, and the refusals that catch a broken check early."""

from __future__ import annotations

from typing import Any

import pytest

from workloads import plan as steps
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


# ---- typed steps to JSON (plan_wire, the builders): what a check writes is what the workload reads


BUILT = [
    steps.alloc(256, label="guarantee"),
    steps.alloc(512, chunk_mib=64, device=1, expect="oom", retry_on_pressure_s=5.0, retry_on_oom_s=2.5),
    steps.search_boundary(),
    steps.search_boundary(granularity_mib=2, device=1, label="grown", limit_mib=4096),
    steps.touch(),
    steps.touch("guarantee"),
    steps.verify("guarantee"),
    steps.free("borrowed", expect="any"),
    steps.meminfo(),
    steps.cuda_devices(),
    steps.smi(),
    steps.ready(),
    steps.read_env("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES"),
    steps.fault(1),
    steps.hold(until_signal="SIGTERM"),
    steps.hold(seconds=2.5, until_file="/tmp/go"),
    steps.heartbeat(0.1, until_signal="SIGTERM"),
    steps.heartbeat(0.25, count=3),
    steps.compute(1.5, kernel_ms=100, matrix="calibrated"),
    steps.compute(0.75, matrix=1024, device=1),
    steps.calibrate(),
    steps.calibrate(seconds=0.3, kernel_ms=10),
]


@pytest.mark.parametrize("step", BUILT, ids=lambda s: s.OP)
def test_every_built_step_reads_back_as_itself(step: Any) -> None:
    wire = steps.plan_wire("p", step)
    assert steps.parse_plan(wire).steps == (step,)


def test_the_json_says_only_what_differs_from_the_defaults() -> None:
    wire = steps.plan_wire(
        "holder",
        steps.alloc(256, label="guarantee"),
        steps.touch(),
        steps.ready(),
        steps.heartbeat(0.1, until_signal="SIGTERM"),
        steps.compute(1.5, kernel_ms=100, matrix="calibrated"),
    )
    assert wire == {
        "name": "holder",
        "steps": [
            {"op": "alloc", "bytes": 256 * MiB, "label": "guarantee"},
            {"op": "touch"},
            {"op": "ready"},
            {"op": "heartbeat", "until_signal": "SIGTERM", "interval": 0.1},
            {"op": "compute", "seconds": 1.5, "kernel_ms": 100.0, "matrix": "calibrated"},
        ],
    }


@pytest.mark.parametrize(
    ("step", "words"),
    [
        (steps.hold(), "give at least one of"),
        (steps.alloc(0), "must be at least 1 bytes"),
        (steps.compute(0.0), "seconds"),
        (steps.alloc(1, expect="pressure-ish"), "expect"),
    ],
    ids=["hold-for-nothing", "alloc-nothing", "compute-no-time", "unknown-expectation"],
)
def test_a_step_the_workload_would_refuse_is_refused_where_the_check_builds_it(step: Any, words: str) -> None:
    with pytest.raises(PlanError, match=words):
        steps.plan_wire("bad", step)

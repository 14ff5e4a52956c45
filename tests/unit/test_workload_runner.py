"""The workload's decisions, backend-independent: run against a fake backend in process.

Everything the runner decides (expected or not, continue or stop, exit code, what an OOM record
holds, how the search for the largest allocation behaves, how waits end) is exercised here without
a device, so the CuPy backend, which cannot run on this machine, shares all of this logic.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import signal
import stat
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workloads import allocate
from workloads.allocate import Runner
from workloads.backends import (
    BackendUnavailable,
    ClientGone,
    DeviceFault,
    DeviceInfo,
    KernelSpan,
    MemState,
    OutOfMemory,
    PressureRefused,
)
from workloads.plan import parse_plan
from workloads.report import ExitCode

MiB = 1 << 20
GiB = 1 << 30


class FakeBackend:
    """A device with fixed capacities and no fragmentation, and switches to misbehave on cue."""

    name = "fake"
    simulated = True
    work_unit = "kernel-seconds"

    def __init__(self, *capacities: int, pressure_refusals: int = 0) -> None:
        self.capacity = list(capacities or (GiB,))
        self.used = [0] * len(self.capacity)
        self.handles: dict[int, tuple[int, int]] = {}
        self.touched: set[int] = set()
        self.written: dict[int, int] = {}  # handle -> the byte its memory holds
        self.calls: Counter[str] = Counter()
        self.pressure_refusals = pressure_refusals
        self.fault_on_meminfo: int | None = None  # fault on the n-th meminfo call
        self.gone_on_meminfo: int | None = None
        self.faulted = False

    def describe(self) -> dict[str, Any]:
        return {"node": "fake-node", "client": "ns/fake/c", "mode": "time-slicing"}

    def devices(self) -> list[DeviceInfo]:
        return [DeviceInfo(i, f"GPU-fake-{i}", "Fake GPU", c) for i, c in enumerate(self.capacity)]

    def _check(self) -> None:
        if self.faulted:
            raise DeviceFault("illegal address (fake, sticky)", "fake-fault")

    def alloc(self, device: int, nbytes: int) -> int:
        self.calls["alloc"] += 1
        self._check()
        if self.pressure_refusals:
            self.pressure_refusals -= 1
            raise PressureRefused(nbytes, ("ns/big/c", "ns/small/c"), nbytes, "fake pressure")
        if self.used[device] + nbytes > self.capacity[device]:
            raise OutOfMemory(nbytes, "fake.OutOfMemory", "fake out of memory", "hard-limit")
        self.used[device] += nbytes
        handle = len(self.handles) + 1
        self.handles[handle] = (device, nbytes)
        return handle

    def free(self, handle: int) -> None:
        self._check()
        device, nbytes = self.handles.pop(handle)
        self.used[device] -= nbytes

    def touch(self, handle: int, pattern: int = 0xA5) -> None:
        self._check()
        self.touched.add(handle)
        self.written[handle] = pattern

    def verify(self, handle: int, pattern: int) -> int:
        self._check()
        return 0 if self.written.get(handle) == pattern else self.handles[handle][1]

    def meminfo(self) -> list[MemState]:
        self.calls["meminfo"] += 1
        if self.fault_on_meminfo is not None and self.calls["meminfo"] >= self.fault_on_meminfo:
            self.faulted = True
        if self.gone_on_meminfo is not None and self.calls["meminfo"] >= self.gone_on_meminfo:
            raise ClientGone("evicted", "fake client evicted")
        self._check()
        return [
            MemState(i, c, u, c - u) for i, (c, u) in enumerate(zip(self.capacity, self.used, strict=True))
        ]

    def kernel(self, device: int, seconds: float, matrix: int, streams: int = 1) -> KernelSpan:
        self._check()
        start = time.time()
        threading.Event().wait(seconds)
        end = time.time()
        return KernelSpan(start, end, end - start)

    def fault(self, device: int) -> str:
        self._check()
        self.faulted = True
        return "fake illegal address"

    def close(self) -> None:
        pass


def run(
    steps: list[dict[str, Any]], backend: FakeBackend | None = None, **kw: Any
) -> tuple[int, dict[str, Any]]:
    out = io.StringIO()
    code, result = Runner(parse_plan(steps), backend or FakeBackend(), out, poll_s=0.005, **kw).run()
    json.dumps(result)  # the full result must always be serialisable
    return int(code), result


# ---- alloc and OOM


def test_alloc_in_chunks_holds_the_sum() -> None:
    backend = FakeBackend()
    code, result = run([{"op": "alloc", "bytes": "1Gi", "chunk": "256Mi"}], backend)
    assert code == ExitCode.OK
    assert result["steps"][0] | {"ms": 0} == {
        "i": 0,
        "op": "alloc",
        "outcome": "ok",
        "ms": 0,
        "device": 0,
        "requested": GiB,
        "bytes": GiB,
        "pieces": 4,
        "held": GiB,
    }
    assert backend.calls["alloc"] == 4 and result["held_bytes"] == GiB


def test_an_expected_oom_is_a_result_with_the_size_the_holding_and_the_error_type() -> None:
    code, result = run(
        [
            {"op": "alloc", "bytes": "768Mi"},
            {"op": "alloc", "bytes": "512Mi", "chunk": "128Mi", "expect": "oom"},
        ]
    )
    assert (code, result["status"]) == (ExitCode.EXPECTED_OOM, "expected-oom")
    step = result["steps"][1]
    assert step["outcome"] == "oom" and step["bytes"] == 256 * MiB and step["pieces"] == 2
    assert step["oom"] == {
        "requested": 128 * MiB,
        "held": GiB,
        "held_total": GiB,
        "error_type": "fake.OutOfMemory",
        "message": "fake out of memory",
        "reason": "hard-limit",
    }
    assert "error" not in result


def test_an_unexpected_oom_stops_the_plan_with_its_own_exit_code() -> None:
    code, result = run([{"op": "alloc", "bytes": "2Gi"}, {"op": "meminfo"}])
    assert code == ExitCode.UNEXPECTED_OOM
    assert (result["steps_run"], result["steps_total"]) == (1, 2)
    assert result["error"]["requested"] == 2 * GiB and result["error"]["error_type"] == "fake.OutOfMemory"


def test_an_expected_oom_that_does_not_happen_is_an_expectation_not_met() -> None:
    code, result = run([{"op": "alloc", "bytes": "1Mi", "expect": "oom"}])
    assert code == ExitCode.EXPECTATION_NOT_MET
    assert result["error"] == {"step": 0, "op": "alloc", "expected": "oom", "outcome": "ok"}


def test_expect_any_records_the_failure_and_goes_on() -> None:
    code, result = run([{"op": "alloc", "bytes": "2Gi", "expect": "any"}, {"op": "alloc", "bytes": "1Mi"}])
    assert code == ExitCode.OK
    assert [s["outcome"] for s in result["steps"]] == ["oom", "ok"]


# ---- pressure


def test_pressure_without_retry_names_the_candidates_and_exits_with_pressure() -> None:
    code, result = run([{"op": "alloc", "bytes": "1Mi"}], FakeBackend(pressure_refusals=1))
    assert code == ExitCode.PRESSURE
    assert result["error"]["candidates"] == ["ns/big/c", "ns/small/c"]


def test_expected_pressure_is_fine() -> None:
    code, result = run(
        [{"op": "alloc", "bytes": "1Mi", "expect": "pressure"}], FakeBackend(pressure_refusals=1)
    )
    assert code == ExitCode.OK and result["steps"][0]["pressure"]["candidates"][0] == "ns/big/c"


def test_pressure_is_retried_until_granted_and_the_wait_recorded() -> None:
    backend = FakeBackend(pressure_refusals=2)
    code, result = run(
        [{"op": "alloc", "bytes": "1Mi", "retry_on_pressure": 30, "retry_interval": 0.001}], backend
    )
    assert code == ExitCode.OK
    resolved = result["steps"][0]["pressure_resolved"]
    assert resolved.pop("waited_s") >= 0
    assert resolved == {
        "attempts": 3,
        "refused_as": "pressure",
        "candidates": ["ns/big/c", "ns/small/c"],
        "shortfall": MiB,
    }


# ---- alloc-until-oom


@settings(max_examples=80, deadline=None)
@given(
    capacity_units=st.integers(1, 1 << 20),
    granularity=st.sampled_from([1, 4096, MiB]),
    held_units=st.integers(0, 100),
)
def test_alloc_until_oom_finds_the_largest_amount_to_the_granularity_in_few_calls(
    capacity_units: int, granularity: int, held_units: int
) -> None:
    capacity = capacity_units * granularity + granularity // 2  # not a multiple: the answer rounds down
    backend = FakeBackend(capacity)
    steps: list[dict[str, Any]] = []
    if held_units and held_units < capacity_units:
        steps.append({"op": "alloc", "bytes": held_units * granularity})
    steps.append({"op": "alloc-until-oom", "granularity": granularity})
    code, result = run(steps, backend)
    assert code == ExitCode.OK
    search = result["steps"][-1]
    already = held_units * granularity if len(steps) == 2 else 0
    assert search["max_bytes"] == (capacity - already) // granularity * granularity
    assert search["stopped_by"] == "oom" and search["oom"]["requested"] == granularity
    units = max(2, capacity // granularity)
    assert backend.calls["alloc"] <= 3 * math.log2(units) + 4


def test_alloc_until_oom_over_80_gib_at_1_mib_takes_about_fifty_calls() -> None:
    backend = FakeBackend(80 * GiB)
    code, result = run([{"op": "alloc-until-oom", "granularity": "1Mi", "label": "probe"}], backend)
    step = result["steps"][0]
    assert step["max_bytes"] == 80 * GiB
    assert step["allocs"] + step["failures"] == backend.calls["alloc"] <= 60
    code, result = run([{"op": "free", "label": "probe"}, {"op": "meminfo"}], backend)
    assert result["steps"][1]["devices"][0]["used"] == 80 * GiB  # a new runner holds nothing of it


def test_alloc_until_oom_stops_at_its_limit() -> None:
    code, result = run([{"op": "alloc-until-oom", "granularity": "1Mi", "limit": "100Mi"}], FakeBackend(GiB))
    assert result["steps"][0]["max_bytes"] == 100 * MiB and result["steps"][0]["stopped_by"] == "limit"


def test_alloc_until_oom_records_pressure_when_that_is_what_stops_it() -> None:
    code, result = run([{"op": "alloc-until-oom", "granularity": "1Mi"}], FakeBackend(pressure_refusals=100))
    step = result["steps"][0]
    assert code == ExitCode.OK and step["stopped_by"] == "pressure" and step["max_bytes"] == 0
    assert step["pressure"]["candidates"] == ["ns/big/c", "ns/small/c"]


# ---- touch, free, meminfo


def test_touch_and_free_act_on_a_label_or_on_everything() -> None:
    backend = FakeBackend()
    code, result = run(
        [
            {"op": "alloc", "bytes": "100Mi", "label": "a"},
            {"op": "alloc", "bytes": "50Mi", "label": "b", "chunk": "25Mi"},
            {"op": "touch", "label": "b"},
            {"op": "free", "label": "a"},
            {"op": "meminfo"},
            {"op": "touch"},
            {"op": "free"},
        ],
        backend,
    )
    assert code == ExitCode.OK
    touch_b, free_a, mem, touch_all, free_all = result["steps"][2:]
    assert (touch_b["bytes"], touch_b["pieces"]) == (50 * MiB, 2)
    assert (free_a["bytes"], free_a["held"]) == (100 * MiB, 50 * MiB)
    assert mem["devices"] == [{"i": 0, "total": GiB, "used": 50 * MiB, "free": GiB - 50 * MiB}]
    assert touch_all["bytes"] == 50 * MiB
    assert free_all["held"] == 0 and backend.used == [0]


# ---- hold, heartbeat, signals


def test_hold_ends_when_the_file_appears(tmp_path: Path) -> None:
    go = tmp_path / "go"
    timer = threading.Timer(0.2, go.touch)
    timer.start()
    code, result = run(
        [{"op": "alloc", "bytes": "1Mi"}, {"op": "hold", "until_file": str(go), "seconds": 60}]
    )
    timer.join()
    assert code == ExitCode.OK
    assert result["steps"][1]["ended_by"] == "file" and result["steps"][1]["held"] == MiB


def test_hold_ends_after_its_seconds() -> None:
    code, result = run([{"op": "hold", "seconds": 0.05, "until_file": "/nonexistent/never"}])
    assert result["steps"][0]["ended_by"] == "seconds" and result["steps"][0]["s"] >= 0.05


def test_hold_ends_on_its_signal() -> None:
    timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGUSR1))
    timer.start()
    code, result = run([{"op": "hold", "until_signal": "SIGUSR1", "seconds": 60}])
    timer.join()
    assert code == ExitCode.OK and result["steps"][0]["ended_by"] == "signal"
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL  # handlers restored


def test_a_signal_that_arrives_before_its_hold_is_latched_for_it() -> None:
    timer = threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGUSR1))
    timer.start()
    code, result = run(
        [{"op": "hold", "seconds": 0.5}, {"op": "hold", "until_signal": "SIGUSR1", "seconds": 60}]
    )
    timer.join()
    assert code == ExitCode.OK
    assert [s["ended_by"] for s in result["steps"]] == ["seconds", "signal"]
    assert result["steps"][1]["s"] < 30


def test_a_terminating_signal_no_step_waits_for_ends_the_run_with_a_result() -> None:
    timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM))
    timer.start()
    code, result = run([{"op": "alloc", "bytes": "1Mi"}, {"op": "hold", "seconds": 60}, {"op": "free"}])
    timer.join()
    assert code == ExitCode.TERMINATED == 143
    assert result["status"] == "terminated" and result["error"]["message"] == "received SIGTERM"
    assert result["held_bytes"] == MiB


def test_heartbeat_beats_until_its_count_and_measures_the_largest_gap() -> None:
    backend = FakeBackend()
    code, result = run([{"op": "heartbeat", "interval": 0.01, "count": 5}], backend)
    step = result["steps"][0]
    assert code == ExitCode.OK and step["beats"] == 5 and step["ended_by"] == "count"
    assert 0 < step["max_gap_s"] < 5 and backend.calls["meminfo"] == 5


def test_a_fault_seen_by_a_heartbeat_is_a_device_fault() -> None:
    backend = FakeBackend()
    backend.fault_on_meminfo = 3
    code, result = run([{"op": "heartbeat", "interval": 0.01, "seconds": 60}, {"op": "free"}], backend)
    assert code == ExitCode.DEVICE_FAULT
    assert result["error"]["type"] == "fake-fault" and result["steps"][0]["outcome"] == "fault"


def test_eviction_seen_by_a_heartbeat_is_client_gone() -> None:
    backend = FakeBackend()
    backend.gone_on_meminfo = 2
    code, result = run([{"op": "heartbeat", "interval": 0.01, "seconds": 60}], backend)
    assert code == ExitCode.CLIENT_GONE and result["error"]["reason"] == "evicted"


# ---- compute and fault


def test_compute_keeps_a_summary_and_logs_each_kernel_span_with_its_digest() -> None:
    out = io.StringIO()
    code, result = Runner(
        parse_plan([{"op": "compute", "seconds": 0.1, "kernel_ms": 10}]), FakeBackend(), out
    ).run()
    step = result["steps"][0]
    assert code == ExitCode.OK and step["kernels"] >= 3 and "spans_ms" not in step
    assert step["t0"] <= step["t_end"] and step["work_per_s"] > 0
    assert step["kernels_per_s"] > 0 and step["work_unit"] == "kernel-seconds"
    line = next(x for x in out.getvalue().splitlines() if "compute spans" in x)
    text = line.split(": ", 2)[-1]
    assert hashlib.sha256(text.encode()).hexdigest()[:16] == step["spans_digest"]
    spans = json.loads(text)
    assert len(spans) == step["kernels"] and spans[0][0] == 0.0
    assert all(s <= e for s, e in spans) and all(
        spans[i][1] <= spans[i + 1][0] for i in range(len(spans) - 1)
    )


def test_calibrate_picks_the_largest_kernel_a_second_stream_speeds_up() -> None:
    class Saturating(FakeBackend):
        def kernel(self, device: int, seconds: float, matrix: int, streams: int = 1) -> KernelSpan:
            span = super().kernel(device, seconds, matrix, 1)
            gain = streams if matrix <= 1024 else 1  # kernels above 1024 fill the device
            # Work in proportion to the time the kernel really ran, as on a device: the requested
            # time would make a kernel that overslept on a busy machine look slower than its twin.
            return KernelSpan(span.start, span.end, (span.end - span.start) * gain)

    code, result = run(
        [
            {"op": "calibrate", "seconds": 0.02, "kernel_ms": 5},
            {"op": "compute", "seconds": 0.02, "kernel_ms": 5, "matrix": "calibrated"},
        ],
        Saturating(),
    )
    assert code == ExitCode.OK
    calibrate, compute = result["steps"]
    assert calibrate["matrix"] == 1024 and [r["matrix"] for r in calibrate["table"]] == [4096, 2048, 1024]
    assert compute["matrix"] == 1024


def test_an_out_of_memory_is_retried_when_the_step_says_so_but_never_a_hard_limit() -> None:
    class FullForAWhile(FakeBackend):
        full = 2

        def alloc(self, device: int, nbytes: int) -> int:
            if self.full:
                self.full -= 1
                raise OutOfMemory(nbytes, "fake.OutOfMemory", "GPU full", "device-full")
            return super().alloc(device, nbytes)

    step = {"op": "alloc", "bytes": "1Mi", "retry_on_oom": 30, "retry_interval": 0.001}
    code, result = run([step], FullForAWhile())
    assert code == ExitCode.OK
    assert result["steps"][0]["pressure_resolved"]["refused_as"] == "oom"
    assert result["steps"][0]["pressure_resolved"]["attempts"] == 3
    code, result = run([{**step, "bytes": "2Gi"}], FakeBackend())  # past its limit: at once
    assert code == ExitCode.UNEXPECTED_OOM and result["steps"][0]["ms"] < 1000


def test_a_fault_step_ends_the_plan_with_fault_injected() -> None:
    code, result = run([{"op": "alloc", "bytes": "1Mi"}, {"op": "fault"}, {"op": "free"}])
    assert code == ExitCode.FAULT_INJECTED
    assert result["steps_run"] == 2 and result["steps"][1]["message"] == "fake illegal address"


# ---- smi


def fake_smi(directory: Path, body: str) -> dict[str, str]:
    script = directory / "nvidia-smi"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return {"PATH": str(directory)}


def test_smi_output_is_parsed(tmp_path: Path) -> None:
    env = fake_smi(tmp_path, "echo '0, GPU-a, 40960, 100'; echo '1, GPU-b, 40960, 0'")
    code, result = run([{"op": "smi"}], environ=env)
    assert code == ExitCode.OK
    assert result["steps"][0]["gpus"] == [
        {"index": 0, "uuid": "GPU-a", "total_mib": 40960, "used_mib": 100},
        {"index": 1, "uuid": "GPU-b", "total_mib": 40960, "used_mib": 0},
    ]


@pytest.mark.parametrize(
    ("body", "match"),
    [("echo nonsense", "unexpected nvidia-smi line"), ("echo broken >&2; exit 9", "exited 9: broken")],
)
def test_smi_failures_are_errors_unless_any_is_expected(tmp_path: Path, body: str, match: str) -> None:
    env = fake_smi(tmp_path, body)
    code, result = run([{"op": "smi"}], environ=env)
    assert code == ExitCode.ERROR and match in result["error"]["message"]
    code, result = run([{"op": "smi", "expect": "any"}, {"op": "meminfo"}], environ=env)
    assert code == ExitCode.OK and result["steps"][0]["outcome"] == "error"


def test_smi_missing_is_an_error(tmp_path: Path) -> None:
    code, result = run([{"op": "smi"}], environ={"PATH": str(tmp_path)})
    assert code == ExitCode.ERROR and "not on PATH" in result["error"]["message"]


# ---- start-up and the command line


def test_a_backend_that_fails_at_start_is_reported() -> None:
    class Broken(FakeBackend):
        def describe(self) -> dict[str, Any]:
            raise BackendUnavailable("device went away")

    code, result = run([{"op": "meminfo"}], Broken())
    assert code == ExitCode.BACKEND_UNAVAILABLE and result["steps_run"] == 0


def test_main_with_a_bad_plan_exits_2_and_still_writes_a_result(tmp_path: Path) -> None:
    out = io.StringIO()
    term = tmp_path / "term"
    code = allocate.main(["--plan", '[{"op": "nope"}]'], {"GPUCONF_TERMINATION_PATH": str(term)}, out)
    assert code == ExitCode.PLAN_ERROR
    result = json.loads(term.read_text())
    assert result["status"] == "plan-error" and "nope" in result["error"]["message"]
    assert out.getvalue().strip().splitlines()[-1] == term.read_text()


def test_main_without_any_backend_exits_3_saying_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(
        allocate, "select_backend", lambda name, env: (_ for _ in ()).throw(BackendUnavailable("none"))
    )
    out = io.StringIO()
    plan = tmp_path / "plan.json"
    plan.write_text('[{"op": "meminfo"}]')
    code = allocate.main(["--plan", f"@{plan}", "--termination-path", str(tmp_path / "t")], {}, out)
    assert code == ExitCode.BACKEND_UNAVAILABLE
    assert json.loads((tmp_path / "t").read_text())["error"]["message"] == "none"


def test_main_reads_the_plan_from_env_and_writes_the_full_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(allocate, "select_backend", lambda name, env: FakeBackend())
    out = io.StringIO()
    env = {"GPUCONF_PLAN": json.dumps([{"op": "compute", "seconds": 0.05, "kernel_ms": 0.5}])}
    full = tmp_path / "full.json"
    code = allocate.main(["--termination-path", str(tmp_path / "t"), "--full-result", str(full)], env, out)
    assert code == ExitCode.OK
    last = out.getvalue().strip().splitlines()[-1]
    assert last == (tmp_path / "t").read_text() and len(last) <= 4096
    assert json.loads(full.read_text())["steps"][0]["kernels"] >= 1


def test_help_lists_every_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        allocate.main(["--help"], {}, io.StringIO())
    text = capsys.readouterr().out
    for code in ExitCode:
        assert f"{int(code):>3}  {code.status}" in text


def test_a_bug_in_a_step_is_an_error_result_not_a_crash() -> None:
    class Buggy(FakeBackend):
        def touch(self, handle: int, pattern: int = 0xA5) -> None:
            raise KeyError(handle)

    code, result = run([{"op": "alloc", "bytes": "1Mi"}, {"op": "touch"}], Buggy())
    assert code == ExitCode.ERROR
    assert result["error"]["type"] == "KeyError" and result["steps"][1]["outcome"] == "error"


# ---- ready and env


def test_ready_writes_the_file_a_readiness_probe_tests_for(tmp_path: Path) -> None:
    explicit = tmp_path / "explicit"
    code, result = run([{"op": "ready", "path": str(explicit)}])
    assert code == ExitCode.OK and explicit.exists() and result["steps"][0]["path"] == str(explicit)
    conventional = tmp_path / "from-env"
    code, result = run([{"op": "ready"}], environ={"GPUCONF_READY_PATH": str(conventional)})
    assert code == ExitCode.OK and conventional.exists()


def test_ready_that_cannot_write_its_file_is_an_error(tmp_path: Path) -> None:
    code, result = run([{"op": "ready", "path": str(tmp_path / "no" / "such" / "dir" / "ready")}])
    assert code == ExitCode.ERROR and "cannot write the ready file" in result["error"]["message"]


def test_env_records_the_named_variables_and_null_for_unset_ones() -> None:
    code, result = run([{"op": "env", "names": ["A", "B"]}], environ={"A": "1"})
    assert code == ExitCode.OK and result["steps"][0]["env"] == {"A": "1", "B": None}


@pytest.mark.parametrize("names", [[], "A", ["1A"], ["A B"], [1]])
def test_env_refuses_anything_but_a_list_of_variable_names(names: Any) -> None:
    from workloads.plan import PlanError

    with pytest.raises(PlanError, match=r"steps\[0\]\(env\)\.names"):
        parse_plan([{"op": "env", "names": names}])


def test_heartbeat_records_its_first_and_last_beat_and_the_least_memory_the_device_counted() -> None:
    before = time.time()
    code, result = run(
        [{"op": "alloc", "bytes": "64Mi"}, {"op": "heartbeat", "interval": 0.01, "count": 3}], FakeBackend()
    )
    beat = result["steps"][1]
    assert code == ExitCode.OK and before - 0.01 <= beat["first_at"] <= beat["last_at"] <= time.time() + 0.01
    assert beat["used_min"] == [64 * MiB]


# ---- verify


def test_verify_reads_back_every_touched_piece_with_its_own_pattern() -> None:
    backend = FakeBackend()
    code, result = run(
        [{"op": "alloc", "bytes": "4Mi", "chunk": "1Mi"}, {"op": "touch"}, {"op": "verify"}], backend
    )
    assert code == ExitCode.OK, result
    assert result["steps"][2] | {"ms": 0} == {
        "i": 2,
        "op": "verify",
        "outcome": "ok",
        "ms": 0,
        "bytes": 4 * MiB,
        "pieces": 4,
        "mismatched": 0,
        "bad": [],
    }
    assert len(set(backend.written.values())) == 4 and 0 not in backend.written.values()


def test_memory_that_no_longer_holds_what_was_written_is_corrupted() -> None:
    plan = [{"op": "alloc", "bytes": "2Mi", "chunk": "1Mi"}, {"op": "touch"}, {"op": "verify"}]

    class Scrubbing(FakeBackend):
        def verify(self, handle: int, pattern: int) -> int:
            return MiB if handle == 2 else 0  # the second piece was zeroed behind the workload's back

    code, result = run(plan, Scrubbing())
    assert code == ExitCode.CORRUPTED and result["status"] == "corrupted"
    step = result["steps"][2]
    assert step["outcome"] == "corrupted" and step["mismatched"] == MiB
    assert step["bad"] == [{"label": "", "device": 0, "bytes": MiB, "mismatched": MiB}]
    assert result["error"]["mismatched"] == MiB


def test_verify_of_memory_never_touched_is_a_plan_mistake_not_a_verdict() -> None:
    code, result = run([{"op": "alloc", "bytes": "1Mi"}, {"op": "verify"}], FakeBackend())
    assert code == ExitCode.ERROR and "never touched" in result["error"]["message"]


def test_a_device_free_plan_runs_where_there_is_no_gpu(tmp_path: Any, capsys: Any) -> None:
    from workloads.allocate import main

    plan = '{"steps": [{"op": "env", "names": ["SIDE"]}]}'
    out = tmp_path / "term"
    code = main(["--plan", plan, "--termination-path", str(out)], environ={"SIDE": "x"})
    result = json.loads(out.read_text())
    assert code == 0 and result["backend"] == "none" and result["steps"][0]["env"] == {"SIDE": "x"}
    assert main(["--plan", '{"steps": [{"op": "meminfo"}]}', "--termination-path", str(out)], environ={}) == 3


class FreeSubPage(FakeBackend):
    """A device that grants allocations under 2 MiB without charging them (the seeded agent fault
    ``free-sub-page``): a search ending at 1 MiB pieces would never meet an out-of-memory."""

    def alloc(self, device: int, nbytes: int) -> int:
        if nbytes < 2 * MiB:
            self.calls["alloc"] += 1
            handle = len(self.handles) + 1
            self.handles[handle] = (device, 0)
            return handle
        return super().alloc(device, nbytes)


def test_alloc_until_oom_stops_once_it_holds_more_than_the_device_reports_as_its_total() -> None:
    backend = FreeSubPage(100 * MiB)
    code, result = run([{"op": "alloc-until-oom", "granularity": "1Mi"}], backend)
    step = result["steps"][0]
    assert code == ExitCode.OK and step["stopped_by"] == "above-total"
    assert step["max_bytes"] == 101 * MiB and step["device_total"] == 100 * MiB
    assert backend.calls["alloc"] < 200  # it ends, and soon


def test_alloc_until_oom_with_a_limit_of_its_own_keeps_to_it_even_past_the_device_total() -> None:
    code, result = run(
        [{"op": "alloc-until-oom", "granularity": "1Mi", "limit": "150Mi"}], FreeSubPage(100 * MiB)
    )
    assert result["steps"][0]["stopped_by"] == "limit" and result["steps"][0]["max_bytes"] == 150 * MiB


def test_cuda_devices_records_the_count_and_each_device_cuda_enumerates() -> None:
    code, result = run([{"op": "cuda-devices"}], FakeBackend(GiB, 2 * GiB))
    step = result["steps"][0]
    assert code == ExitCode.OK and step["count"] == 2
    assert [(d["i"], d["uuid"], d["total"]) for d in step["devices"]] == [
        (0, "GPU-fake-0", GiB),
        (1, "GPU-fake-1", 2 * GiB),
    ]


def test_a_cuda_uuid_is_written_as_nvidia_smi_writes_it() -> None:
    from workloads.backends import gpu_uuid

    raw = bytes(range(16))
    assert gpu_uuid(raw) == "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"
    assert gpu_uuid("GPU-abc") == "GPU-abc" and gpu_uuid("abc") == "GPU-abc" and gpu_uuid(b"\x01") == "01"

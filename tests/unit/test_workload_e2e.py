"""The allocation workload end to end: ``python -m workloads.allocate`` against a device server process.

Each workload runs exactly as in a simulated container (socket and token in its environment, the
simulated nvidia-smi first on PATH) and is judged the way a conformance check judges it: by exit
code and by the termination message. Workloads are sequenced against each other through their
progress lines ("holding", "heartbeat 1") and files they wait for, never through sleeps.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from enforcement.sim.testing import SimNodeHarness
from workloads.process import WorkloadProcess, WorkloadRun, run_workload
from workloads.report import ExitCode
from workloads.simwire import SimModeConflict

MiB = 1 << 20
WORKLOADS_DIR = Path(__file__).resolve().parents[2] / "workloads"
HOLDING = "): holding "  # the progress line of a hold step, after the "gpuconf-workload (...)" prefix


@pytest.fixture
def node() -> Iterator[SimNodeHarness]:
    with SimNodeHarness.running(gpus="2x1024") as h:
        yield h


@pytest.fixture
def term(tmp_path: Path) -> Iterator[Any]:
    """Termination-message paths, one per workload of a test."""
    names = iter(range(100))
    yield lambda: tmp_path / f"termination-{next(names)}"


def run(
    node: SimNodeHarness, name: str, steps: list[dict[str, Any]], term: Any, **attach: Any
) -> WorkloadRun:
    client = node.attach(name, **attach)
    return run_workload({"name": name, "steps": steps}, client.env, term())


def start(
    node: SimNodeHarness, name: str, steps: list[dict[str, Any]], term: Any, **attach: Any
) -> WorkloadProcess:
    client = node.attach(name, **attach)
    return WorkloadProcess({"name": name, "steps": steps}, client.env, term())


def assert_reported(run: WorkloadRun, code: ExitCode) -> dict[str, Any]:
    """The exit code, and the same result in the termination message and on the last stdout line."""
    assert run.exit_code == code, f"{run.stdout}\n{run.stderr}"
    assert run.termination_message is not None and len(run.termination_message.encode()) <= 4096
    assert json.loads(run.termination_message) == run.result
    assert run.stdout.rstrip("\n").splitlines()[-1] == run.termination_message
    assert run.result["exit_code"] == int(code) and run.result["status"] == code.status
    return run.result


def used_mib(node: SimNodeHarness, name: str) -> int:
    client = next(c for c in node.admin.snapshot().clients if c.name == name)
    return client.gpus[0].used_bytes // MiB


# ---- memory semantics


def test_oom_comes_at_exactly_the_hard_limit(node: SimNodeHarness, term: Any) -> None:
    r = run(
        node,
        "ns/limit/c",
        [
            {"op": "alloc-until-oom", "granularity": "1Mi", "label": "probe"},
            {"op": "free", "label": "probe"},
            {"op": "alloc", "bytes": "512Mi", "chunk": "100Mi"},
            {"op": "touch"},
            {"op": "alloc", "bytes": "1Mi", "expect": "oom"},
        ],
        term,
        guarantee_mib=256,
        hard_limit_mib=512,
    )
    result = assert_reported(r, ExitCode.EXPECTED_OOM)
    assert result["simulated"] is True and result["backend"] == "sim"
    probe, _free, alloc, touch, oom = result["steps"]
    assert probe["max_bytes"] == 512 * MiB and probe["oom"]["reason"] == "hard-limit"
    assert alloc["bytes"] == 512 * MiB and touch["bytes"] == 512 * MiB
    assert oom["oom"]["requested"] == MiB and oom["oom"]["held"] == 512 * MiB
    assert oom["oom"]["error_type"] == "simulated-oom/hard-limit"


def test_an_unexpected_oom_exits_11_and_says_what_was_held(node: SimNodeHarness, term: Any) -> None:
    r = run(node, "ns/over/c", [{"op": "alloc", "bytes": "300Mi", "chunk": "100Mi"}], term, guarantee_mib=256)
    result = assert_reported(r, ExitCode.UNEXPECTED_OOM)
    assert (result["error"]["requested"], result["error"]["held"]) == (100 * MiB, 200 * MiB)


def test_no_oom_where_one_was_expected_exits_12(node: SimNodeHarness, term: Any) -> None:
    r = run(
        node, "ns/nolimit/c", [{"op": "alloc", "bytes": "300Mi", "expect": "oom"}], term, guarantee_mib=512
    )
    assert_reported(r, ExitCode.EXPECTATION_NOT_MET)


def test_a_client_borrows_idle_memory_above_its_guarantee(node: SimNodeHarness, term: Any) -> None:
    holder = start(
        node,
        "ns/burst/c",
        [{"op": "alloc", "bytes": "768Mi"}, {"op": "hold", "until_signal": "SIGUSR1", "seconds": 120}],
        term,
        guarantee_mib=256,
        hard_limit_mib=768,
    )
    holder.wait_for(HOLDING)
    assert used_mib(node, "ns/burst/c") == 768
    gpu0 = node.admin.pressure()[0]
    assert not gpu0.under_pressure and [c.client for c in gpu0.candidates] == ["ns/burst/c"]
    os.kill(holder.pid, signal.SIGUSR1)
    result = assert_reported(holder.finish(), ExitCode.OK)
    assert result["steps"][1]["ended_by"] == "signal"


def test_pressure_names_the_candidates_and_after_eviction_the_guaranteed_workload_gets_its_memory(
    node: SimNodeHarness, term: Any
) -> None:
    borrower = start(
        node,
        "ns/borrower/c",
        [{"op": "alloc", "bytes": "900Mi"}, {"op": "heartbeat", "interval": 0.05, "seconds": 120}],
        term,
        guarantee_mib=256,
        hard_limit_mib=1024,
    )
    borrower.wait_for("heartbeat 1 ")
    refused = run(node, "ns/refused/c", [{"op": "alloc", "bytes": "200Mi"}], term, guarantee_mib=200)
    result = assert_reported(refused, ExitCode.PRESSURE)
    assert result["error"]["candidates"] == ["ns/borrower/c"]
    node.admin.detach("ns/refused/c")

    guaranteed = start(
        node,
        "ns/guaranteed/c",
        [{"op": "alloc", "bytes": "512Mi", "retry_on_pressure": 120, "retry_interval": 0.05}],
        term,
        guarantee_mib=512,
    )
    deadline = time.monotonic() + 60
    while not (pressure := node.admin.pressure()[0]).under_pressure:  # what the evictor polls
        assert time.monotonic() < deadline, "the guaranteed workload never registered pressure"
        time.sleep(0.02)
    assert [c.client for c in pressure.candidates] == ["ns/borrower/c"]
    assert [(w.client, w.needed_bytes) for w in pressure.waiting] == [("ns/guaranteed/c", 512 * MiB)]
    node.admin.evict("ns/borrower/c")

    result = assert_reported(guaranteed.finish(), ExitCode.OK)
    resolved = result["steps"][0]["pressure_resolved"]
    assert resolved["candidates"] == ["ns/borrower/c"] and resolved["attempts"] >= 2
    gone = assert_reported(borrower.finish(), ExitCode.CLIENT_GONE)
    assert gone["error"]["reason"] == "evicted"


def test_expected_pressure_is_not_a_failure(node: SimNodeHarness, term: Any) -> None:
    filler = start(
        node,
        "ns/filler/c",
        [{"op": "alloc", "bytes": "1000Mi"}, {"op": "hold", "until_signal": "SIGUSR1", "seconds": 120}],
        term,
        guarantee_mib=100,
        hard_limit_mib=1024,
    )
    filler.wait_for(HOLDING)
    r = run(
        node, "ns/waits/c", [{"op": "alloc", "bytes": "100Mi", "expect": "pressure"}], term, guarantee_mib=100
    )
    assert assert_reported(r, ExitCode.OK)["steps"][0]["pressure"]["candidates"] == ["ns/filler/c"]
    os.kill(filler.pid, signal.SIGUSR1)
    assert_reported(filler.finish(), ExitCode.OK)


def test_a_killed_workload_gets_its_memory_released(node: SimNodeHarness, term: Any) -> None:
    holder = start(
        node,
        "ns/killed/c",
        [{"op": "alloc", "bytes": "400Mi"}, {"op": "hold", "seconds": 120}],
        term,
        guarantee_mib=512,
    )
    holder.wait_for(HOLDING)
    assert used_mib(node, "ns/killed/c") == 400
    holder.proc.kill()
    holder.finish()
    deadline = time.monotonic() + 60
    while used_mib(node, "ns/killed/c"):
        assert time.monotonic() < deadline, "memory of a killed workload was never released"
        time.sleep(0.02)


def test_sigterm_during_a_hold_still_writes_the_result(node: SimNodeHarness, term: Any) -> None:
    holder = start(
        node, "ns/term/c", [{"op": "alloc", "bytes": "10Mi"}, {"op": "hold", "seconds": 120}], term
    )
    holder.wait_for(HOLDING)
    holder.proc.terminate()
    result = assert_reported(holder.finish(), ExitCode.TERMINATED)
    assert result["held_bytes"] == 10 * MiB and result["steps_run"] == 2


# ---- compute modes and fault domains


def _compute_pair(node: SimNodeHarness, term: Any, tmp_path: Path, mode: str) -> list[dict[str, Any]]:
    go = tmp_path / f"go-{mode}"
    steps = [
        {"op": "hold", "until_file": str(go), "seconds": 120},
        {"op": "compute", "seconds": 1.0, "kernel_ms": 50},
    ]
    pair = [start(node, f"ns/{mode}-{i}/c", steps, term, guarantee_mib=64, mode=mode) for i in range(2)]
    for w in pair:
        w.wait_for(HOLDING)
    go.touch()
    return [assert_reported(w.finish(), ExitCode.OK)["steps"][1] for w in pair]


def test_time_slicing_workloads_take_turns(node: SimNodeHarness, term: Any, tmp_path: Path) -> None:
    a, b = _compute_pair(node, term, tmp_path, "time-slicing")
    # The device counts, per kernel, the time another client's kernel ran beside it.
    assert a["shared_s"] < 0.001 and b["shared_s"] < 0.001
    assert a["kernels"] >= 3 and b["kernels"] >= 3


def test_sm_sharing_workloads_run_at_once(node: SimNodeHarness, term: Any, tmp_path: Path) -> None:
    a, b = _compute_pair(node, term, tmp_path, "sm-sharing")
    assert a["shared_s"] > 0.3 and b["shared_s"] > 0.3  # of about 1 s each; a wide margin for load


def _fault_next_to(node: SimNodeHarness, term: Any, tmp_path: Path, mode: str) -> WorkloadRun:
    stop = tmp_path / f"stop-{mode}"
    neighbour = start(
        node,
        "ns/neighbour/c",
        [
            {"op": "alloc", "bytes": "10Mi"},
            {"op": "heartbeat", "interval": 0.05, "until_file": str(stop), "seconds": 120},
        ],
        term,
        guarantee_mib=64,
        mode=mode,
    )
    neighbour.wait_for("heartbeat 1 ")
    faulter = run(
        node,
        "ns/faulter/c",
        [{"op": "alloc", "bytes": "1Mi"}, {"op": "fault"}, {"op": "free"}],
        term,
        mode=mode,
    )
    result = assert_reported(faulter, ExitCode.FAULT_INJECTED)
    assert result["steps_run"] == 2 and "illegal memory access" in result["steps"][1]["message"]
    # Before telling the neighbour to stop, let it touch the device after the fault (or die of it).
    # Beat k+1 may have been in flight during the fault; beat k+2 began after k+1 was printed, so
    # after the faulter had exited.
    seen = [int(n) for n in re.findall(r"\): heartbeat (\d+) at", neighbour.output())]
    neighbour.wait_for(f"): heartbeat {max(seen) + 2} at", or_exit=True)
    stop.touch()
    return neighbour.finish()


def test_a_fault_in_sm_sharing_takes_the_neighbour_down(
    node: SimNodeHarness, term: Any, tmp_path: Path
) -> None:
    result = assert_reported(_fault_next_to(node, term, tmp_path, "sm-sharing"), ExitCode.DEVICE_FAULT)
    assert result["error"]["type"] == "simulated-fault/illegal-address"
    assert "ns/faulter/c" in result["error"]["message"]


def test_a_fault_in_time_slicing_leaves_the_neighbour_running(
    node: SimNodeHarness, term: Any, tmp_path: Path
) -> None:
    result = assert_reported(_fault_next_to(node, term, tmp_path, "time-slicing"), ExitCode.OK)
    assert result["steps"][1]["ended_by"] == "file"


def test_modes_never_mix_on_a_gpu_while_a_workload_runs(node: SimNodeHarness, term: Any) -> None:
    runner = start(
        node, "ns/ts/c", [{"op": "heartbeat", "interval": 0.05, "count": 10}], term, guarantee_mib=64
    )
    runner.wait_for("heartbeat 1 ")
    with pytest.raises(SimModeConflict, match="ns/ts/c") as exc:
        node.attach("ns/sm/c", guarantee_mib=64, mode="sm-sharing")
    assert "ns/sm/c" in str(exc.value) and "sm-sharing" in str(exc.value)
    node.attach("ns/sm/c", gpus=("1",), guarantee_mib=64, mode="sm-sharing")  # another GPU of the node
    assert_reported(runner.finish(), ExitCode.OK)


# ---- what a check reads


def test_smi_shows_the_workloads_view(node: SimNodeHarness, term: Any) -> None:
    r = run(
        node,
        "ns/smi/c",
        [{"op": "alloc", "bytes": "100Mi", "device": 1}, {"op": "smi"}, {"op": "meminfo"}],
        term,
        gpus=("1", "0"),
        guarantee_mib=128,
        hard_limit_mib=300,
    )
    result = assert_reported(r, ExitCode.OK)
    uuids = node.server.gpu_uuids
    assert result["steps"][1]["gpus"] == [
        {"index": 0, "uuid": uuids[1], "total_mib": 300, "used_mib": 0},
        {"index": 1, "uuid": uuids[0], "total_mib": 300, "used_mib": 100},
    ]
    assert [(d["total"], d["used"]) for d in result["steps"][2]["devices"]] == [
        (300 * MiB, 0),
        (300 * MiB, 100 * MiB),
    ]
    assert [d["uuid"] for d in result["devices"]] == [uuids[1], uuids[0]]
    assert "SIMULATED" in r.stdout


def test_many_kernels_keep_the_result_a_summary_and_the_spans_go_to_the_log(
    node: SimNodeHarness, term: Any
) -> None:
    r = run(node, "ns/big/c", [{"op": "compute", "seconds": 1.0, "kernel_ms": 0.5}], term, guarantee_mib=64)
    result = assert_reported(r, ExitCode.OK)
    step = result["steps"][0]
    # How many 0.5 ms kernels fit in the second is the machine's business (about 200 when idle, 43
    # once, starved beside the integration tests); what must hold is that the result keeps a summary
    # of any number, and the log every span under the result's digest.
    assert not result.get("truncated") and step["kernels"] >= 20 and "spans_ms" not in step
    line = next(x for x in r.stdout.splitlines() if f"sha256 {step['spans_digest']}" in x)
    assert len(json.loads(line.split(": ", 2)[-1])) == step["kernels"]


def test_a_plan_error_exits_2_before_touching_the_device(node: SimNodeHarness, term: Any) -> None:
    r = run(node, "ns/bad/c", [{"op": "alloc", "bytes": "lots"}], term)
    result = assert_reported(r, ExitCode.PLAN_ERROR)
    assert "steps[0](alloc).bytes" in result["error"]["message"]
    assert node.admin.snapshot().clients[0].contexts == 0


def test_without_a_device_the_workload_exits_3(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUCONF_SIM_")}
    r = run_workload([{"op": "meminfo"}], env, tmp_path / "t", extra_args=("--backend", "sim"))
    result = assert_reported(r, ExitCode.BACKEND_UNAVAILABLE)
    assert "GPUCONF_SIM_SOCKET" in result["error"]["message"]


def test_a_missing_nvidia_smi_is_an_error_exit_1(node: SimNodeHarness, term: Any) -> None:
    client = node.attach("ns/nosmi/c")
    env = dict(client.env, PATH=os.path.dirname(sys.executable))
    result = assert_reported(run_workload([{"op": "smi"}], env, term()), ExitCode.ERROR)
    assert "nvidia-smi is not on PATH" in result["error"]["message"]


# ---- self-containment


def test_the_workload_package_imports_only_the_standard_library_and_itself() -> None:
    allowed = set(sys.stdlib_module_names) | {"cupy"}
    for path in WORKLOADS_DIR.glob("*.py"):
        tree = ast.parse(path.read_text())
        for n in ast.walk(tree):
            if isinstance(n, ast.Import):
                roots = {a.name.split(".")[0] for a in n.names}
            elif isinstance(n, ast.ImportFrom) and n.level == 0:
                roots = {(n.module or "").split(".")[0]}
            else:
                continue
            assert roots <= allowed, f"{path.name} imports {roots - allowed}"


def test_the_workload_runs_copied_alone_with_no_site_packages(node: SimNodeHarness, tmp_path: Path) -> None:
    image = tmp_path / "image"
    shutil.copytree(WORKLOADS_DIR, image / "workloads", ignore=shutil.ignore_patterns("__pycache__"))
    client = node.attach("ns/alone/c")
    env = {k: v for k, v in client.env.items() if k != "PYTHONPATH"}
    proc = WorkloadProcess(
        [{"op": "alloc", "bytes": "1Mi"}, {"op": "meminfo"}],
        env,
        tmp_path / "t",
        python_flags=("-S", "-E"),  # no site-packages (so no gpuconf install), no PYTHON* variables
        cwd=image,
    )
    assert_reported(proc.finish(), ExitCode.OK)
    bare = {k: v for k, v in env.items() if not k.startswith("GPUCONF_SIM_")}
    proc = WorkloadProcess([{"op": "meminfo"}], bare, tmp_path / "t2", python_flags=("-S", "-E"), cwd=image)
    result = assert_reported(proc.finish(), ExitCode.BACKEND_UNAVAILABLE)
    assert "cupy is not installed" in result["error"]["message"]

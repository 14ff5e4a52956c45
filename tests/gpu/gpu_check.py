"""``make gpu-check``: what a real GPU shows, measured and judged with the suite's own judgements.

For a machine with one GPU (prepared for an H200 with driver 580 / CUDA 13.0: MPS pinned limits
exist there, CUDA 13.4 soft limits do not). Every part runs the allocation workload's CuPy backend
(``python -m workloads.allocate --backend cupy``) as a process, or ``gpuconf probe --backend mps``,
each with a time limit, so the whole takes at most about 8 minutes:

1. ``context``: an idle process's view (``cudaMemGetInfo``) before and after its first allocation:
   the device memory its CUDA context costs (the simulated H200's ``context_bytes``);
2. ``granularity``: allocations of 1 byte, 1 MiB + 1 and 3 MiB, and what each cost the device
   (the simulated H200's ``granularity_bytes``);
3. ``boundary``: ``alloc-until-oom`` at 2 MiB granularity, then ``touch``: the boundary, judged with
   ``conformance.judgements.judge_boundary`` against the memory the process may use (the total);
4. ``kernels``: the ``calibrate`` step (which kernel size does not fill the GPU) and a solo
   ``compute`` with it, then two processes computing side by side (without MPS: time-slicing, the
   driver's default), judged with ``compare_modes`` (time-slicing must keep at most 0.7 each);
5. ``probe``: ``gpuconf probe --backend mps`` (the node checks on MPS, with pinned memory limits).

It writes ``summary.json`` and ``summary.txt`` under the folder it names (``--out``, default
``gpu-check-results/<UTC time>``) and exits 0 when every judgement passed, 1 when one failed, 2 when
the machine has no usable GPU. On a machine without a GPU it says so and writes the summary too.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from conformance.judgements import (  # noqa: E402 - after the checkout is on the path
    REAL,
    compare_modes,
    judge_boundary,
    tolerance_mib,
)

MIB = 1 << 20
PART_TIMEOUT_S = 90
PROBE_TIMEOUT_S = 240
COMPUTE_S = 3.0


def workload(plan: dict[str, Any], out: Path, name: str, timeout: float = PART_TIMEOUT_S) -> dict[str, Any]:
    """Run the workload with the CuPy backend; its full result (and its log beside it)."""
    result = out / f"{name}.result.json"
    log = out / f"{name}.log"
    command = [
        sys.executable,
        "-m",
        "workloads.allocate",
        "--backend",
        "cupy",
        "--plan",
        json.dumps(plan),
        "--termination-path",
        str(out / f"{name}.termination"),
        "--full-result",
        str(result),
    ]
    try:
        with log.open("w") as f:
            proc = subprocess.run(command, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "error": {"message": f"no result within {timeout} s"}}
    if not result.exists():
        return {
            "status": "no-result",
            "exit_code": proc.returncode,
            "error": {"message": log.read_text()[-500:]},
        }
    data: dict[str, Any] = json.loads(result.read_text())
    return data


def step(result: dict[str, Any], op: str, nth: int = -1) -> dict[str, Any]:
    steps = [s for s in result.get("steps") or [] if s.get("op") == op]
    return dict(steps[nth]) if steps else {}


def used(result: dict[str, Any], nth: int) -> int | None:
    devices = step(result, "meminfo", nth).get("devices") or []
    return int(devices[0]["used"]) if devices else None


def part_context(out: Path) -> dict[str, Any]:
    r = workload(
        {"name": "context", "steps": [{"op": "meminfo"}, {"op": "alloc", "bytes": 1}, {"op": "meminfo"}]},
        out,
        "context",
    )
    devices = step(r, "meminfo", 0).get("devices") or []
    return {
        "status": r.get("status"),
        "device": (r.get("devices") or [{}])[0],
        "usedAtStartMiB": (used(r, 0) or 0) / MIB,
        "note": "used memory of the device as this process first sees it: its context, plus anything "
        "the driver reserves and other processes hold (run on an idle GPU)",
        "totalMiB": int(devices[0]["total"]) / MIB if devices else None,
    }


def part_granularity(out: Path) -> dict[str, Any]:
    sizes = [1, MIB + 1, 3 * MIB, 5 * MIB]
    steps: list[dict[str, Any]] = [{"op": "meminfo"}]
    for n in sizes:
        steps += [{"op": "alloc", "bytes": n}, {"op": "meminfo"}]
    r = workload({"name": "granularity", "steps": steps}, out, "granularity")
    costs = []
    for i, n in enumerate(sizes):
        before, after = used(r, i), used(r, i + 1)
        costs.append(
            {"bytes": n, "chargedMiB": None if before is None or after is None else (after - before) / MIB}
        )
    charged = [c["chargedMiB"] for c in costs if c["chargedMiB"]]
    return {
        "status": r.get("status"),
        "allocations": costs,
        "smallestChargeMiB": min(charged) if charged else None,
    }


def part_boundary(out: Path, total_mib: int | None) -> dict[str, Any]:
    r = workload(
        {
            "name": "boundary",
            "steps": [{"op": "alloc-until-oom", "granularity": 2 * MIB}, {"op": "touch"}, {"op": "meminfo"}],
        },
        out,
        "boundary",
    )
    search = step(r, "alloc-until-oom")
    found = int(search.get("max_bytes") or 0) // MIB
    limit = total_mib or 0
    verdict = judge_boundary(found, limit, REAL, "the CuPy workload")
    return {
        "status": r.get("status"),
        "search": {k: search.get(k) for k in ("max_bytes", "allocs", "failures", "stopped_by", "oom")},
        "touched": step(r, "touch").get("outcome"),
        "verdict": verdict.as_fact()
        | {"problem": verdict.problem, "toleranceRule": tolerance_mib(limit, REAL)},
    }


def part_kernels(out: Path) -> dict[str, Any]:
    solo = workload(
        {
            "name": "solo",
            "steps": [
                {"op": "calibrate", "seconds": 0.5},
                {"op": "compute", "seconds": COMPUTE_S, "matrix": "calibrated"},
            ],
        },
        out,
        "solo",
    )
    matrix = step(solo, "calibrate").get("matrix") or 1024
    pair: dict[str, dict[str, Any]] = {}
    plan = {"name": "pair", "steps": [{"op": "compute", "seconds": COMPUTE_S, "matrix": matrix}]}

    def run(name: str) -> None:
        pair[name] = workload(plan, out, name)

    threads = [threading.Thread(target=run, args=(n,)) for n in ("pair-0", "pair-1")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    figures = compare_modes(
        step(solo, "compute"), step(pair["pair-0"], "compute"), step(pair["pair-1"], "compute")
    )
    ratios = [r for r in figures["sharedOverSolo"] if r is not None]
    problems = []
    if not ratios:
        problems.append("no throughput figures")
    elif max(ratios) > 0.7:
        problems.append(
            f"two processes without MPS (time-slicing) kept {max(ratios):.0%} of their solo throughput: "
            "more than 0.7, which the suite would read as not taking turns"
        )
    return {
        "calibration": step(solo, "calibrate"),
        "timeSlicingWithoutMps": figures,
        "problems": problems,
    }


def part_probe(out: Path) -> dict[str, Any]:
    report = out / "probe"
    command = [
        sys.executable,
        "-m",
        "conformance.cli",
        "probe",
        "--backend",
        "mps",
        "--report-dir",
        str(report),
    ]
    try:
        with (out / "probe.log").open("w") as f:
            proc = subprocess.run(
                command, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, timeout=PROBE_TIMEOUT_S
            )
        rc: int | str = proc.returncode
    except subprocess.TimeoutExpired:
        rc = "timeout"
    return {"exit": rc, "log": "probe.log", "reportDir": "probe/"}


def nvidia_smi(out: Path) -> dict[str, Any]:
    try:
        proc = subprocess.run(
            [
                "nvidia-smi",
                "--query-gpu=index,uuid,name,memory.total,driver_version",
                "--format=csv,noheader",
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return {"error": str(exc)}
    (out / "nvidia-smi.txt").write_text(proc.stdout + proc.stderr)
    return {"exit": proc.returncode, "gpus": proc.stdout.strip().splitlines()}


def text_summary(summary: dict[str, Any]) -> str:
    lines = [f"gpuconf gpu-check, {summary['at']} ({summary['seconds']} s): {summary['verdict']}"]
    lines.append(f"nvidia-smi: {summary['nvidiaSmi'].get('gpus') or summary['nvidiaSmi']}")
    c = summary.get("context") or {}
    lines.append(f"context: used at start {c.get('usedAtStartMiB')} MiB of {c.get('totalMiB')} MiB")
    g = summary.get("granularity") or {}
    lines.append(f"granularity: smallest charge {g.get('smallestChargeMiB')} MiB; {g.get('allocations')}")
    b = (summary.get("boundary") or {}).get("verdict") or {}
    lines.append(
        f"boundary: found {b.get('foundMiB')} MiB of {b.get('limitMiB')} MiB (gap {b.get('gapMiB')}, "
        f"tolerance {b.get('toleranceMiB')}): {'ok' if b.get('ok') else b.get('problem')}"
    )
    k = summary.get("kernels") or {}
    f = k.get("timeSlicingWithoutMps") or {}
    lines.append(
        f"kernels: calibrated matrix {(k.get('calibration') or {}).get('matrix')}; two processes keep "
        f"{f.get('sharedOverSolo')} of solo throughput; {'; '.join(k.get('problems') or []) or 'ok'}"
    )
    lines.append(f"probe --backend mps: exit {(summary.get('probe') or {}).get('exit')}")
    for p in summary["problems"]:
        lines.append(f"PROBLEM: {p}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    p.add_argument("--out", type=Path, default=ROOT / "gpu-check-results" / stamp)
    p.add_argument("--skip-probe", action="store_true")
    args = p.parse_args(argv)
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    summary: dict[str, Any] = {"at": stamp, "host": os.uname().nodename, "problems": []}
    summary["nvidiaSmi"] = nvidia_smi(out)
    summary["context"] = part_context(out)
    rc = 0
    if summary["context"].get("status") not in ("ok",):
        summary["problems"].append(f"the CuPy workload did not run: {summary['context']}")
        rc = 2
    else:
        total = summary["context"].get("totalMiB")
        summary["granularity"] = part_granularity(out)
        summary["boundary"] = part_boundary(out, int(total) if total else None)
        summary["kernels"] = part_kernels(out)
        if not args.skip_probe:
            summary["probe"] = part_probe(out)
        verdict = summary["boundary"]["verdict"]
        if not verdict["ok"]:
            summary["problems"].append(f"boundary: {verdict['problem']}")
        summary["problems"] += [f"kernels: {x}" for x in summary["kernels"]["problems"]]
        if "probe" in summary and summary["probe"]["exit"] != 0:
            summary["problems"].append(f"gpuconf probe --backend mps exited {summary['probe']['exit']}")
        rc = 1 if summary["problems"] else 0
    summary["seconds"] = round(time.monotonic() - began, 1)
    summary["verdict"] = {0: "passed", 1: "failed", 2: "no usable GPU"}[rc]
    (out / "summary.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    (out / "summary.txt").write_text(text_summary(summary))
    print(text_summary(summary), end="")
    print(f"gpu-check: summary in {out}/summary.json and summary.txt")
    return rc


if __name__ == "__main__":
    sys.exit(main())

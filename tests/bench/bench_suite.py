"""The whole conformance suite's wall time, serial and with two workers, against a sandbox of its own.

Prints one JSON object. Measurements, not pass/fail.

A sandbox as ``gpuconf sandbox up`` makes it (control plane, reference scheduler, and per node the
simulated device, the reference agent and the simulated kubelet), on free ports in a temporary
folder. Then ``--runs`` pairs of ``gpuconf run --kubeconfig K --scheduler-name gpuconf-reference``
over every profile (scheduler, node, stack): one serial, one with ``-n 2``, back to back, in
alternating order (the first of a pair warms nothing the second lacks). Each run is timed from the
command's start to its exit (interpreter, preflight, checks, cleanup and reports included), and its
own ``durationSeconds`` is kept too. A machine this noisy makes absolute figures drift between
runs, so the comparison is made within each pair (``speedup_n2``: serial seconds / ``-n 2``
seconds of the same pair) and its median reported.

    .venv/bin/python tests/bench/bench_suite.py [--runs 3] [--check ID ...] [--fidelity ideal|h200]

``--fidelity h200`` runs it on simulated H200s (``enforcement.sim.fidelity``), each run told the
reference agent's reaction period there (``--reaction-period``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from fixtures.sandbox.controlplane import Ports, Sandbox, SandboxConfig  # noqa: E402

SCHEDULER = "gpuconf-reference"


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def reference_sandbox(work: Path, fidelity: str) -> Sandbox:
    """A sandbox as ``gpuconf sandbox up`` makes it (the reference scheduler, and per node the
    simulated device, the reference agent and the simulated kubelet), on free ports under ``work``."""
    config = SandboxConfig(
        state_dir=work / "sandbox",
        ports=Ports.free(),
        schedulers=("reference",),
        node_runtime=True,
        fidelity=fidelity,
    )
    return Sandbox(config)


def one_run(
    kubeconfig: Path, out: Path, workers: int, checks: list[str], fidelity: str = "ideal"
) -> dict[str, Any]:
    from conformance.mutate import reaction_period
    from fixtures.sandbox.scheduler.component import SANDBOX_RETRY_S

    argv = [sys.executable, "-m", "conformance.cli", "run", "--kubeconfig", str(kubeconfig)]
    argv += ["--scheduler-name", SCHEDULER, "--report-dir", str(out), "-n", str(workers)]
    # What the sandbox's reference components declare, as `gpuconf run --dir` and the mutation run
    # tell the suite: without the retry period, memory-fit, mode-separation and node-readiness each
    # watch a Pod that must stay unbound for the window of a scheduler that declares none (about 23 s
    # each, a minute per run, against about 4.5 s).
    argv += [f"--reaction-period={reaction_period(fidelity):g}", f"--retry-period={SANDBOX_RETRY_S:g}"]
    for check in checks:
        argv += ["--check", check]
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=1800)
    wall = time.monotonic() - started
    record = json.loads((out / "run.json").read_text()) if (out / "run.json").exists() else {}
    outcomes: dict[str, int] = {}
    for result in record.get("results", []):
        outcomes[result["outcome"]] = outcomes.get(result["outcome"], 0) + 1
    if done.returncode != 0:
        log(f"-n {workers}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-2000:]}")
    return {
        "workers": workers,
        "wall_s": round(wall, 1),
        "run_s": round(float(record.get("durationSeconds") or 0), 1),
        "exit_code": done.returncode,
        "outcomes": outcomes,
    }


def summary(values: list[float]) -> dict[str, Any]:
    return {
        "runs": values,
        "median": round(statistics.median(values), 2),
        "min": min(values),
        "max": max(values),
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--runs", type=int, default=3, help="pairs of runs (serial, -n 2)")
    parser.add_argument("--check", action="append", default=[], help="only these checks (default: all)")
    parser.add_argument("--fidelity", choices=("ideal", "h200"), default="ideal", help="the simulated GPUs")
    args = parser.parse_args()
    bench = "suite" if args.fidelity == "ideal" else f"suite-{args.fidelity}"
    figures: dict[str, Any] = {
        "bench": bench,
        "fidelity": args.fidelity,
        "cores": os.cpu_count(),
        "pairs": args.runs,
    }
    with tempfile.TemporaryDirectory(prefix="gsuite-", dir="/tmp") as tmp:
        work = Path(tmp)
        box = reference_sandbox(work, args.fidelity)
        started = time.monotonic()
        box.up(log=log)
        figures["sandbox_up_s"] = round(time.monotonic() - started, 1)
        try:
            pairs = []
            for i in range(args.runs):
                order = (1, 2) if i % 2 == 0 else (2, 1)
                pair = {}
                for workers in order:
                    log(f"pair {i + 1}/{args.runs}: -n {workers} ...")
                    pair[workers] = one_run(
                        box.kubeconfig, work / f"run-{i}-n{workers}", workers, args.check, args.fidelity
                    )
                    log(f"  {pair[workers]}")
                pairs.append(pair)
        finally:
            box.down()
    serial = [p[1]["wall_s"] for p in pairs]
    parallel = [p[2]["wall_s"] for p in pairs]
    figures["checks"] = sum(pairs[0][1]["outcomes"].values())
    figures["serial_s"] = summary(serial)
    figures["parallel2_s"] = summary(parallel)
    figures["speedup_n2"] = summary([round(s / p, 2) for s, p in zip(serial, parallel, strict=True)])
    figures["runs"] = [{"pair": i + 1, "serial": p[1], "parallel2": p[2]} for i, p in enumerate(pairs)]
    figures["all_passed"] = all(
        set(p[w]["outcomes"]) == {"passed"} and p[w]["exit_code"] == 0 for p in pairs for w in (1, 2)
    )
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())

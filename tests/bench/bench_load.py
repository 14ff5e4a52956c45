"""Verdicts idle and loaded, side by side: the suite and the quick mutation run, on a quiet machine and
beside a CPU hog. Prints one JSON object (``make bench-load``). Measurements, not pass/fail.

A verdict must not depend on how busy the machine is: a real GPU node in a busy cluster is loaded
too, and a verdict that changes with load is a false failure waiting for a vendor. So, per fidelity
(``--fidelity``, both by default), this runs

- the whole suite (every profile, serial) against the reference stack, on a sandbox of its own, and
- ``gpuconf mutate --quick`` (every seeded fault on its expected checks),

once on an idle machine and once beside ``--hog`` busy processes (twice the cores by default, each
``python3 -c 'while True: pass'``, started before the sandbox and stopped after the run), and reports
each check's outcome and each fault's verdict under both conditions, the differences first. Where
load leaves a check unjudged, its outcome is ``error`` (not judged, with the figures in its
evidence), which this lists as a difference too: the goal is none.

    .venv/bin/python tests/bench/bench_load.py [--fidelity ideal|h200 ...] [--hog N] [--no-mutation]
        [--check ID ...]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.repeat import hog_command, start_hog, stop  # noqa: E402

CONDITIONS = ("idle", "loaded")


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@contextmanager
def condition(name: str, hog: int) -> Iterator[None]:
    procs = start_hog(hog) if name == "loaded" else []
    try:
        yield
    finally:
        stop(procs)


def suite_outcomes(fidelity: str, work: Path, checks: Sequence[str]) -> dict[str, Any]:
    """Every check's outcome of one whole run against the reference stack, on a sandbox of its own."""
    from bench_suite import reference_sandbox  # beside this script

    from conformance.mutate import reaction_period
    from fixtures.sandbox.scheduler.component import SANDBOX_RETRY_S

    box = reference_sandbox(work, fidelity)
    box.up(log=log)
    try:
        out = work / "run"
        argv = [sys.executable, "-m", "conformance.cli", "run", "--kubeconfig", str(box.kubeconfig)]
        argv += ["--scheduler-name", "gpuconf-reference", "--report-dir", str(out)]
        argv += [f"--reaction-period={reaction_period(fidelity):g}", f"--retry-period={SANDBOX_RETRY_S:g}"]
        for check in checks:
            argv += ["--check", check]
        began = time.monotonic()
        done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=3600)
        wall = round(time.monotonic() - began, 1)
    finally:
        box.down()
    record = json.loads((out / "run.json").read_text()) if (out / "run.json").exists() else {}
    return {
        "wall_s": wall,
        "exit_code": done.returncode,
        "outcomes": {r["key"]: r["outcome"] for r in record.get("results", [])},
        "reasons": {
            r["key"]: (r.get("reason") or "")[:300]
            for r in record.get("results", [])
            if r["outcome"] != "passed"
        },
    }


def mutation_verdicts(fidelity: str, work: Path) -> dict[str, Any]:
    """The quick mutation run: the control's exit code and each seeded fault's verdict."""
    out = work / "mutation"
    argv = [sys.executable, "-m", "conformance.cli", "mutate", "--quick", "--control-workers=2"]
    argv += [f"--fidelity={fidelity}", f"--report-dir={out}"]
    began = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=5400)
    wall = round(time.monotonic() - began, 1)
    report = out / "mutation.json"
    data = json.loads(report.read_text()) if report.exists() else {}
    return {
        "wall_s": wall,
        "exit_code": done.returncode,
        "control_exit_code": (data.get("control") or {}).get("exitCode"),
        "verdicts": {f"{f['kind']}:{f['fault']}": f["verdict"] for f in data.get("faults", [])},
    }


def differences(by_condition: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    """The keys whose value is not the same under every condition (a key missing in one counts)."""
    keys = sorted(set().union(*(set(v) for v in by_condition.values())))
    return {
        k: {c: by_condition[c].get(k, "missing") for c in by_condition}
        for k in keys
        if len({by_condition[c].get(k, "missing") for c in by_condition}) > 1
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--fidelity", action="append", choices=("ideal", "h200"), help="repeatable (default: both)"
    )
    parser.add_argument(
        "--hog", type=int, default=2 * (os.cpu_count() or 1), help="busy processes when loaded"
    )
    parser.add_argument("--no-mutation", action="store_true", help="the suite only")
    parser.add_argument("--check", action="append", default=[], help="only these checks of the suite")
    args = parser.parse_args(argv)
    fidelities = args.fidelity or ["ideal", "h200"]
    figures: dict[str, Any] = {
        "bench": "load",
        "cores": os.cpu_count(),
        "hog": {"processes": args.hog, "command": " ".join(hog_command()[1:])},
        "fidelities": {},
    }
    with tempfile.TemporaryDirectory(prefix="gload-", dir="/tmp") as tmp:
        for fidelity in fidelities:
            suite: dict[str, Any] = {}
            mutation: dict[str, Any] = {}
            for name in CONDITIONS:
                work = Path(tmp) / fidelity / name
                work.mkdir(parents=True)
                with condition(name, args.hog):
                    log(f"== {fidelity}, {name}: the whole suite ...")
                    suite[name] = suite_outcomes(fidelity, work, args.check)
                    log(f"   {suite[name]['wall_s']} s, exit {suite[name]['exit_code']}")
                    if not args.no_mutation:
                        log(f"== {fidelity}, {name}: the quick mutation run ...")
                        mutation[name] = mutation_verdicts(fidelity, work)
                        log(f"   {mutation[name]['wall_s']} s, exit {mutation[name]['exit_code']}")
            entry: dict[str, Any] = {
                "suite": suite,
                "suiteDifferences": differences({c: suite[c]["outcomes"] for c in CONDITIONS}),
            }
            if mutation:
                entry["mutation"] = mutation
                entry["mutationDifferences"] = differences({c: mutation[c]["verdicts"] for c in CONDITIONS})
            figures["fidelities"][fidelity] = entry
    figures["sameVerdicts"] = all(
        not e["suiteDifferences"] and not e.get("mutationDifferences") for e in figures["fidelities"].values()
    )
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``make test-loaded``: ``make test`` N times in a row with a CPU hog beside it, and every failure named.

A test that fails once under load is a defect of the test or of the product, never bad luck (CI
runs on two busy cores). This is how the claim "the loop never flakes" is measured: the whole of
``make test``, ``--runs`` times one after the other, while ``--hog`` busy processes (by default
twice the machine's cores, each ``python3 -c 'while True: pass'`` at the tests' own priority) compete
for every core. Each run's output goes to ``<out>/run-<i>.log``; the failures are read from pytest's
short summary (``-rfE``: ``FAILED``/``ERROR`` lines, the test's id and the first line of its
reason) and printed per run, then in a table at the end, and written to ``<out>/summary.json``.

    .venv/bin/python tests/repeat.py [--runs 5] [--hog N] [--out DIR] [-- MAKE ARGS ...]

Exit status: 0 when every run passed, 1 when any run failed (each failure named), 130 on Ctrl-C (the
hog and the run in flight are stopped first; ``make test``'s own cleanup runs).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HOG_CODE = "while True: pass"
SUMMARY_LINE = re.compile(r"^(FAILED|ERROR) (\S+)(?: - (.*))?$")


@dataclass
class Failure:
    test: str
    kind: str
    """``FAILED`` or ``ERROR`` (pytest's words)."""
    first_line: str


@dataclass
class Run:
    index: int
    exit_code: int
    wall_s: float
    log: str
    failures: list[Failure] = field(default_factory=list)


def failures_in(output: str) -> list[Failure]:
    """The tests pytest's short summary names as failed or errored, each with its reason's first line."""
    found: list[Failure] = []
    for line in output.splitlines():
        match = SUMMARY_LINE.match(line.strip())
        if match:
            found.append(Failure(match.group(2), match.group(1), (match.group(3) or "").strip()))
    return found


def hog_command() -> list[str]:
    return [sys.executable, "-c", HOG_CODE]


def start_hog(count: int) -> list[subprocess.Popen[bytes]]:
    return [subprocess.Popen(hog_command(), start_new_session=True) for _ in range(count)]


def stop(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
    for proc in procs:
        proc.wait()


def one_run(index: int, out: Path, make_args: Sequence[str]) -> Run:
    log = out / f"run-{index}.log"
    argv = ["make", "test", "PYTEST_ARGS=-p no:cacheprovider -rfE", *make_args]
    began = time.monotonic()
    with log.open("w") as sink:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        assert proc.stdout is not None
        try:
            for line in proc.stdout:
                sink.write(line)
                if SUMMARY_LINE.match(line.strip()):
                    print(f"  run {index}: {line.rstrip()}", flush=True)
            code = proc.wait()
        except KeyboardInterrupt:
            proc.send_signal(signal.SIGINT)  # make test's runner cleans up its halves on SIGINT
            proc.wait()
            raise
    run = Run(index, code, round(time.monotonic() - began, 1), str(log), failures_in(log.read_text()))
    if code != 0 and not run.failures:
        # A failure pytest did not summarise (set-up, lint, a crash): its last line is the reason.
        tail = [line for line in log.read_text().splitlines() if line.strip()][-1:]
        run.failures.append(Failure("make test", "ERROR", tail[0] if tail else f"exit {code}"))
    return run


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="how many make test runs, one after the other")
    parser.add_argument(
        "--hog", type=int, default=2 * (os.cpu_count() or 1), help="busy processes beside the runs (0: none)"
    )
    parser.add_argument("--out", type=Path, default=ROOT / ".repeat", help="where each run's log goes")
    parser.add_argument("make_args", nargs="*", help="more arguments for make test (after --)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    hog_text = " ".join(hog_command()[:2]) + f" '{HOG_CODE}'"
    print(f"make test-loaded: {args.runs} run(s) of make test beside {args.hog} x `{hog_text}`", flush=True)
    hog = start_hog(args.hog)
    runs: list[Run] = []
    try:
        for index in range(1, args.runs + 1):
            print(f"== run {index}/{args.runs}", flush=True)
            run = one_run(index, args.out, args.make_args)
            runs.append(run)
            print(
                f"== run {index}: exit {run.exit_code} in {run.wall_s} s, {len(run.failures)} failure(s)",
                flush=True,
            )
    except KeyboardInterrupt:
        return 130
    finally:
        stop(hog)
    summary = {
        "runs": [asdict(r) for r in runs],
        "hog": {"processes": args.hog, "command": hog_text, "cores": os.cpu_count()},
        "failed_runs": sum(1 for r in runs if r.exit_code != 0),
    }
    (args.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"\n{'run':>4} {'exit':>5} {'wall s':>8}  failures")
    for run in runs:
        names = "; ".join(f"{f.kind} {f.test}: {f.first_line}" for f in run.failures) or "-"
        print(f"{run.index:>4} {run.exit_code:>5} {run.wall_s:>8}  {names}")
    print(f"{summary['failed_runs']} of {len(runs)} run(s) failed; logs and summary.json in {args.out}")
    return 1 if summary["failed_runs"] else 0


if __name__ == "__main__":
    raise SystemExit(main())

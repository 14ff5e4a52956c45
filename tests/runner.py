"""``make test``'s runner: the unit half, then the integration half; or both at once (``--beside``).

By default the halves run one after the other, each on its own xdist workers. ``--beside`` (``make test
TEST_BESIDE=1``) runs the unit half beside the integration half at ``nice`` 10: the integration tests
mostly wait (on Pods, sandboxes, a process's start; on 2 cores three workers keep about 1.4 of them
busy) and the CPU-bound unit tests take what they leave idle. On 2 cores that took 516-551 s against
645 s, but it starves the unit tests that measure real time (kernel rates of the simulated device,
kernels per second), and three of them failed in six runs that way; it suits a machine with cores to
spare. The integration half then keeps the terminal and the unit half's output is printed after it.

Exit status: the unit half's when it failed, else the integration half's; 1 when either collected no
tests (pytest's 5 must never pass for success); 130 on Ctrl-C, once the running halves have cleaned
up. ``--serial`` (``make test TEST_WORKERS=0``): one half after the other, no xdist.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from functools import partial
from pathlib import Path

NO_TESTS = 5  # pytest's exit code when it collected nothing


def xdist(workers: int) -> list[str]:
    return ["-n", str(workers), "--dist", "loadfile"] if workers > 0 else []


def pytest_argv(path: str, workers: int, extra: Sequence[str]) -> list[str]:
    return [sys.executable, "-m", "pytest", path, *xdist(workers), *extra]


def verdict(unit: int, integration: int) -> int:
    if NO_TESTS in (unit, integration):
        print("make test: pytest collected no tests: failing", file=sys.stderr)
        return 1
    return unit if unit != 0 else integration


def run_one_after_the_other(args: argparse.Namespace, extra: list[str]) -> int:
    unit_workers, integration_workers = (
        (0, 0) if args.serial else (args.unit_workers, args.integration_workers)
    )
    results = []
    for argv in (
        pytest_argv(args.unit, unit_workers, extra),
        pytest_argv(args.integration, integration_workers, [*args.integration_args, *extra]),
    ):
        proc = subprocess.Popen(argv)
        try:
            results.append(proc.wait())
        except KeyboardInterrupt:
            _stop(proc)  # its own cleanup first (subprocess.call would kill it in the middle of it)
            return 130
    return verdict(*results)


def run_beside(args: argparse.Namespace, extra: list[str]) -> int:
    with tempfile.NamedTemporaryFile("w+b", prefix="gpuconf-unit-", suffix=".log", delete=False) as log:
        log_path = Path(log.name)
    print(
        f"make test: the unit tests run beside the integration tests (nice {args.nice}, "
        f"{args.unit_workers or 'no'} xdist workers); their output follows the integration tests' "
        f"(meanwhile in {log_path})",
        flush=True,
    )
    interrupted = False
    with open(log_path, "wb") as out:
        unit = subprocess.Popen(
            pytest_argv(args.unit, args.unit_workers, extra),
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=partial(os.nice, args.nice),  # noqa: PLW1509 - one nice call, nothing else runs there
        )
        integration = subprocess.Popen(
            pytest_argv(args.integration, args.integration_workers, [*args.integration_args, *extra])
        )
        halves = (integration, unit)

        def forward(signum: int, _frame: object) -> None:
            for proc in halves:  # a SIGTERM to the runner (a CI's timeout) stops both halves too
                if proc.poll() is None:
                    proc.send_signal(signum)

        signal.signal(signal.SIGTERM, forward)
        try:
            integration_rc, unit_rc = integration.wait(), unit.wait()
        except KeyboardInterrupt:
            # Ctrl-C reached both halves (one process group): each pytest stops its own tests and
            # cleans up (its sandboxes, its Pods); wait for that rather than kill them mid-cleanup.
            interrupted = True
            integration_rc, unit_rc = _stop(integration), _stop(unit)
    sys.stdout.flush()
    print(f"\n== the unit tests (exit {unit_rc}):", flush=True)
    sys.stdout.buffer.write(log_path.read_bytes())
    sys.stdout.flush()
    log_path.unlink(missing_ok=True)
    return 130 if interrupted else verdict(unit_rc, integration_rc)


def _stop(proc: subprocess.Popen[bytes], grace_s: float = 120.0) -> int:
    """Wait for a half that was interrupted to finish its cleanup; SIGTERM it after ``grace_s``."""
    try:
        return proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        return proc.wait()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="tests/runner.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--unit", default="tests/unit", help="the unit half's path (tests/unit)")
    parser.add_argument(
        "--integration", default="tests/integration", help="the integration half's path (tests/integration)"
    )
    parser.add_argument("--unit-workers", type=int, default=2, help="xdist workers of the unit half (2)")
    parser.add_argument(
        "--integration-workers", type=int, default=3, help="xdist workers of the integration half (3)"
    )
    parser.add_argument("--nice", type=int, default=10, help="the unit half's niceness (10)")
    parser.add_argument("--serial", action="store_true", help="one half after the other, no xdist")
    parser.add_argument(
        "--beside", action="store_true", help="the unit half beside the integration half, at --nice"
    )
    parser.add_argument(
        "--integration-arg",
        dest="integration_args",
        action="append",
        default=[],
        help="an argument for the integration half's pytest only (repeatable)",
    )
    parser.add_argument("pytest_args", nargs=argparse.REMAINDER, help="after --: for both halves' pytest")
    args = parser.parse_args(argv)
    extra = args.pytest_args[1:] if args.pytest_args[:1] == ["--"] else args.pytest_args
    if args.beside and not args.serial:
        return run_beside(args, extra)
    return run_one_after_the_other(args, extra)


if __name__ == "__main__":
    sys.exit(main())

"""Sandbox figures: build time of the upstream binaries, `up` time (fresh and reused), RSS, `down` time.

Prints one JSON object. Measurements, not pass/fail (targets: warm `up` <= 10 s on 2 cores).
The cold build is measured only with --cold (it builds into a throw-away cache, 15-30 min);
otherwise the figure recorded by the build that filled the cache is reported.

    .venv/bin/python tests/bench/bench_sandbox.py [--cold] [--full] [--topology scale]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchlib import rss_mib  # noqa: E402

from fixtures.sandbox import binaries  # noqa: E402
from fixtures.sandbox.controlplane import Ports, Sandbox, SandboxConfig  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--cold", action="store_true", help="measure a cold build into a temporary cache")
    parser.add_argument("--topology", default="default")
    parser.add_argument("--runs", type=int, default=3, help="fresh `up`/`down` cycles to time")
    parser.add_argument(
        "--full",
        action="store_true",
        help="as `gpuconf sandbox up` runs it: plus the reference scheduler and, per node, the simulated "
        "device, the node agent and the simulated kubelet (default: the control plane alone)",
    )
    args = parser.parse_args()
    quiet = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731

    figures: dict = {
        "bench": "sandbox",
        "cores": os.cpu_count(),
        "topology": args.topology,
        "components": "control plane + reference scheduler + node runtime" if args.full else "control plane",
    }
    if args.cold:
        with tempfile.TemporaryDirectory() as cache:
            os.environ[binaries.ENV_CACHE_DIR] = cache
            t0 = time.monotonic()
            binaries.ensure_binaries(log=quiet)
            figures["cold_build_s"] = round(time.monotonic() - t0, 1)
            del os.environ[binaries.ENV_CACHE_DIR]
    found = binaries.ensure_binaries(log=quiet)
    record = found.directory / "build.json"
    if record.exists():
        figures["recorded_build"] = json.loads(record.read_text())

    ups, reuses, downs = [], [], []
    with tempfile.TemporaryDirectory() as state:
        for i in range(args.runs):
            config = SandboxConfig(
                state_dir=Path(state) / f"s{i}",
                ports=Ports.free(),
                topology=args.topology,
                schedulers=("reference",) if args.full else (),
                node_runtime=args.full,
            )
            box = Sandbox(config)
            t0 = time.monotonic()
            box.up(log=quiet)
            ups.append(round(time.monotonic() - t0, 2))
            t0 = time.monotonic()
            assert box.up(log=quiet).reused
            reuses.append(round(time.monotonic() - t0, 2))
            if i == 0:
                time.sleep(5)  # let the processes settle before reading memory
                procs = json.loads(box.state_file.read_text())["processes"]
                figures["rss_mib"] = {name: rss_mib(rec["pid"]) for name, rec in procs.items()}
            t0 = time.monotonic()
            box.down()
            downs.append(round(time.monotonic() - t0, 2))
    figures["warm_up_s"] = {"runs": ups, "max": max(ups), "target": 10}
    figures["reuse_up_s"] = {"runs": reuses, "max": max(reuses)}
    figures["down_s"] = {"runs": downs, "max": max(downs)}
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``gpuconf run``: the conformance run, against the embedded sandbox by default.

Today it does the part every later run starts with: brings the sandbox up (building the
upstream binaries once if needed), shows the simulated GPU nodes the suite will use, and
writes a small run record. It says plainly that no conformance checks exist yet, so
nobody mistakes this for a verdict; the checks, the node agent and the reports come with
their own issues and plug in here.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from pathlib import Path

from fixtures.sandbox.cli import add_sandbox_options, print_nodes, sandbox_from_args
from fixtures.sandbox.errors import SandboxError


def cmd_run(args: argparse.Namespace) -> int:
    sandbox = sandbox_from_args(args)
    try:
        result = sandbox.up(log=lambda m: print(m, file=sys.stderr, flush=True))
    except SandboxError as exc:
        print(f"gpuconf: error: {exc}", file=sys.stderr)
        return 1
    print(f"sandbox {'reused' if result.reused else 'up'} in {result.seconds:.1f} s: {sandbox.server}")
    print_nodes(sandbox)
    args.output_dir.mkdir(parents=True, exist_ok=True)
    record = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cluster": {"kind": "gpuconf-sandbox", "server": sandbox.server, "nodes": result.nodes},
        "simulated": ["nodes", "kubelet", "gpus"],
        "checks": [],
        "verdict": "no conformance checks in this version of gpuconf yet; nothing was judged",
    }
    out = args.output_dir / "run.json"
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(
        f"\n{record['verdict']}\nrun record: {out}\nsandbox left running; stop it with `gpuconf sandbox down`"
    )
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("run", help="run the conformance suite (against the embedded sandbox)")
    add_sandbox_options(parser)
    parser.add_argument("--output-dir", type=Path, default=Path("gpuconf-results"), help="where results go")
    parser.set_defaults(func=cmd_run)

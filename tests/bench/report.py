"""Collect the benchmarks' JSON into ``docs/benchmarks.json`` and render ``docs/benchmarks.md``.

    .venv/bin/python tests/bench/report.py RESULTS_DIR [--json docs/benchmarks.json] [--md docs/benchmarks.md]

``RESULTS_DIR`` holds one file per benchmark, ``<name>.json``, with what its script printed, once
per repetition (``make bench`` runs each a few times; one JSON object per run, on one line or
pretty-printed). Each figure below is read from every run of its benchmark and reported as the
median over them (a figure that is itself a list of runs, such as ``bench_sandbox.py``'s ``up``
times, contributes every element). Figures that compare two things (``-n 2`` against serial) are
ratios taken within one run of the benchmark, never across runs: the machine is too noisy for that.

A figure this collection has no result for keeps its earlier value from ``--json`` (with its own
date and machine), or reads "not measured yet".
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PY = ".venv/bin/python tests/bench"


@dataclass(frozen=True)
class Figure:
    id: str
    label: str
    source: str
    """The results file's stem (``suite`` for ``suite.json``)."""
    path: tuple[str, ...]
    unit: str
    command: str
    target: str = ""
    digits: int = 1


FIGURES: tuple[Figure, ...] = (
    Figure(
        "suite-serial",
        "Whole suite, serial (`gpuconf run`, profiles scheduler, node, stack)",
        "suite",
        ("serial_s", "runs"),
        "s",
        f"{PY}/bench_suite.py --runs 3",
    ),
    Figure(
        "suite-n2",
        "Whole suite, `-n 2`",
        "suite",
        ("parallel2_s", "runs"),
        "s",
        f"{PY}/bench_suite.py --runs 3",
    ),
    Figure(
        "suite-speedup",
        "`-n 2` speed-up over serial (serial ÷ `-n 2`, each pair back to back on one sandbox)",
        "suite",
        ("speedup_n2", "runs"),
        "×",
        f"{PY}/bench_suite.py --runs 3",
        digits=2,
    ),
    Figure(
        "suite-h200-serial",
        "Whole suite on simulated H200s (`--fidelity h200`), serial",
        "suite-h200",
        ("serial_s", "runs"),
        "s",
        f"{PY}/bench_suite.py --runs 3 --fidelity h200",
    ),
    Figure(
        "suite-h200-n2",
        "Whole suite on simulated H200s, `-n 2`",
        "suite-h200",
        ("parallel2_s", "runs"),
        "s",
        f"{PY}/bench_suite.py --runs 3 --fidelity h200",
    ),
    Figure(
        "mutation-run",
        "Mutation run (`gpuconf mutate`)",
        "mutate",
        ("wall_s",),
        "s",
        ".venv/bin/gpuconf mutate",
    ),
    Figure(
        "sandbox-up-full",
        "Sandbox up, full stack (control plane, reference scheduler, per node device + agent + kubelet)",
        "sandbox-full",
        ("warm_up_s", "runs"),
        "s",
        f"{PY}/bench_sandbox.py --full --runs 3",
        target="≤ 10 s",
    ),
    Figure(
        "sandbox-up-control-plane",
        "Sandbox up, control plane only (etcd, kube-apiserver, kube-controller-manager)",
        "sandbox",
        ("warm_up_s", "runs"),
        "s",
        f"{PY}/bench_sandbox.py --runs 3",
        target="≤ 10 s",
    ),
    Figure(
        "sandbox-up-reused",
        "Sandbox up when it already runs (reused)",
        "sandbox-full",
        ("reuse_up_s", "runs"),
        "s",
        f"{PY}/bench_sandbox.py --full --runs 3",
        digits=2,
    ),
    Figure(
        "bound-started-p50",
        "Bound → started, p50 (one Pod at a time; simulated kubelet, allow-all hook)",
        "noderuntime",
        ("sequential", "p50_ms"),
        "ms",
        f"{PY}/bench_noderuntime.py --pods 100",
    ),
    Figure(
        "bound-started-p99",
        "Bound → started, p99 (one Pod at a time)",
        "noderuntime",
        ("sequential", "p99_ms"),
        "ms",
        f"{PY}/bench_noderuntime.py --pods 100",
    ),
    Figure(
        "bound-started-burst-p50",
        "Bound → started, p50, 100 Pods created at once",
        "noderuntime",
        ("burst", "p50_ms"),
        "ms",
        f"{PY}/bench_noderuntime.py --pods 100",
    ),
    Figure(
        "bound-started-burst-p99",
        "Bound → started, p99, 100 Pods created at once",
        "noderuntime",
        ("burst", "p99_ms"),
        "ms",
        f"{PY}/bench_noderuntime.py --pods 100",
    ),
    Figure(
        "pressure-reclaimed",
        "Pressure → memory reclaimed for the guaranteed client (the agent evicts the borrower)",
        "agent",
        ("eviction", "memory_reclaimed_s", "runs"),
        "s",
        f"{PY}/bench_agent.py --pods 1000 --trials 5",
        target="≤ 1 s",
        digits=3,
    ),
    Figure(
        "pressure-eviction",
        "Pressure → borrower Pod evicted (deletionTimestamp, through the Eviction API)",
        "agent",
        ("eviction", "deletion_timestamp_s", "runs"),
        "s",
        f"{PY}/bench_agent.py --pods 1000 --trials 5",
        target="≤ 1 s",
        digits=3,
    ),
    Figure(
        "agent-rss-1000",
        "Node agent RSS with 1000 fenced Pods",
        "agent",
        ("agent", "rss_mib_with_pods"),
        "MiB",
        f"{PY}/bench_agent.py --pods 1000",
    ),
    Figure(
        "agent-rss-idle",
        "Node agent RSS before the Pods",
        "agent",
        ("agent", "rss_mib_before_pods"),
        "MiB",
        f"{PY}/bench_agent.py --pods 1000",
    ),
    Figure(
        "agent-create-container-p99",
        "Agent CreateContainer (hook) latency, p99 over 1000 Pods",
        "agent",
        ("create_container_ms", "p99"),
        "ms",
        f"{PY}/bench_agent.py --pods 1000",
        digits=2,
    ),
    Figure(
        "agent-restart-ready",
        "Agent SIGKILLed with 1000 Pods: replacement ready (all re-adopted)",
        "agent",
        ("restart", "ready_s"),
        "s",
        f"{PY}/bench_agent.py --pods 1000",
        target="≤ 5 s",
        digits=2,
    ),
    Figure(
        "scheduler-1000-bound",
        "1000 fractional Pods placed on 64 nodes × 8 GPUs (first created → last bound)",
        "scheduler",
        ("all_bound_s",),
        "s",
        f"{PY}/bench_scheduler.py --pods 1000",
        target="≤ 60 s",
    ),
    Figure(
        "scheduler-decision-p99",
        "Reference scheduler decision time, p99 (wall clock, placement only)",
        "scheduler",
        ("decision_ms", "p99"),
        "ms",
        f"{PY}/bench_scheduler.py --pods 1000",
        digits=2,
    ),
    Figure(
        "scheduler-violations",
        "Contract violations among the 1000 placed Pods",
        "scheduler",
        ("violations",),
        "",
        f"{PY}/bench_scheduler.py --pods 1000",
        target="0",
        digits=0,
    ),
    Figure(
        "scheduler-rss",
        "Reference scheduler RSS with 1000 Pods bound",
        "scheduler",
        ("scheduler_rss_mib",),
        "MiB",
        f"{PY}/bench_scheduler.py --pods 1000",
    ),
    Figure(
        "simdevice-allocs",
        "Simulated GPU device: allocations per second, one client",
        "simdevice",
        ("single_client", "allocs_per_s"),
        "allocs/s",
        f"{PY}/bench_simdevice.py",
        digits=0,
    ),
)


def load_results(folder: Path) -> dict[str, list[dict[str, Any]]]:
    """Every JSON object in every ``<name>.json`` of ``folder``, by name."""
    out: dict[str, list[dict[str, Any]]] = {}
    decoder = json.JSONDecoder()
    for path in sorted(folder.glob("*.json")):
        text, at, found = path.read_text(), 0, []
        while True:
            while at < len(text) and text[at].isspace():
                at += 1
            if at >= len(text):
                break
            try:
                obj, at = decoder.raw_decode(text, at)
            except json.JSONDecodeError as exc:
                raise SystemExit(f"{path}: not JSON at character {at}: {exc}") from None
            if isinstance(obj, dict):
                found.append(obj)
        if found:
            out[path.stem] = found
    return out


def dig(obj: Any, path: tuple[str, ...]) -> Any:
    for key in path:
        if not isinstance(obj, dict) or key not in obj:
            return None
        obj = obj[key]
    return obj


def values_of(figure: Figure, runs: list[dict[str, Any]]) -> list[float]:
    values: list[float] = []
    for run in runs:
        value = dig(run, figure.path)
        for item in value if isinstance(value, list) else [value]:
            if isinstance(item, int | float) and not isinstance(item, bool):
                values.append(float(item))
    return values


def machine() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    memory = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory = round(int(line.split()[1]) / 1024 / 1024)
    except OSError:
        pass
    return {
        "cpu": model or platform.processor() or "unknown",
        "cores": os.cpu_count(),
        "memoryGiB": memory,
        "os": platform.platform(),
        "python": platform.python_version(),
    }


def machine_line(m: dict[str, Any]) -> str:
    cores, memory = m.get("cores"), m.get("memoryGiB")
    return f"{cores} cores ({m.get('cpu')}), {memory} GiB, {m.get('os')}, Python {m.get('python')}"


def short_machine(m: dict[str, Any]) -> str:
    return f"{m.get('cores')} cores, {m.get('memoryGiB')} GiB"


def commit() -> str:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT, check=True
        )
        return done.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return ""


def collect(results: dict[str, list[dict[str, Any]]], earlier: dict[str, Any]) -> dict[str, Any]:
    now = datetime.now(UTC)
    here = machine()
    before = {f["id"]: f for f in earlier.get("figures", []) if isinstance(f, dict) and "id" in f}
    figures = []
    for figure in FIGURES:
        values = values_of(figure, results.get(figure.source, []))
        entry: dict[str, Any] = {
            "id": figure.id,
            "figure": figure.label,
            "unit": figure.unit,
            "target": figure.target,
            "command": figure.command,
        }
        if values:
            middle = statistics.median(values)
            entry |= {
                "value": round(middle, figure.digits) if figure.digits else round(middle),
                "runs": values,
                "date": now.strftime("%Y-%m-%d"),
                "machine": here,
                "commit": commit(),
            }
        elif before.get(figure.id, {}).get("value") is not None:
            old = before[figure.id]
            entry |= {k: old.get(k) for k in ("value", "runs", "date", "machine", "commit")}
        else:
            entry |= {"value": None, "runs": [], "date": "", "machine": None}
        figures.append(entry)
    return {
        "generated": now.isoformat(timespec="seconds"),
        "machine": here,
        "commit": commit(),
        "figures": figures,
        "results": results,
    }


def fmt(value: Any, unit: str) -> str:
    if value is None:
        return "not measured yet"
    text = f"{value:g}" if isinstance(value, float) else str(value)
    return f"{text}{unit}" if unit == "×" else f"{text} {unit}".strip()


def spread(runs: list[float]) -> str:
    if len(runs) < 2:
        return ""
    return f"{min(runs):g}–{max(runs):g} (n={len(runs)})"


def render(data: dict[str, Any]) -> str:
    suite = (data.get("results") or {}).get("suite") or [{}]
    checks = suite[-1].get("checks", "all")
    lines = [
        "# gpuconf benchmarks",
        "",
        "Generated by `make bench` (`tests/bench/report.py`) from the JSON the scripts in `tests/bench/`",
        "print; the same figures, with every run, are in [benchmarks.json](benchmarks.json). Measurements,",
        "not pass/fail: each value is the **median** over the runs shown (min–max, n). Where two things",
        "are compared (`-n 2` against serial) the ratio is taken within one run of the benchmark, the two",
        "measured back to back on one sandbox, because this machine is shared and noisy; absolute seconds",
        "drift between runs more than such a ratio does. Everything runs on simulated GPUs (the sandbox).",
        "",
        f"Last generated {data['generated']} at commit `{data['commit'] or '?'}` on: "
        f"{machine_line(data['machine'])}.",
        "",
        "| Figure | Value | Runs (min–max, n) | Target | Reproduce | Date | Machine |",
        "|---|---|---|---|---|---|---|",
    ]
    for f in data["figures"]:
        where = short_machine(f["machine"]) if f.get("machine") else ""
        lines.append(
            f"| {f['figure']} | {fmt(f['value'], f['unit'])} | {spread(f.get('runs') or [])} | "
            f"{f['target'] or '—'} | `{f['command']}` | {f.get('date') or '—'} | {where or '—'} |"
        )
    lines += [
        "",
        "Notes:",
        "",
        f"- *Whole suite*: {checks} check items, by `gpuconf run --kubeconfig` against a sandbox of the",
        "  benchmark's own (2 nodes × 4 simulated H200), from the command's start to its exit: preflight,",
        "  every check, cleanup and the reports. Each check leases whole nodes, so two workers on two",
        "  nodes can at best halve it.",
        "- *Bound → started*: from the create request of a Pod with `spec.nodeName` set to the first",
        "  instruction of its container (the wall clock it writes), through the simulated kubelet with an",
        "  allow-all hook: the kubelet's own latency, without the agent.",
        "- *Pressure → eviction*: a borrower holds 7/8 of a GPU and a guaranteed client asks for half;",
        "  from its first refusal (pressure) to its allocation succeeding, and to the borrower Pod's",
        "  deletionTimestamp; the median is over every trial of every run.",
        '- *Mutation run*: filled in when a `mutate.json` (`{"bench": "mutate", "wall_s": ...}`) is among',
        "  the results.",
        "- *1000 Pods*: the reference scheduler on the `scale` topology (64 nodes × 8 GPUs), the Pods",
        "  created by 4 threads while it works.",
        "",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("results", type=Path, help="folder of <bench>.json files")
    parser.add_argument("--json", type=Path, default=ROOT / "docs" / "benchmarks.json")
    parser.add_argument("--md", type=Path, default=ROOT / "docs" / "benchmarks.md")
    args = parser.parse_args()
    results = load_results(args.results)
    if not results:
        print(f"report: no results in {args.results}", file=sys.stderr)
        return 1
    earlier = json.loads(args.json.read_text()) if args.json.exists() else {}
    data = collect(results, earlier)
    args.json.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
    args.md.write_text(render(data))
    measured = sum(1 for f in data["figures"] if f["value"] is not None)
    print(f"report: {args.json} and {args.md} ({measured} figures)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

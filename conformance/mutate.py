"""``gpuconf mutate``: how good is the suite? Run it against every seeded fault and count what it catches.

A conformance suite that passes a broken stack is worse than none. The reference scheduler and the
reference node agent can each be broken on purpose, one duty at a time
(``fixtures/sandbox/scheduler/faults.py``, ``enforcement/agent/options.py``); this command judges
each broken implementation with the suite and reports, per fault, which checks caught it. The score
is caught / seeded; a fault that no check catches is a finding, named in the output, and the
command exits 1.

The order of the work follows what each fault can affect, and reuses one sandbox throughout:

1. **control**: every profile against the unbroken reference scheduler and agent. It must pass, or
   nothing after it means anything (exit 1, and no score).
2. **scheduler faults**: each broken scheduler (``m-<fault>``) runs only while it is judged, beside
   the reference scheduler, on the ``scheduler`` profile, one run per node at a time (node leases
   keep them apart). A scheduler watches every Pod of the cluster: 29 of them running throughout
   made the API server and each of them decode every change 29 times over.
   ``leak-completed`` goes first and alone: it never forgets a Pod, so after other runs it is full.
3. **agent faults**: one per node at a time (``--nodes``, four by default; ``--agent-fault NODE:F``);
   each run is pinned to its node (``--gpu-node-selector``) and judged on the ``node`` profile.

``leak-completed`` (which counts every Pod it ever saw) is judged on its expected check alone: on
the rest of the profile it fails only as a consequence of that leak. ``--quick`` narrows every fault
that way (``make test`` uses it: is each fault caught where it should be?); without it each fault
meets its whole profile, and the table says every check that caught it.

``make mutation`` runs it with ``--write-score``, which also records the score in
``conformance/mutation-score.json``, per fidelity (``--fidelity``, repeatable) with its date and its
mode (``quick`` or ``full``); every run's report then says, per fidelity, how many seeded faults
this version of the suite catches.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from enforcement.agent.options import FAULTS as AGENT_FAULTS
from enforcement.agent.options import canonical_fault
from fixtures.sandbox.config import Ports, SandboxConfig
from fixtures.sandbox.controlplane import Sandbox
from fixtures.sandbox.errors import SandboxError
from fixtures.sandbox.scheduler.component import SANDBOX_RETRY_S
from fixtures.sandbox.scheduler.faults import FAULTS as SCHEDULER_FAULTS

SCORE_PATH: Final = Path(__file__).resolve().parent / "mutation-score.json"

EXPECTED_SCHEDULER: Final[dict[str, tuple[str, ...]]] = {
    "overcommit": ("memory-fit",),
    "mix-modes": ("mode-separation",),
    "omit-limit": ("limit-and-mode-at-bind",),
    "omit-devices": ("annotations-at-bind",),
    "omit-request": ("annotations-at-bind",),
    "wrong-device-count": ("multi-device",),
    "request-gt-limit": ("annotations-at-bind",),
    "wrong-container-name": ("annotations-at-bind", "annotations-name-the-container"),
    "trust-pod-devices": ("devices-scheduler-owned",),
    "ignore-node-ready": ("node-readiness",),
    "devices-not-on-node": ("multi-device",),
    "annotate-after-bind": ("annotations-at-bind",),
    "leak-completed": ("release-on-completion",),
    "silent-unschedulable": ("unschedulable-reason",),
    "portion-of-wrong-size": ("portion-conversion",),
    "inflate-request": ("values-as-asked",),
    "limit-to-gpu": ("values-as-asked",),
    "default-sm-sharing": ("values-as-asked",),
    "overcommit-slightly": ("memory-fit",),
    "leak-failed": ("release-on-completion",),
    "vague-unschedulable": ("unschedulable-reason",),
    "mode-check-sm-only": ("mode-separation",),
    "absent-mode-fits-any": ("mode-separation",),
    "mode-check-first-device": ("mode-separation",),
    "charge-first-device-only": ("memory-fit",),
    "ignore-foreign-pods": ("memory-fit",),
    "own-namespace-only": ("memory-fit",),
    "place-on-retry": ("memory-fit",),
    "trust-fitting-pod-devices": ("devices-scheduler-owned",),
    "refuse-only-not-ready-false": ("node-readiness",),
    "trust-compatible-pod-devices": ("devices-scheduler-owned",),
    "limit-to-unguaranteed": ("values-as-asked",),
    "mode-check-last-device": ("mode-separation",),
    "devices-as-indices": ("devices-form",),
}
"""Per seeded scheduler fault, the check(s) a person would expect to catch it (each must fail)."""
DECLARED_SCHEDULER: Final[dict[str, str]] = {"devices-as-indices": "gpuconf-reference"}
"""Scheduler faults judged with a declared implementation (``--implementation``): a fault that breaks
a mechanism is caught only where the description claims it (``devices-as-indices``: the reference
scheduler's devicesForm uuid). The others are judged as any scheduler is, by the contract alone."""

EXPECTED_AGENT: Final[dict[str, tuple[str, ...]]] = {
    "no-hard-limit": ("hard-limit-oom",),
    "clobber-neighbour": ("hard-limit-oom",),
    "limit-first-device-only": ("hard-limit-each-device",),
    "limit-from-request": ("burst-borrowing",),
    "no-eviction": ("soft-limit-eviction",),
    "evict-guaranteed": ("guarantee-kept",),
    "evict-without-pressure": ("no-eviction-without-pressure", "burst-borrowing"),
    "evict-all-borrowers": ("soft-limit-eviction",),
    "evict-guaranteed-for-borrower": ("guarantee-kept",),
    "evict-when-full": ("no-eviction-without-pressure",),
    "no-mode-guard": ("mode-guard",),
    "mode-guard-one-way": ("mode-guard",),
    "forget-modes-after-restart": ("agent-restart",),
    "lenient-after-restart": ("agent-restart",),
    "ignore-mode": ("mode-applied", "compute-modes"),
    "shared-fault-domain": ("fault-isolation",),
    "whole-gpu-visibility": ("smi-visibility", "env-injection"),
    "full-visibility": ("smi-visibility", "env-injection"),
    "smi-device-used": ("smi-visibility",),
    "wrong-visible-devices": ("env-injection",),
    "fence-whole-pod": ("env-injection",),
    "leak-on-exit": ("release-on-exit",),
    "no-recovery": ("agent-restart",),
    "fail-open": ("fail-closed",),
    "fail-open-silently": ("fail-closed",),
    "accept-bare-number": ("fail-closed",),
    "blank-mode-default": ("fail-closed",),
    "vague-refusal": ("fail-closed",),
    "ready-without-backend": ("agent-readiness",),
    "start-while-unfenced": ("agent-readiness",),
    "evict-borrowers-late": ("burst-borrowing",),
    "context-outside-limit": ("hard-limit-oom",),
    "free-sub-page": ("hard-limit-oom",),
    "cuda-enumerates-all": ("cuda-visibility",),
}
"""Per seeded agent fault, the check(s) a person would expect to catch it (each must fail)."""
REFERENCE: Final = "gpuconf-reference"
ALONE_FIRST: Final = ("leak-completed",)
HOSTNAME: Final = "kubernetes.io/hostname"


@dataclass
class FaultResult:
    """What the suite made of one seeded fault."""

    fault: str
    kind: str
    """``scheduler`` or ``agent``."""
    breaks: str
    expected: list[str] = field(default_factory=list)
    """Check ids that should catch it (``EXPECTED_*``)."""
    caught_by: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    exit_code: int = 0
    seconds: float = 0.0

    @property
    def missed(self) -> list[str]:
        """Expected checks that did not fail."""
        failed = {key.split("/", 1)[-1].split("[", 1)[0] for key in self.caught_by}
        return [c for c in self.expected if c not in failed]

    @property
    def verdict(self) -> str:
        if self.caught_by:
            return "caught" if not self.missed else "caught, not by the expected check"
        return "not judged" if self.errors else "ESCAPED"


@dataclass
class MutationReport:
    date: str
    seconds: float
    control: dict[str, Any]
    results: list[FaultResult]
    fidelity: str = "ideal"
    """The simulated GPUs' fidelity the faults were judged on (``enforcement.sim.fidelity``)."""
    quick: bool = False
    """Each fault judged on its expected checks only (``--quick``), not on its whole profile."""

    @property
    def caught(self) -> int:
        return sum(r.verdict == "caught" for r in self.results)

    def as_dict(self) -> dict[str, Any]:
        return {
            "apiVersion": "gpuconf.io/v1alpha1",
            "kind": "MutationReport",
            "date": self.date,
            "seconds": round(self.seconds, 1),
            "fidelity": self.fidelity,
            "mode": "quick" if self.quick else "full",
            "score": {"caught": self.caught, "seeded": len(self.results)},
            "control": self.control,
            "faults": [{**asdict(r), "missed": r.missed, "verdict": r.verdict} for r in self.results],
        }


def judge(kubeconfig: Path, out: Path, scheduler: str, *extra: str) -> tuple[int, dict[str, Any], str]:
    """One ``gpuconf run`` in a process of its own; its exit code, its run record and its output."""
    argv = [sys.executable, "-m", "conformance.cli", "run", f"--kubeconfig={kubeconfig}"]
    argv += [f"--scheduler-name={scheduler}", f"--report-dir={out}", *extra]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "GPUCONF_IN_CLUSTER": "0"}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=1800, env=env)
    run = out / "run.json"
    record = json.loads(run.read_text()) if run.exists() else {}
    return proc.returncode, record, proc.stdout + proc.stderr


def _fault_result(
    fault: str, kind: str, breaks: str, run: tuple[int, dict[str, Any], str], took: float
) -> FaultResult:
    rc, record, output = run
    results = record.get("results") or []
    errors = [f"{r['key']}: {r['reason']}" for r in results if r["outcome"] == "error"]
    if not record:
        errors.append(f"the run wrote no results (exit {rc}): {output.strip().splitlines()[-1:]}")
    expected = (EXPECTED_SCHEDULER if kind == "scheduler" else EXPECTED_AGENT).get(fault, ())
    return FaultResult(
        fault=fault,
        kind=kind,
        breaks=breaks,
        expected=list(expected),
        caught_by=sorted(r["key"] for r in results if r["outcome"] == "failed"),
        errors=errors,
        exit_code=rc,
        seconds=round(took, 1),
    )


def _timed(
    func: Callable[[], tuple[int, dict[str, Any], str]],
) -> tuple[tuple[int, dict[str, Any], str], float]:
    started = time.monotonic()
    return func(), time.monotonic() - started


DEFAULT_NODES = 4
"""GPU nodes of the mutation's sandbox. A scheduler check leases whole nodes and an agent fault runs
on a node of its own, so the nodes bound how many runs go at once; the runs mostly wait (on binds,
reaction periods, workloads), so four at a time keep two cores busy where two left them idle."""

TOPOLOGY = """# Written by gpuconf mutate: the default sandbox's GPUs, on {nodes} nodes.
apiVersion: gpuconf.io/v1alpha1
kind: SandboxTopology
pools:
  - name: gpu-a
    nodes: {nodes}
    gpusPerNode: 4
    product: NVIDIA-H200
    memoryMiB: 143771
"""


def run_mutation(
    scheduler_faults: Sequence[str],
    agent_faults: Sequence[str],
    out: Path,
    *,
    parallel: int = 0,
    state_dir: Path | None = None,
    extra: Sequence[str] = (),
    quick: bool = False,
    fidelity: str = "ideal",
    control_workers: int = 1,
    nodes: int = DEFAULT_NODES,
    log: Callable[[str], None] = print,
) -> MutationReport:
    started = time.monotonic()
    topology = Path(out, "topology.yaml")
    topology.parent.mkdir(parents=True, exist_ok=True)
    topology.write_text(TOPOLOGY.format(nodes=nodes))
    config = SandboxConfig(
        state_dir=state_dir or Path(out, "sandbox"),
        ports=Ports.free(),
        topology=str(topology),
        schedulers=("reference",),
        node_runtime=True,
        fidelity=fidelity,
    )
    # What the sandbox runs beside the reference scheduler and agents, changed only under the lock:
    # the broken schedulers being judged now, and each node's agent fault. The sandbox's reconcile
    # starts what is new, stops what is no longer wanted and leaves the rest running.
    judged: set[str] = set()
    current: dict[str, str] = {}
    reconcile = threading.Lock()

    def reconfigure() -> None:
        schedulers = ("reference", *(f"reference/m-{f}:{f}" for f in sorted(judged)))
        faults = tuple(f"{n}:{f}" for n, f in sorted(current.items()))
        Sandbox(replace(config, schedulers=schedulers, agent_faults=faults)).reconcile(log=lambda m: None)

    parallel = parallel or nodes
    # The runs judge the sandbox as a cluster (--kubeconfig): tell them its agent's reaction period.
    extra = [
        *extra,
        f"--reaction-period={reaction_period(fidelity):g}",
        f"--retry-period={SANDBOX_RETRY_S:g}",
        # Each run's Pods must be gone before the next one counts GPUs; its namespaces need not be (the
        # namespace controller holds each deletion 5 s: about a minute and a half over every run).
        "--cleanup=pods",
    ]
    # A fault run is read from its run.json alone; the control keeps every report (they are shown).
    fault_only = ["--reports=none"]
    box = Sandbox(config)
    box.down()
    log(
        f"mutation: sandbox ({fidelity} fidelity); {len(scheduler_faults)} broken scheduler(s), "
        "each started for its run ..."
    )
    box.up(log=lambda m: None)
    results: list[FaultResult] = []
    try:

        def scheduler_run(fault: str) -> FaultResult:
            only = _only(EXPECTED_SCHEDULER, fault, quick or fault in ALONE_FIRST)
            with reconcile:
                judged.add(fault)
                reconfigure()
            try:
                run, took = _timed(
                    lambda: judge(
                        box.kubeconfig,
                        out / "scheduler" / fault,
                        f"m-{fault}",
                        "--profile=scheduler",
                        "--skip-preflight",
                        *only,
                        *(
                            [f"--implementation={DECLARED_SCHEDULER[fault]}"]
                            if fault in DECLARED_SCHEDULER
                            else []
                        ),
                        *extra,
                        *fault_only,
                    )
                )
            finally:
                with reconcile:
                    judged.discard(fault)
                    reconfigure()
            found = _fault_result(fault, "scheduler", SCHEDULER_FAULTS[fault].breaks, run, took)
            log(f"mutation: scheduler fault {fault}: {found.verdict} {', '.join(found.caught_by)}")
            return found

        first = [f for f in scheduler_faults if f in ALONE_FIRST]
        rest = [f for f in scheduler_faults if f not in ALONE_FIRST]
        # Before the control: these faults remember every Pod they ever saw.
        results += [scheduler_run(f) for f in first]
        log("mutation: control (every profile, no fault) ...")
        # The control runs alone on the sandbox, so it may spread over xdist workers (node leases keep
        # its checks apart, as they keep the fault runs apart below).
        workers = ("-n", str(control_workers)) if control_workers > 1 else ()
        (rc, record, output), took = _timed(
            lambda: judge(box.kubeconfig, out / "control", REFERENCE, *workers, *extra)
        )
        outcomes = [r["outcome"] for r in record.get("results") or []]
        control = {
            "exitCode": rc,
            "seconds": round(took, 1),
            "statistics": {o: outcomes.count(o) for o in ("passed", "failed", "skipped", "error")},
        }
        if rc != 0 or not outcomes or any(o in ("failed", "error") for o in outcomes):
            log(f"mutation: the control did not pass (exit {rc}); nothing else is judged\n{output[-3000:]}")
            return MutationReport(_now(), time.monotonic() - started, control, [], fidelity, quick)
        log(f"mutation: control passed ({len(outcomes)} items, {took:.0f} s)")

        with ThreadPoolExecutor(max_workers=parallel) as pool:
            results += list(pool.map(scheduler_run, rest))

        gpu_nodes = [
            n.metadata.name for n in box.core_v1().list_node(label_selector="nvidia.com/gpu.count").items
        ]
        # One queue per node: a node takes its next fault as soon as its last run ends (batches waited
        # for their slowest run). Only that node's agent restarts with the new fault: the sandbox's
        # reconcile restarts a component only when its command changed, and the lock keeps one
        # reconcile at a time, each with every node's current fault.
        queue = list(agent_faults)

        def agent_run(node: str, fault: str) -> FaultResult:
            with reconcile:
                current[node] = fault
                reconfigure()
            run, took = _timed(
                lambda: judge(
                    box.kubeconfig,
                    out / "agent" / fault,
                    REFERENCE,
                    "--profile=node",
                    "--skip-preflight",
                    f"--gpu-node-selector={HOSTNAME}={node}",
                    *_only(EXPECTED_AGENT, fault, quick),
                    *extra,
                    *fault_only,
                )
            )
            found = _fault_result(fault, "agent", AGENT_FAULTS[fault], run, took)
            log(f"mutation: agent fault {fault} on {node}: {found.verdict} {', '.join(found.caught_by)}")
            return found

        def node_worker(node: str) -> list[FaultResult]:
            done: list[FaultResult] = []
            while True:
                with reconcile:
                    if not queue:
                        return done
                    fault = queue.pop(0)
                done.append(agent_run(node, fault))

        with ThreadPoolExecutor(max_workers=len(gpu_nodes)) as pool:
            per_node = list(pool.map(node_worker, gpu_nodes))
        order = {fault: i for i, fault in enumerate(agent_faults)}
        results += sorted((r for rs in per_node for r in rs), key=lambda r: order[r.fault])
    finally:
        box.down()
    return MutationReport(_now(), time.monotonic() - started, control, results, fidelity, quick)


def reaction_period(fidelity: str) -> float:
    """The sandbox's reference agent's reaction period in ``fidelity``, plus one pressure poll."""
    from enforcement.sim.fidelity import fidelity as named

    return round(named(fidelity).agent_reaction_period_s + 0.1, 3)


def _only(expected: dict[str, tuple[str, ...]], fault: str, narrow: bool) -> list[str]:
    """``--check`` arguments for the fault's expected checks when narrowed; none (the whole profile) else,
    and always for a fault without an expectation, so a new fault is never judged on nothing."""
    if not narrow or fault not in expected:
        return []
    return [f"--check={check}" for check in expected[fault]]


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def table(report: MutationReport) -> list[str]:
    rows = [("FAULT", "KIND", "VERDICT", "SECONDS", "CAUGHT BY")]
    for r in report.results:
        caught = ", ".join(r.caught_by) or ("; ".join(r.errors)[:120] if r.errors else "-")
        rows.append((r.fault, r.kind, r.verdict, f"{r.seconds:.0f}", caught))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    return [
        "  ".join(c.ljust(w) for c, w in zip(row[:4], widths, strict=True)) + "  " + row[4] for row in rows
    ]


def _pick(
    chosen: list[str] | None,
    known: dict[str, Any],
    what: str,
    canonical: Callable[[str], str] = lambda name: name,
) -> list[str]:
    """The faults to judge: ``all`` (every one of ``known``, by its canonical name), ``none``, or
    the names given; an earlier name counts as its ``canonical`` one, and each is judged once."""
    names = [n.strip() for value in chosen or ["all"] for n in value.split(",") if n.strip()]
    if names == ["all"]:
        return list(known)
    if names == ["none"]:
        return []
    unknown = [n for n in names if canonical(n) not in known]
    if unknown:
        raise SystemExit(
            f"gpuconf: error: unknown {what} fault(s) {', '.join(unknown)}; known: {', '.join(known)}"
        )
    return list(dict.fromkeys(canonical(n) for n in names))


def cmd_mutate(args: argparse.Namespace) -> int:
    scheduler_faults = _pick(args.scheduler_faults, dict(SCHEDULER_FAULTS), "scheduler")
    agent_faults = _pick(args.agent_faults, dict(AGENT_FAULTS), "agent", canonical_fault)
    if args.nodes < 2:
        print(f"gpuconf: error: --nodes must be 2 or more, not {args.nodes}", file=sys.stderr)
        return 2
    if args.control_workers < 1:
        print(
            f"gpuconf: error: --control-workers must be 1 or more, not {args.control_workers}",
            file=sys.stderr,
        )
        return 2
    args.report_dir.mkdir(parents=True, exist_ok=True)
    extra = [f"--timeout-scale={args.timeout_scale}"]
    fidelities = list(dict.fromkeys(args.fidelity or ["ideal"]))
    reports: list[MutationReport] = []
    for fidelity in fidelities:
        out = args.report_dir if len(fidelities) == 1 else args.report_dir / fidelity
        out.mkdir(parents=True, exist_ok=True)
        try:
            report = run_mutation(
                scheduler_faults,
                agent_faults,
                out.resolve(),
                parallel=args.parallel,
                nodes=args.nodes,
                extra=extra,
                quick=args.quick,
                fidelity=fidelity,
                control_workers=args.control_workers,
            )
        except SandboxError as exc:
            print(f"gpuconf: error: {exc}", file=sys.stderr)
            return 2
        (out / "mutation.json").write_text(json.dumps(report.as_dict(), indent=2) + "\n")
        print(f"== {fidelity} fidelity")
        print("\n".join(table(report)))
        print(
            f"\nscore ({fidelity}): {report.caught}/{len(report.results)} seeded faults caught in "
            f"{report.seconds:.0f} s"
        )
        reports.append(report)
    if len(reports) > 1:
        caught = {r.fidelity: {f.fault for f in r.results if f.verdict == "caught"} for r in reports}
        everywhere = set.intersection(*(set(v) for v in caught.values()))
        only_ideal = sorted(caught.get("ideal", set()) - everywhere)
        print(f"caught only in the ideal fidelity: {', '.join(only_ideal) or 'none'}")
    if any(not r.results for r in reports):
        print(
            "the control run did not pass: the suite cannot be measured against faults here", file=sys.stderr
        )
        return 1
    if args.write_score:
        SCORE_PATH.write_text(json.dumps(score_record(reports), indent=2) + "\n")
        print(f"wrote {SCORE_PATH}")
    escaped = [
        f"{r.fault} ({r.verdict}, {rep.fidelity})"
        for rep in reports
        for r in rep.results
        if r.verdict != "caught"
    ]
    if escaped:
        print(f"findings: {', '.join(escaped)}", file=sys.stderr)
        return 1
    return 0


def score_record(reports: Sequence[MutationReport]) -> dict[str, Any]:
    """What ``--write-score`` records: each fidelity's score (date, seconds, mode, counts, faults)
    under ``fidelities``, and the first one's also at the top, the shape of a score file from
    before fidelities (``reports.validation`` reads both)."""

    def one(report: MutationReport) -> dict[str, Any]:
        data = report.as_dict()
        score = {k: data[k] for k in ("date", "seconds", "fidelity", "mode", "score")}
        score["faults"] = {
            r.fault: {"kind": r.kind, "verdict": r.verdict, "caughtBy": r.caught_by} for r in report.results
        }
        return score

    return {**one(reports[0]), "fidelities": {r.fidelity: one(r) for r in reports}}


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "mutate",
        help="run the suite against every seeded fault (scheduler and agent) and report what it catches",
    )
    parser.add_argument(
        "--report-dir", type=Path, default=Path("gpuconf-mutation"), help="results (%(default)s)"
    )
    parser.add_argument("--scheduler-faults", action="append", help="all (default), none, or a comma list")
    parser.add_argument("--agent-faults", action="append", help="all (default), none, or a comma list")
    parser.add_argument(
        "--nodes",
        type=int,
        default=DEFAULT_NODES,
        help="simulated GPU nodes of the mutation's sandbox (%(default)s): agent-fault runs go one per node",
    )
    parser.add_argument(
        "--parallel", type=int, default=0, help="scheduler-fault runs at a time (default: one per node)"
    )
    parser.add_argument(
        "--control-workers",
        type=int,
        default=1,
        help="xdist workers for the control run (every profile, no fault); 1: serial (%(default)s)",
    )
    parser.add_argument("--timeout-scale", type=float, default=1.0, help="multiply every timeout")
    parser.add_argument(
        "--fidelity",
        action="append",
        choices=("ideal", "h200"),
        help="the simulated GPUs' fidelity to judge the faults on, repeatable: each is scored on its own "
        "(default: ideal); --fidelity ideal --fidelity h200 scores both",
    )
    parser.add_argument("--write-score", action="store_true", help=f"record the score in {SCORE_PATH.name}")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="judge each fault on its expected checks only (is it caught where it should be?), "
        "not on the whole profile (which checks catch it)",
    )
    parser.set_defaults(func=cmd_mutate)

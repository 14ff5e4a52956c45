"""``gpuconf probe``: the node-level checks, on this machine's GPUs, without Kubernetes.

The reference agent's own enforcement (``enforcement.agent.handler.AgentCore`` and its evictor),
driven in process: each check builds annotated Pods as the scheduler would, asks the agent's
CreateContainer for them, runs ``python -m workloads.allocate`` with exactly the environment the
agent returned, and judges what happened. On a GPU machine it uses the ``mps`` backend and the
CuPy workload; anywhere, ``--backend sim`` starts a simulated device server and runs on that.

Why a probe beside the conformance suite: the node half of the contract (docs/contract.md §6-7) can be
validated on one machine before any cluster exists (the first step of seed 000's rollout path),
and an operator upgrading a driver can run it on the node itself.

Its checks are entries of the conformance catalog (``conformance/catalog.yaml``), in the profile
``probe``: the same rule, statement and level as the suite's node checks, judged here by the agent
in process instead of in a cluster (``CHECKS``; ``--check`` picks some; the probe's older names are
accepted too):

| catalog id | the probe's old name | what the probe does |
|---|---|---|
| ``hard-limit-oom`` | ``hard-limit`` | ``alloc-until-oom`` beside a neighbour that must keep its memory |
| ``burst-borrowing`` | ``borrowing`` | borrows to its limit on an idle GPU, holds it: evicted in no way |
| ``soft-limit-eviction`` | ``pressure-eviction`` | a borrower is evicted (any way) for a guaranteed Pod |
| ``mode-guard`` | | the other mode is refused on a GPU, either way round (no mode: time-slicing) |
| ``smi-visibility`` | ``visibility`` | nvidia-smi lists its GPU only, total = the limit, used = its own |
| ``release-on-exit`` | ``release`` | after one exits, one dies: the next gets its guarantee at once |
| ``fail-closed`` | | each malformed case (``cases()``, a blank mode too) is refused, naming key and rule |

The result is the suite's result model (``reports.model``: ``RunRecord`` with ``source: probe``,
one ``CheckResult`` per check keyed ``probe/<id>``), so every report renders a probe like a run:
``--report-dir DIR`` writes it as ``gpuconf run`` does, ``--output FILE`` writes its ``run.json``.

Every check is shown to FAIL against the matching seeded fault of the agent (``--fault``,
``enforcement.agent.options.FAULTS``), which is how this probe is itself tested.

Exit codes: 0 every check passed (or was skipped), 1 a check failed, 2 usage or set-up error.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from enforcement.backends import Backend
    from reports.model import RunRecord

from conformance.probe.checks import ALIASES, CHECK_IDS, CHECKS, ProbeCheck, check_id
from conformance.probe.session import (
    CheckFailed,
    CheckSkipped,
    ProbeOptions,
    ProbeResult,
    Session,
    SetupError,
)

__all__ = [
    "ALIASES",
    "CHECKS",
    "CHECK_IDS",
    "ProbeCheck",
    "ProbeOptions",
    "ProbeReport",
    "ProbeResult",
    "SetupError",
    "check_id",
    "main",
    "register",
    "render_table",
    "run_probe",
]


@dataclass(frozen=True)
class ProbeReport:
    backend: str
    simulated: bool
    gpus: list[dict[str, Any]]
    faults: list[str]
    results: list[ProbeResult]
    started_at: float
    wall_s: float

    @property
    def passed(self) -> bool:
        return all(r.status in ("PASS", "SKIP") for r in self.results)

    def to_record(self) -> RunRecord:
        """The probe in the suite's result model: one ``probe/<id>`` result per check, source ``probe``."""
        from reports.model import Catalog, CheckResult, Environment, RunRecord

        outcome = {"PASS": "passed", "FAIL": "failed", "SKIP": "skipped", "ERROR": "error"}
        results = []
        by_id = {c.id: c for c in CHECKS}
        for r in self.results:
            declared = by_id[r.id].declared
            results.append(
                CheckResult(
                    key=declared.key("probe"),
                    id=declared.id,
                    profile="probe",
                    party=declared.party("probe"),
                    level=declared.level,
                    statement=declared.statement,
                    capability=declared.capability,
                    outcome=outcome[r.status],  # type: ignore[arg-type]
                    reason="" if r.status == "PASS" else r.summary,
                    detail=r.summary,
                    duration_s=r.seconds,
                    features=list(declared.features),
                    seed=declared.seed,
                    evidence={"facts": {"summary": r.summary, **r.evidence}},
                    started=r.started,
                )
            )
        product = str(self.gpus[0].get("product") or "") if self.gpus else ""
        memory = int(self.gpus[0].get("memory_mib") or 0) if self.gpus else 0
        return RunRecord(
            run_id="probe-" + time.strftime("%Y%m%d-%H%M%S", time.gmtime(self.started_at)),
            started=self.started_at,
            finished=self.started_at + self.wall_s,
            target={"kind": "probe", "backend": self.backend, "simulated": self.simulated},
            options={"profiles": ["probe"], "backend": self.backend, "faults": self.faults},
            results=results,
            source="probe",
            environment=Environment(
                node_agent="gpuconf reference agent",
                agent_backend=self.backend,
                simulated=self.simulated,
                gpu_product=product,
                gpu_count=len(self.gpus),
                gpu_memory_mib=memory,
                nodes=[{"name": "probe", "gpus": len(self.gpus), "memoryMiB": memory, "product": product}],
            ),
            catalog=Catalog(profiles=["probe"]),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "gpuconf_probe": 1,
            "backend": self.backend,
            "simulated": self.simulated,
            "gpus": self.gpus,
            "faults": self.faults,
            "passed": self.passed,
            "started_at": self.started_at,
            "wall_s": round(self.wall_s, 3),
            "results": [asdict(r) for r in self.results],
        }


# ---------------------------------------------------------------------------------------- running


def _open_backend(options: ProbeOptions, work: Path) -> tuple[Backend, bool, Callable[[], None]]:
    """(backend, simulated, close)."""
    if options.backend == "sim":
        from enforcement.backends.sim import SimBackend
        from enforcement.sim.process import ServerProcess, ServerStartError
        from enforcement.sim.topology import TopologyError, parse_gpus

        try:
            parse_gpus("probe", options.sim_gpus)
        except TopologyError as exc:
            raise SetupError(str(exc)) from None
        try:
            server = ServerProcess.start(work / "sim", node="probe", gpus=options.sim_gpus)
        except ServerStartError as exc:
            raise SetupError(f"cannot start the simulated device: {exc}") from None
        backend = SimBackend.from_dir(work / "sim", server.admin_token)

        def close() -> None:
            backend.close()
            server.stop()

        return backend, True, close
    from enforcement.backends import BackendUnavailable
    from enforcement.backends.mps import MpsBackend

    root = Path(options.mps_root) if options.mps_root else work / "mps"
    try:
        mps = MpsBackend.create(root)
    except BackendUnavailable as exc:
        raise SetupError(f"the mps backend cannot run here: {exc}") from None
    health = mps.health()
    if not health.ok:
        print(f"gpuconf probe: warning: {health.reason}: {health.message}", file=sys.stderr)

    def close_mps() -> None:
        mps.shutdown_daemons()

    return mps, False, close_mps


def run_probe(options: ProbeOptions, log: Callable[[str], None] = lambda _m: None) -> ProbeReport:
    """Run the selected checks; raises ``SetupError`` when nothing can run."""
    unknown = sorted({check_id(c) for c in options.checks} - set(CHECK_IDS))
    if unknown:
        raise SetupError(f"unknown check(s) {', '.join(unknown)}; known: {', '.join(CHECK_IDS)}")
    wanted = {check_id(c) for c in options.checks}
    from enforcement.agent.options import FAULTS, canonical_fault

    options = replace(options, faults=frozenset(canonical_fault(f) for f in options.faults))
    bad_faults = sorted(set(options.faults) - set(FAULTS))
    if bad_faults:
        raise SetupError(f"unknown fault(s) {', '.join(bad_faults)}; known: {', '.join(FAULTS)}")
    started, t0 = time.time(), time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="gprobe-", dir="/tmp"))  # short: socket paths <= 107 bytes
    results: list[ProbeResult] = []
    try:
        backend, simulated, close = _open_backend(options, work)
        try:
            session = Session(backend, options, work, simulated)
            try:
                for check in CHECKS:
                    if wanted and check.id not in wanted:
                        continue
                    log(f"probe: {check.id} ...")
                    results.append(_run_check(session, check))
                    log(f"probe: {check.id}: {results[-1].status}: {results[-1].summary}")
                gpus = [asdict(g) for g in session.gpus]
            finally:
                session.close()
        finally:
            close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return ProbeReport(
        options.backend, simulated, gpus, sorted(options.faults), results, started, time.monotonic() - t0
    )


def _run_check(session: Session, check: ProbeCheck) -> ProbeResult:
    t0, started = time.monotonic(), time.time()
    try:
        summary, evidence = check.run(session)
        status = "PASS"
    except CheckSkipped as exc:
        summary, evidence, status = exc.summary, exc.evidence, "SKIP"
    except CheckFailed as exc:
        summary, evidence, status = exc.summary, exc.evidence, "FAIL"
    except AssertionError as exc:  # a workload that never printed what it should: a failure, with its output
        summary, evidence, status = str(exc).splitlines()[0], {"detail": str(exc)[-2000:]}, "FAIL"
    except Exception as exc:  # noqa: BLE001 - one broken check must not hide the others' results
        summary = f"{type(exc).__name__}: {exc}"
        evidence, status = {"traceback": traceback.format_exc()[-2000:]}, "ERROR"
    finally:
        try:
            session.clean()
        except Exception as exc:  # noqa: BLE001 - the check's verdict stands; a failed clean-up is logged
            session.logs.append(f"clean-up after {check.id}: {exc}")
    return ProbeResult(
        check.id, check.statement, status, summary, evidence, round(time.monotonic() - t0, 3), started
    )


def render_table(report: ProbeReport) -> str:
    kind = "simulated" if report.simulated else "real"
    sizes = ", ".join(f"{g['memory_mib']} MiB" for g in report.gpus)
    lines = [f"gpuconf probe: {report.backend} backend, {len(report.gpus)} {kind} GPU(s) ({sizes})"]
    if report.faults:
        lines.append(f"SEEDED FAULTS (self-validation): {', '.join(report.faults)}")
    width = max([len("CHECK"), *(len(r.id) for r in report.results)])
    lines.append(f"{'CHECK':<{width}}  RESULT  EVIDENCE")
    for r in report.results:
        lines.append(f"{r.id:<{width}}  {r.status:<6}  {r.summary}")
    failed = sum(1 for r in report.results if r.status in ("FAIL", "ERROR"))
    lines.append(
        f"{len(report.results) - failed} of {len(report.results)} checks passed in {report.wall_s:.1f} s"
    )
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------- CLI


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "probe",
        help="node-level enforcement checks on this machine's GPUs (or simulated ones), no Kubernetes",
        description="Run the node-level enforcement checks of the GPU-fraction contract with the reference "
        "agent's own enforcement, on this machine's GPUs (mps backend, CuPy workload) or on simulated ones "
        "(--backend sim), without Kubernetes; prints PASS/FAIL with evidence. Exit 0: all passed, "
        "1: a check failed, 2: usage or set-up error.",
    )
    p.add_argument(
        "--backend",
        choices=("mps", "sim"),
        default="mps",
        help="mps: this machine's GPUs (default); sim: simulated",
    )
    p.add_argument(
        "--sim-gpus", default="2x4096", metavar="SPEC", help="sim: GPUs as COUNTxMIB (default 2x4096)"
    )
    p.add_argument(
        "--check",
        action="append",
        default=[],
        choices=[*CHECK_IDS, *ALIASES],
        metavar="ID",
        help=f"run only this check, repeatable: {', '.join(CHECK_IDS)} (catalog ids)",
    )
    p.add_argument("--output", type=Path, help="write the result (the run.json of the result model) here")
    p.add_argument(
        "--report-dir",
        type=Path,
        help="write the result as gpuconf run does (run.json, checks/, junit.xml): the reports render it",
    )
    p.add_argument("--mps-root", help="mps: pipe/log/state directory (default: a temporary one)")
    p.add_argument("--fault", action="append", default=[], help=argparse.SUPPRESS)  # self-validation only
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    options = ProbeOptions(
        backend=args.backend,
        sim_gpus=args.sim_gpus,
        checks=tuple(args.check),
        faults=frozenset(args.fault),
        mps_root=args.mps_root,
        output=args.output,
        report_dir=args.report_dir,
    )
    try:
        report = run_probe(options, log=lambda m: print(m, file=sys.stderr, flush=True))
    except SetupError as exc:
        print(f"gpuconf probe: {exc}", file=sys.stderr)
        return 2
    print(render_table(report))
    record = report.to_record()
    try:
        if options.output is not None:
            options.output.parent.mkdir(parents=True, exist_ok=True)
            options.output.write_text(json.dumps(record.as_dict(), indent=2, default=str) + "\n")
        if options.report_dir is not None:
            from reports.records import write_run

            write_run(record, options.report_dir)
    except OSError as exc:
        print(f"gpuconf probe: cannot write the result: {exc}", file=sys.stderr)
        return 2
    return 0 if report.passed else 1

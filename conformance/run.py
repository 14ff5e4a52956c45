"""``gpuconf run``: the conformance suite, against a cluster or the embedded sandbox.

It is ``pytest --pyargs conformance`` with the suite's plugin options, plus two things: without
``--kubeconfig`` it brings the embedded sandbox up first (with the sandbox options, e.g. a
scheduler with seeded faults) and points the run at it, and it always names a report directory.
Everything else (preflight, leases, checks, outcomes, results, cleanup) is the plugin's, so a plain
pytest run with the same options judges the same way.

Exit codes: 0 every MUST check that ran passed (skips are declared unsupported features), 1 a MUST
check failed, 2 usage or preflight error (nothing was judged), 3 a MUST check could not be judged
(error) and none failed, 130 interrupted (what the run created is deleted all the same).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import pytest
from kubernetes.client.rest import ApiException

from conformance import sonobuoy
from enforcement.implementations import DescriptionError, combine, resolve
from enforcement.implementations import known_names as known_implementations
from fixtures.sandbox.cli import add_sandbox_options, sandbox_from_args, schedulers_from_args
from fixtures.sandbox.errors import SandboxError
from fixtures.sandbox.scheduler.component import parse_specs
from fixtures.suite.checks import FEATURES, PROFILES, SUITE_PROFILES
from fixtures.suite.cleanup import CLEANUP_MODES
from fixtures.suite.cluster import Cluster, ClusterError, in_cluster
from fixtures.suite.invocation import REFERENCE_SCHEDULERS_ENV
from reports.cli import add_implementation_options, baseline_check, implementation_from
from reports.model import EXIT_USAGE, load_run
from reports.render import FORMATS, render_all
from reports.submitter import SubmitterError

EXIT_INTERRUPTED = 130


def _csv(values: list[str] | None) -> list[str]:
    return [v.strip() for value in values or [] for v in value.split(",") if v.strip()]


def validate(args: argparse.Namespace) -> str | None:
    """The first usage error in ``args`` (naming option, value and what is allowed), or None."""
    from conformance.catalog import load_checks

    for p in _csv(args.profile):
        if p not in PROFILES:
            return f"--profile {p!r}: unknown profile; known: {', '.join(PROFILES)}"
    for f in _csv(args.supported_features) + _csv(args.exempt_features):
        if f not in FEATURES:
            return f"feature {f!r}: unknown; known: {', '.join(FEATURES)}"
    try:
        combine(resolve(name) for name in _csv(getattr(args, "implementation", None)))
    except DescriptionError as exc:
        return f"--implementation: {exc}"
    known = {c.id for c in load_checks()}
    for c in _csv(args.check):
        if c not in known:
            return f"--check {c!r}: unknown check id; known: {', '.join(sorted(known))}"
    if args.kubeconfig is not None and not args.kubeconfig.is_file():
        return f"--kubeconfig {args.kubeconfig}: no such file"
    if (args.kubeconfig is not None or in_cluster()) and not args.scheduler_name:
        return (
            "--scheduler-name: name the scheduler under test (its spec.schedulerName) when judging a cluster"
        )
    if not args.timeout_scale > 0:
        return f"--timeout-scale {args.timeout_scale}: must be a positive number"
    if args.workers < 1:
        return f"--workers {args.workers}: must be at least 1"
    try:
        report_formats(getattr(args, "reports", "all"))
    except ValueError as exc:
        return str(exc)
    try:
        implementation_from(args)
    except SubmitterError as exc:
        return str(exc)
    return None


def _default_scheduler(args: argparse.Namespace) -> str:
    """The scheduler the sandbox runs (the first ``--scheduler`` spec), which is the one under test."""
    from fixtures.sandbox.scheduler.component import parse_spec

    specs = schedulers_from_args(args)
    if not specs:
        raise SandboxError(
            "the sandbox runs none of gpuconf's schedulers (--scheduler none, or --scheduler-command): pass "
            "--scheduler-name with the spec.schedulerName yours serves"
        )
    return parse_spec(specs[0]).name


REFERENCE_POLL_S = 0.1
"""The reference agent's pressure poll (``enforcement.agent.options.AgentOptions.evict_interval_s``)."""


def sandbox_reaction_period(args: argparse.Namespace) -> float:
    """The reaction period of the sandbox's reference agent: its fidelity's, plus one poll."""
    from enforcement.sim.fidelity import fidelity
    from fixtures.sandbox.topology import load

    name = getattr(args, "fidelity", None) or load(args.topology).fidelity
    return round(fidelity(name).agent_reaction_period_s + REFERENCE_POLL_S, 3)


def pytest_args(args: argparse.Namespace, kubeconfig: Path | None, scheduler: str, target: str) -> list[str]:
    """``kubeconfig`` None: in-cluster configuration (the plugin finds it itself)."""
    # Paths go as --opt=value: pytest would take a lone path-like token as a hint for its rootdir.
    # Hypothesis's plugin (a dev dependency of gpuconf's own tests) imports all of Hypothesis at the
    # end of every session, a third of a CPU-second per run: the suite has no Hypothesis test.
    out = ["--pyargs", "conformance", "-p", "no:cacheprovider", "-p", "no:hypothesispytest"]
    out += ["-q", "--no-header"]
    if kubeconfig is not None:
        out.append(f"--kubeconfig={kubeconfig}")
    out += [f"--scheduler-name={scheduler}", f"--gpuconf-target={target}"]
    out += [f"--report-dir={args.report_dir}", f"--timeout-scale={args.timeout_scale}"]
    for name, values in (
        ("--profile", args.profile),
        ("--supported-features", args.supported_features),
        ("--exempt-features", args.exempt_features),
        ("--check", args.check),
        ("--implementation", args.implementation),
        ("--pod-label", args.pod_label),
        ("--pod-annotation", args.pod_annotation),
    ):
        for value in values or []:
            out.append(f"{name}={value}")
    for name, value in (
        ("--workload-image", args.workload_image),
        ("--gpu-node-selector", args.gpu_node_selector),
        ("--agent-namespace", args.agent_namespace),
        ("--agent-selector", args.agent_selector),
        ("--priority-class", args.priority_class),
        ("--pod-overlay", str(Path(args.pod_overlay).resolve()) if args.pod_overlay else None),
    ):
        if value:
            out.append(f"{name}={value}")
    period = getattr(args, "reaction_period", None)
    if period is None and target == "gpuconf-sandbox":
        period = sandbox_reaction_period(args)
    if period is not None:
        out.append(f"--reaction-period={period:g}")
    retry = getattr(args, "retry_period", None)
    if retry is None and target == "gpuconf-sandbox":
        from fixtures.sandbox.scheduler.component import SANDBOX_RETRY_S

        retry = SANDBOX_RETRY_S
    if retry is not None:
        out.append(f"--retry-period={retry:g}")
    if args.skip_preflight:
        out.append("--skip-preflight")
    if getattr(args, "cleanup", "wait") != "wait":
        out.append(f"--cleanup={args.cleanup}")
    if args.workers > 1:
        out += ["-n", str(args.workers)]
    return out + list(args.pytest_args or [])


def cmd_run(args: argparse.Namespace) -> int:
    """The suite (or, with ``--dry-run``, its plan); in a Sonobuoy plugin, the results handed over."""
    if args.dry_run:
        return cmd_dry_run(args)
    rc = _run_suite(args)
    results = sonobuoy.results_dir()
    if results is not None:
        tarball = sonobuoy.finish(args.report_dir, results, rc)
        print(f"gpuconf: results for Sonobuoy in {tarball} (named in {results / sonobuoy.DONE})")
    return rc


def cmd_dry_run(args: argparse.Namespace) -> int:
    """``--dry-run``: the plan (``conformance.dryrun``); reads the cluster if there is one, writes nothing."""
    from conformance import dryrun
    from conformance.catalog import load_checks
    from fixtures.suite.session import AGENT_RESTART, WITHHELD_REASON

    problem = validate(args)
    if problem:
        print(f"gpuconf: error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    profiles = tuple(_csv(args.profile)) or SUITE_PROFILES
    named = _csv(args.supported_features)
    supported = frozenset(named or FEATURES) - frozenset(_csv(args.exempt_features))
    view = None
    if args.kubeconfig is not None or in_cluster():
        try:
            cluster = Cluster(args.kubeconfig, in_cluster=args.kubeconfig is None)
            view = dryrun.cluster_view(cluster, args.gpu_node_selector)
        except (ClusterError, ApiException, OSError) as exc:
            print(f"gpuconf: error: cannot read the cluster: {exc}", file=sys.stderr)
            return EXIT_USAGE
        scheduler = args.scheduler_name
        target = {"kind": "cluster" if args.kubeconfig else "in-cluster", "server": cluster.server}
        simulated = bool(view["nodes"]) and all(n.simulated for n in view["nodes"])
    else:
        try:
            scheduler = args.scheduler_name or _default_scheduler(args)
        except SandboxError as exc:
            print(f"gpuconf: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        sandbox = sandbox_from_args(args)
        state = sandbox.status().state
        target = {
            "kind": "gpuconf-sandbox",
            "server": sandbox.server,
            "sandbox": f"{state} in {sandbox.dir}"
            + ("" if state == "running" else " (a run would bring it up)"),
        }
        simulated = True
    withheld = "" if simulated or AGENT_RESTART in named else WITHHELD_REASON
    data = dryrun.plan(
        load_checks(),
        profiles=profiles,
        supported=supported,
        only=_csv(args.check),
        scheduler=scheduler or "",
        target=target,
        view=view,
        withheld=withheld,
    )
    if args.dry_run == "json":
        print(json.dumps(data, indent=2))
    else:
        dryrun.render(data)
    return 0


def _run_suite(args: argparse.Namespace) -> int:
    problem = validate(args)
    if problem:
        print(f"gpuconf: error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    kubeconfig: Path | None
    if args.kubeconfig is None and in_cluster():
        # In a Pod (the Job, Sonobuoy): the cluster around it. Never a sandbox there.
        kubeconfig, scheduler, target = None, args.scheduler_name, "in-cluster"
    elif args.kubeconfig is not None:
        try:
            Cluster(args.kubeconfig)
        except ClusterError as exc:
            print(f"gpuconf: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        kubeconfig, scheduler, target = args.kubeconfig.resolve(), args.scheduler_name, "cluster"
    else:
        try:
            scheduler = args.scheduler_name or _default_scheduler(args)
            sandbox = sandbox_from_args(args)
            result = sandbox.up(log=lambda m: print(f"sandbox: {m}", file=sys.stderr, flush=True))
        except SandboxError as exc:
            print(f"gpuconf: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
        print(
            f"sandbox {'reused' if result.reused else 'up'} in {result.seconds:.1f} s: {sandbox.server}",
            flush=True,
        )
        kubeconfig, target = sandbox.kubeconfig, "gpuconf-sandbox"
        # The record says whether the scheduler under test is one of gpuconf's (fixtures.suite.invocation).
        os.environ[REFERENCE_SCHEDULERS_ENV] = ",".join(
            s.name for s in parse_specs(schedulers_from_args(args))
        )
    args.report_dir.mkdir(parents=True, exist_ok=True)
    for stale in ("preflight.json", "run.json"):  # an earlier run's, which must not speak for this one
        (args.report_dir / stale).unlink(missing_ok=True)
    rc = int(pytest.main(pytest_args(args, kubeconfig, scheduler, target)))
    preflight = args.report_dir / "preflight.json"
    if preflight.exists() and "failed" in json.loads(preflight.read_text()):
        return EXIT_USAGE
    run_json = args.report_dir / "run.json"
    interrupted = run_json.exists() and bool(json.loads(run_json.read_text()).get("interrupted"))
    if rc == int(pytest.ExitCode.INTERRUPTED):
        # pytest's 2 is both "interrupted" and the plugin's usage exit; the run record tells them apart.
        return EXIT_INTERRUPTED if interrupted else EXIT_USAGE
    if rc in (int(pytest.ExitCode.USAGE_ERROR), int(pytest.ExitCode.NO_TESTS_COLLECTED)):
        if rc == int(pytest.ExitCode.NO_TESTS_COLLECTED):
            print("gpuconf: error: no check matched the selection (--profile, --check)", file=sys.stderr)
        return EXIT_USAGE
    rc = max(rc, _reports(args))
    if target == "gpuconf-sandbox":
        print("sandbox left running; stop it with `gpuconf sandbox down`")
    return rc


def report_formats(value: str) -> tuple[str, ...]:
    """``--reports``: ``all``, ``none`` or a comma list of ``reports.render.FORMATS``."""
    if value.strip() == "all":
        return FORMATS
    if value.strip() == "none":
        return ()
    chosen = tuple(dict.fromkeys(v.strip() for v in value.split(",") if v.strip()))
    unknown = [f for f in chosen if f not in FORMATS]
    if unknown or not chosen:
        raise ValueError(
            f"--reports {value!r}: {', '.join(map(repr, unknown)) or 'nothing'} is not a report format; "
            f"give all, none, or a comma list of {', '.join(FORMATS)}"
        )
    return chosen


def _reports(args: argparse.Namespace) -> int:
    """Render every report from the run's records, and compare with ``--baseline``; 1 on a regression."""
    run_json = args.report_dir / "run.json"
    if not run_json.exists():
        return 0
    record = load_run(args.report_dir)
    impl = implementation_from(args)
    if impl is not None:  # who submits belongs to the run's record: report bundle and verify read it there
        record.implementation = impl
        run_json.write_text(json.dumps(record.as_dict(), indent=2, default=str) + "\n")
    written = render_all(record, args.report_dir, implementation=impl, formats=report_formats(args.reports))
    if written:
        print(f"gpuconf: reports: {', '.join(str(p) for p in written)}")
    if args.baseline is not None and baseline_check(record, args.baseline) == 1:
        return 1
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "run",
        help="run the conformance suite against a cluster (--kubeconfig) or the embedded sandbox",
        description="Run the conformance suite. Without --kubeconfig it brings the embedded sandbox up (the "
        "sandbox options choose its schedulers and faults) and judges the scheduler it runs.",
    )
    target = parser.add_argument_group("what is judged")
    target.add_argument(
        "--kubeconfig",
        type=Path,
        default=None,
        help="the cluster under test (default: in a Pod, the cluster around it; elsewhere the sandbox)",
    )
    target.add_argument(
        "--scheduler-name", default=None, help="spec.schedulerName under test (sandbox: its scheduler)"
    )
    target.add_argument(
        "--profile",
        action="append",
        default=None,
        help=(
            f"profiles, repeatable or comma-separated: {', '.join(PROFILES)} (default: "
            f"{', '.join(SUITE_PROFILES)})"
        ),
    )
    target.add_argument("--check", action="append", default=None, help="only these check ids (repeatable)")
    target.add_argument(
        "--supported-features",
        action="append",
        default=None,
        help=f"features the implementation supports (default: all): {', '.join(FEATURES)}",
    )
    target.add_argument(
        "--exempt-features", action="append", default=None, help="features it does not support"
    )
    target.add_argument(
        "--implementation",
        action="append",
        default=None,
        metavar="NAME|FILE",
        help="the implementation under test: a built-in ("
        + ", ".join(known_implementations())
        + ") or a description file; repeatable, to name the node and the scheduler parts separately. "
        "Without it, detected from the cluster. It supplies the features --supported-features does not",
    )
    how = parser.add_argument_group("how")
    how.add_argument(
        "--workload-image", default=None, help="the allocation workload's image, pullable by the nodes"
    )
    how.add_argument("--gpu-node-selector", default="", help="label selector limiting the GPU nodes used")
    how.add_argument("--timeout-scale", type=float, default=1.0, help="multiply every timeout (%(default)s)")
    how.add_argument(
        "--reaction-period",
        type=float,
        default=None,
        metavar="S",
        help="the node agent's declared reaction period (hold windows and waits are multiples of it; "
        "default: the sandbox's reference agent's for its fidelity, else 2 s)",
    )
    how.add_argument(
        "--retry-period",
        type=float,
        default=None,
        metavar="S",
        help="how often the scheduler under test retries an unplaced Pod, at the longest (the unbound "
        "window is made from it; default: the sandbox's, else the scheduler implementation's, else 5 s)",
    )
    how.add_argument(
        "-n", "--workers", type=int, default=1, help="checks in parallel (pytest-xdist; bounded by nodes)"
    )
    how.add_argument(
        "--report-dir", "--output-dir", type=Path, default=Path("gpuconf-results"), help="results folder"
    )
    how.add_argument(
        "--skip-preflight", action="store_true", help="skip the checks of the cluster before the suite"
    )
    how.add_argument(
        "--reports",
        default="all",
        metavar="FORMATS",
        help=f"the reports written beside run.json: all (default), none, or a comma list of "
        f"{', '.join(FORMATS)} (`gpuconf report render` writes any of them later from run.json)",
    )
    how.add_argument(
        "--cleanup",
        choices=CLEANUP_MODES,
        default="wait",
        help="at the end, wait until the run's namespaces are gone (wait, the default) or only its Pods "
        "(pods: the namespace controller finishes the namespaces; it holds each deletion about 5 s)",
    )
    how.add_argument(
        "--agent-namespace", default=None, help="namespace of the node agent's Pods (agent-restart)"
    )
    how.add_argument("--agent-selector", default=None, help="label selector of the node agent's Pods")
    how.add_argument(
        "--pod-label",
        action="append",
        default=None,
        metavar="K=V",
        help="a label on every Pod the suite creates (repeatable; over the implementation's defaults)",
    )
    how.add_argument(
        "--pod-annotation",
        action="append",
        default=None,
        metavar="K=V",
        help="an annotation on every Pod (repeatable)",
    )
    how.add_argument("--priority-class", default=None, metavar="NAME", help="priorityClassName of every Pod")
    how.add_argument(
        "--pod-overlay",
        default=None,
        metavar="FILE",
        help="a strategic-merge patch (YAML) for every Pod the suite creates",
    )
    how.add_argument(
        "--baseline", type=Path, default=None, help="an earlier run (dir or run.json): exit 1 on a regression"
    )
    how.add_argument(
        "--dry-run",
        nargs="?",
        const="text",
        default=None,
        choices=("text", "json"),
        help="list the checks that would run or skip (and why) and what each would create; create nothing "
        "(with --kubeconfig or in a Pod it reads the GPU nodes); --dry-run=json for JSON",
    )
    how.add_argument("pytest_args", nargs="*", help="after --: more pytest arguments (e.g. -x, -k EXPR)")
    add_implementation_options(parser)
    add_sandbox_options(parser.add_argument_group("the embedded sandbox (without --kubeconfig)"))
    parser.set_defaults(func=cmd_run)

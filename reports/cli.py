"""``gpuconf report``: render a recorded run, build its Allure site, compare two runs.

- ``gpuconf report render RUN_DIR --format yaml|html|junit|allure|text|all`` writes the chosen
  renderings into RUN_DIR (or ``--output``); ``text`` prints the terminal summary. The
  ConformanceReport needs who submits it (``--submitter FILE``, or ``--organization``,
  ``--project``, ``--url``, ``--version`` and ``--contact``) to be a submission.
- ``gpuconf report allure RUN_DIR`` writes ``allure-results/`` and builds ``allure-report/`` with
  the Allure 3 command line, or says how to install it (exit 2).
- ``gpuconf report diff BEFORE AFTER`` lists regressions, recoveries, new skips and moved figures;
  exit 1 on a regression. Either side: a run folder, a ``run.json``, a ConformanceReport YAML or a
  submission bundle.
- ``bundle``, ``verify`` and ``attest`` (submissions) are ``conformance.certify``'s: they judge
  completeness against the catalog, which lives above this part; ``subcommands`` hands them this
  command's subparsers.

Exit codes: 0 done (diff: no regression), 1 a regression (diff), 2 unreadable input or a missing
tool.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from reports import diff as diff_module
from reports import submitter
from reports.model import Implementation, RunRecord
from reports.render import FORMATS, render
from reports.terminal import summary

EXIT_OK, EXIT_REGRESSION, EXIT_INPUT = 0, 1, 2


def _load(path: Path) -> RunRecord | None:
    try:
        return diff_module.load(path)
    except (OSError, ValueError, KeyError, TypeError) as exc:  # json errors are ValueErrors
        print(f"gpuconf report: cannot read the run at {path}: {exc}", file=sys.stderr)
        return None


def implementation_from(args: argparse.Namespace) -> Implementation | None:
    """Who submits: the submitter file (``--submitter``), with any of the single options over it.
    Raises ``SubmitterError`` for a file that cannot be read or breaks its schema."""
    path = getattr(args, "submitter", None)
    base = submitter.load(path) if path else Implementation()
    contact = [c.strip() for value in args.contact or [] for c in value.split(",") if c.strip()]
    given = replace(
        base,
        organization=args.organization or base.organization,
        project=args.project or base.project,
        url=args.url or base.url,
        version=args.impl_version or base.version,
        contact=contact or base.contact,
    )
    return given if given != Implementation() else None


def cmd_render(args: argparse.Namespace) -> int:
    record = _load(args.run_dir)
    if record is None:
        return EXIT_INPUT
    out = args.output or (args.run_dir if args.run_dir.is_dir() else args.run_dir.parent)
    try:
        impl = implementation_from(args)
    except submitter.SubmitterError as exc:
        print(f"gpuconf report: {exc}", file=sys.stderr)
        return EXIT_INPUT
    chosen = FORMATS if args.format == "all" else () if args.format == "text" else (args.format,)
    if args.format in ("text", "all"):
        sys.stdout.write(summary(record))
    for fmt in chosen:
        print(f"gpuconf report: wrote {render(record, out, fmt, impl)}")
    if "yaml" in chosen:
        missing = (impl or record.implementation).missing()
        if missing:
            print(
                "gpuconf report: the ConformanceReport is not a submission until you give "
                + ", ".join(f"--{m}" for m in missing),
                file=sys.stderr,
            )
    return EXIT_OK


def cmd_allure(args: argparse.Namespace) -> int:
    from reports.allure import AllureUnavailable, build_site, write_results

    record = _load(args.run_dir)
    if record is None:
        return EXIT_INPUT
    base = args.run_dir if args.run_dir.is_dir() else args.run_dir.parent
    results = write_results(record, base / "allure-results")
    print(f"gpuconf report: wrote {results}")
    try:
        index = build_site(results, args.output or base / "allure-report")
    except AllureUnavailable as exc:
        print(f"gpuconf report: {exc}", file=sys.stderr)
        return EXIT_INPUT
    except RuntimeError as exc:
        print(f"gpuconf report: the Allure site was not built: {exc}", file=sys.stderr)
        return EXIT_INPUT
    print(f"gpuconf report: Allure site at {index} (serve it: allure open {index.parent})")
    return EXIT_OK


def cmd_diff(args: argparse.Namespace) -> int:
    before, after = _load(args.before), _load(args.after)
    if before is None or after is None:
        return EXIT_INPUT
    result = diff_module.diff(before, after, args.tolerance)
    if args.json:
        print(
            json.dumps(
                {
                    "regressed": result.regressed,
                    "recovered": result.recovered,
                    "newlySkipped": result.newly_skipped,
                    "added": result.added,
                    "removed": result.removed,
                    "figures": [m.__dict__ for m in result.moved],
                    "regression": bool(result.exit_code()),
                },
                indent=2,
            )
        )
    else:
        print("\n".join(result.lines()))
    return result.exit_code()


def add_implementation_options(parser: argparse.ArgumentParser) -> None:
    """Who submits the ConformanceReport (also used by ``gpuconf run``)."""
    group = parser.add_argument_group("implementation (required for a ConformanceReport submission)")
    group.add_argument(
        "--submitter",
        type=Path,
        metavar="FILE",
        help="who submits which product version, as YAML: organization, project, url, version, contact, "
        "type, repository, documentation (the options below override its values)",
    )
    group.add_argument("--organization", help="the organization that makes the implementation")
    group.add_argument("--project", help="the implementation's project name")
    group.add_argument("--url", help="the implementation's home page")
    group.add_argument("--version", dest="impl_version", metavar="VERSION", help="the version under test")
    group.add_argument("--contact", action="append", help="contact (repeatable or comma-separated)")


def register(subparsers: Any) -> None:
    """Add ``report`` (render, allure, diff) to the ``gpuconf`` command line."""
    report = subparsers.add_parser(
        "report",
        help="render a recorded run, compare two runs, bundle and verify a submission",
        description="Render a recorded run (a report directory with run.json), build its Allure site, "
        "compare two runs before and after an upgrade, or bundle, verify and attest a submission.",
    )
    sub = report.add_subparsers(dest="report_command", metavar="SUBCOMMAND")
    sub.required = True
    report.set_defaults(report_subcommands=sub)

    render_p = sub.add_parser(
        "render", help="write the run's renderings", description=__doc__.split("\n\n")[0]
    )
    render_p.add_argument("run_dir", type=Path, metavar="RUN_DIR", help="report directory (or its run.json)")
    render_p.add_argument(
        "--format", choices=(*FORMATS, "text", "all"), default="all", help="what to write (default: all)"
    )
    render_p.add_argument("--output", type=Path, help="where to write (default: RUN_DIR)")
    add_implementation_options(render_p)
    render_p.set_defaults(func=cmd_render)

    allure_p = sub.add_parser("allure", help="build the Allure site (Allure 3 CLI, Node.js)")
    allure_p.add_argument("run_dir", type=Path, metavar="RUN_DIR")
    allure_p.add_argument("--output", type=Path, help="site folder (default: RUN_DIR/allure-report)")
    allure_p.set_defaults(func=cmd_allure)

    diff_p = sub.add_parser(
        "diff",
        help="compare two runs: regressions, recoveries, new skips, moved figures",
        epilog="exit codes: 0 no regression, 1 a regression, 2 unreadable input",
    )
    diff_p.add_argument("before", type=Path, metavar="BEFORE", help="the run before the upgrade")
    diff_p.add_argument("after", type=Path, metavar="AFTER", help="the run after it")
    diff_p.add_argument(
        "--tolerance",
        type=float,
        default=diff_module.TOLERANCE,
        help=f"share a figure may move (default {diff_module.TOLERANCE})",
    )
    diff_p.add_argument("--json", action="store_true", help="print the comparison as JSON")
    diff_p.set_defaults(func=cmd_diff)


def subcommands(parser: argparse.ArgumentParser) -> Any:
    """``gpuconf report``'s subcommands, for the parts above that add their own (``bundle``, ``verify``)."""
    return parser.get_default("report_subcommands")


def baseline_check(record: RunRecord, baseline: Path, tolerance: float = diff_module.TOLERANCE) -> int:
    """``gpuconf run --baseline REPORT``: compare the finished run with an earlier one; 1 on a regression."""
    before = _load(baseline)
    if before is None:
        return EXIT_INPUT
    result = diff_module.diff(before, record, tolerance)
    print(f"gpuconf: compared with {baseline}:")
    print("\n".join(result.lines()))
    return result.exit_code()

"""``gpuconf report bundle|verify|attest``: the command line over ``bundle``, ``verify`` and ``attest``.

Registered under ``gpuconf report`` by ``conformance.cli`` (``reports.cli`` owns the group and the
submitter options, but may not import the catalog that verification needs). Each command catches its
own expected errors and returns an exit code.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from conformance.certify.attestation import PREDICATE_TYPE, attest
from conformance.certify.bundling import BundleError, bundle
from conformance.certify.layout import PREDICATE, README, SIGNED, SUMS, find_submission
from conformance.certify.verification import verify
from reports import submitter as submitter_module

EXIT_OK, EXIT_NOT_SUBMITTABLE, EXIT_USAGE = 0, 1, 2


def cmd_bundle(args: argparse.Namespace) -> int:
    from reports.cli import implementation_from

    try:
        impl = implementation_from(args)
        folder = bundle(args.run_dir, args.out, impl, args.readme)
    except (BundleError, submitter_module.SubmitterError) as exc:
        print(f"gpuconf report bundle: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except (OSError, ValueError, KeyError) as exc:
        print(f"gpuconf report bundle: cannot read the run at {args.run_dir}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"gpuconf report bundle: wrote {folder}")
    print(f"complete the Reproduce section of {folder / README}, then: gpuconf report verify {args.out}")
    return EXIT_OK


def cmd_verify(args: argparse.Namespace) -> int:
    if not args.dir.is_dir():
        print(f"gpuconf report verify: {args.dir}: not a folder", file=sys.stderr)
        return EXIT_USAGE
    try:
        result = verify(args.dir, require_signature=args.require_signature)
    except FileNotFoundError as exc:
        print(f"gpuconf report verify: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if args.json:
        print(json.dumps(result.as_dict(), indent=2))
    else:
        print("\n".join(result.lines()))
    return EXIT_OK if result.submittable else EXIT_NOT_SUBMITTABLE


def cmd_attest(args: argparse.Namespace) -> int:
    folder = find_submission(args.dir) if args.dir.is_dir() else None
    if folder is None or not (folder / SUMS).is_file():
        print(f"gpuconf report attest: {args.dir}: no bundled submission (with {SUMS}) here", file=sys.stderr)
        return EXIT_USAGE
    written = attest(folder)
    print(f"gpuconf report attest: wrote {', '.join(str(p) for p in written)}")
    print(
        f"sign it with your own tooling, e.g. (in {folder}): cosign attest-blob --predicate {PREDICATE} "
        f"--type {PREDICATE_TYPE} --bundle {SIGNED} {SUMS}"
    )
    return EXIT_OK


def register_report(sub: Any) -> None:
    """Add ``bundle``, ``verify`` and ``attest`` to ``gpuconf report``'s subcommands."""
    from reports.cli import add_implementation_options

    b = sub.add_parser(
        "bundle",
        help="write a submission folder from a recorded run",
        description="Write <gpuconf major.minor>/<org>-<project>/<profiles>-<version>/ under --out: "
        "report.yaml, a redacted run.json, junit.xml, evidence.tar.gz, README.md (with Reproduce) and "
        "SHA256SUMS. Refuses an interrupted run. Bundling one run twice gives identical bytes.",
    )
    b.add_argument(
        "run_dir", type=Path, metavar="RUN_DIR", help="the run's report directory (or its run.json)"
    )
    b.add_argument("--out", type=Path, required=True, metavar="DIR", help="where the submission folder goes")
    b.add_argument(
        "--readme", type=Path, metavar="FILE", help="your completed README.md (default: generated)"
    )
    add_implementation_options(b)
    b.set_defaults(func=cmd_bundle)

    v = sub.add_parser(
        "verify",
        help="check a submission: every requirement PASS or FAIL",
        epilog="exit codes: 0 submittable, 1 not, 2 usage",
    )
    v.add_argument("dir", type=Path, metavar="DIR", help="the submission folder, or the folder it lies under")
    v.add_argument("--json", action="store_true", help="print the requirements as JSON")
    v.add_argument(
        "--require-signature",
        action="store_true",
        help=f"also require {SIGNED} (cosign attest-blob) and check it with cosign",
    )
    v.set_defaults(func=cmd_verify)

    a = sub.add_parser("attest", help="write an in-toto Statement (test-result) over SHA256SUMS, to sign")
    a.add_argument("dir", type=Path, metavar="DIR")
    a.set_defaults(func=cmd_attest)

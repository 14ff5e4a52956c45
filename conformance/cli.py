"""The ``gpuconf`` command line.

Each subcommand lives beside the code it drives and exposes ``register(subparsers)``;
this module only lists them. Keeping the list here (rather than discovering modules by
import side effects) makes the set of commands one reviewable line each, and lets a
command whose module fails to import report that instead of taking the whole CLI down.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

# Order is the order shown in ``gpuconf --help``. Each command catches its own expected
# errors and returns an exit code (0 ok, 1 findings/failure, 2 usage or unreadable input).
COMMAND_MODULES: tuple[str, ...] = (
    "fixtures.sandbox.cli",  # gpuconf sandbox up|down|status|kubeconfig
    "conformance.run",  # gpuconf run: the conformance suite
    "conformance.catalog",  # gpuconf catalog: the declared checks, and the checked-in list
    "conformance.mutate",  # gpuconf mutate: the suite against every seeded fault
    "conformance.lint",  # gpuconf lint, gpuconf checklist
    "conformance.probe",  # gpuconf probe: node-level checks without Kubernetes
    "reports.cli",  # gpuconf report render|allure|diff: renderings of a recorded run, and diffs
)
REPORT_MODULES: tuple[str, ...] = (
    "conformance.certify.cli",  # gpuconf report bundle|verify|attest: submissions (needs the catalog)
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="gpuconf",
        description="Conformance harness for memory-enforced GPU sharing on Kubernetes.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # not written yet in this checkout; nothing to offer
                continue
            raise
        module.register(sub)
    if "report" in sub.choices:
        from reports.cli import subcommands

        for name in REPORT_MODULES:
            importlib.import_module(name).register_report(subcommands(sub.choices["report"]))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # output piped into `head` and the like: not an error
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print("gpuconf: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

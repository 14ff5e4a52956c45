"""The catalog: every conformance check as one reviewable list, generated from the checks themselves.

``conformance/catalog.yaml`` is checked in, like Kubernetes' ``conformance.yaml``: it is generated
from the declared checks (``@check`` values, never comments parsed by position), and a test fails
when the file and the code disagree. A change to the contract the suite judges is then one diff a
reviewer reads in one place. Fix a drift with ``gpuconf catalog --write``.

``gpuconf catalog`` prints it; ``--check`` exits 1 on a drift (for CI and pre-commit hooks).
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import pkgutil
import sys
from pathlib import Path
from typing import Any, Final

import yaml

from fixtures.suite.checks import FEATURES, PROFILES, REGISTRY, Check

PACKAGE_DIR: Final = Path(__file__).resolve().parent
CATALOG_PATH: Final = PACKAGE_DIR / "catalog.yaml"
HEADER: Final = (
    "# The gpuconf conformance catalog: every check, generated from the checks' declarations.\n"
    "# Do not edit by hand: `gpuconf catalog --write` regenerates it; a test fails when it drifts.\n"
)


def load_checks() -> list[Check]:
    """Import every check module of this package; the declared checks, sorted by id."""
    for info in pkgutil.iter_modules([str(PACKAGE_DIR)]):
        if info.name.startswith("test_"):
            importlib.import_module(f"{__package__}.{info.name}")
    return sorted(REGISTRY.values(), key=lambda c: c.id)


def _file_of(declared: Check) -> str:
    module = getattr(declared.body, "__module__", "")
    return module.replace(".", "/") + ".py" if module else ""


def catalog_data() -> dict[str, Any]:
    checks = load_checks()
    return {
        "apiVersion": "gpuconf.io/v1alpha1",
        "kind": "ConformanceCatalog",
        "profiles": [p for p in PROFILES if any(p in c.profiles for c in checks)],
        "features": [{"name": f.name, "description": f.description} for f in FEATURES.values()],
        "checks": [{**c.catalog_entry(), "file": _file_of(c)} for c in checks],
    }


def render() -> str:
    return HEADER + yaml.safe_dump(catalog_data(), sort_keys=False, width=100, allow_unicode=True)


def drift(path: Path = CATALOG_PATH) -> list[str]:
    """The unified diff from the checked-in catalog to the one the code declares (empty: in step)."""
    current = path.read_text() if path.exists() else ""
    wanted = render()
    if current == wanted:
        return []
    return list(
        difflib.unified_diff(
            current.splitlines(), wanted.splitlines(), str(path), "declared checks", lineterm=""
        )
    )


def cmd_catalog(args: argparse.Namespace) -> int:
    if args.write:
        CATALOG_PATH.write_text(render())
        print(f"wrote {CATALOG_PATH} ({len(load_checks())} checks)")
        return 0
    if args.check:
        lines = drift()
        if lines:
            print("\n".join(lines))
            print(
                "\nthe catalog drifted from the declared checks: run `gpuconf catalog --write`",
                file=sys.stderr,
            )
            return 1
        print(f"{CATALOG_PATH}: in step with {len(load_checks())} declared checks")
        return 0
    sys.stdout.write(render())
    return 0


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "catalog", help="the conformance checks: print, --check against the file, --write it"
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", action="store_true", help=f"regenerate {CATALOG_PATH.name}")
    mode.add_argument("--check", action="store_true", help="exit 1 when the checked-in catalog drifted")
    parser.set_defaults(func=cmd_catalog)

"""``gpuconf run``'s ``--reports`` and ``--cleanup``: what they accept, and what reaches pytest."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from conformance.run import pytest_args, report_formats, validate
from reports.render import FORMATS


def test_all_and_none_and_a_list() -> None:
    assert report_formats("all") == FORMATS
    assert report_formats("none") == ()
    assert report_formats("junit, yaml,junit") == ("junit", "yaml")


@pytest.mark.parametrize("value", ["pdf", "yaml,pdf", ","])
def test_an_unknown_format_is_refused_naming_it_and_the_known_ones(value: str) -> None:
    with pytest.raises(ValueError, match="--reports") as exc:
        report_formats(value)
    assert all(f in str(exc.value) for f in FORMATS)


def _args(**over: object) -> argparse.Namespace:
    from conformance.cli import build_parser

    args = build_parser().parse_args(["run", "--skip-preflight"])
    for key, value in over.items():
        setattr(args, key, value)
    return args


def test_validate_names_a_bad_reports_value() -> None:
    problem = validate(_args(reports="html,docx"))
    assert problem is not None and "'docx'" in problem


def test_cleanup_pods_reaches_the_plugin_and_wait_is_its_default() -> None:
    kubeconfig = Path("/nonexistent/kubeconfig")
    assert "--cleanup=pods" in pytest_args(_args(cleanup="pods"), kubeconfig, "s", "cluster")
    assert not any(a.startswith("--cleanup") for a in pytest_args(_args(), kubeconfig, "s", "cluster"))

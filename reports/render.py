"""Every rendering of one run, in one call: what ``gpuconf run`` writes at the end of a run.

``render_all(record, directory)`` writes, beside ``run.json``: ``report.yaml`` (the
ConformanceReport), ``report.html``, ``junit.xml`` and ``allure-results/``. ``gpuconf report
render`` writes any one of them from a recorded run.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Final

from reports import allure, conformance, html, junit
from reports.model import Implementation, RunRecord

FORMATS: Final = ("yaml", "html", "junit", "allure")
FILES: Final = {
    "yaml": "report.yaml",
    "html": "report.html",
    "junit": "junit.xml",
    "allure": "allure-results",
}


def _writers() -> dict[str, Callable[[RunRecord, Path, Implementation | None], Path]]:
    return {
        "yaml": conformance.write_yaml,
        "html": html.write_html,
        "junit": lambda record, path, _impl: junit.write_junit(record, path),
        "allure": lambda record, path, _impl: allure.write_results(record, path),
    }


def render(
    record: RunRecord, directory: Path, fmt: str, implementation: Implementation | None = None
) -> Path:
    """Write one format (``FORMATS``) of ``record`` into ``directory``; returns what it wrote."""
    if fmt not in FORMATS:
        raise ValueError(f"format {fmt!r}: known formats are {', '.join(FORMATS)}")
    if record.directory is None:
        record.directory = directory
    directory.mkdir(parents=True, exist_ok=True)
    return _writers()[fmt](record, directory / FILES[fmt], implementation)


def render_all(
    record: RunRecord,
    directory: Path,
    implementation: Implementation | None = None,
    formats: tuple[str, ...] = FORMATS,
) -> list[Path]:
    """Write each of ``formats`` (default: every one) of ``record`` into ``directory``."""
    return [render(record, directory, fmt, implementation) for fmt in formats]

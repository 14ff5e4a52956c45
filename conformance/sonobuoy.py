"""Sonobuoy's results protocol, for ``gpuconf run`` as a Sonobuoy plugin (``conformance/deploy``).

Sonobuoy runs a plugin's container beside a worker that waits for the file ``done`` in the
results directory (``$SONOBUOY_RESULTS_DIR``, mounted from the worker). The plugin writes its
results first, then ``done``, whose content is the path of the results file; the worker hands
that file to the aggregator. gpuconf's plugin definition says ``result-format: junit``, so the
aggregator reads the JUnit XML in it.

When ``SONOBUOY_RESULTS_DIR`` is set, ``gpuconf run`` ends (``finish``) by packing its whole report
directory (``junit.xml``, ``report.yaml``, ``report.html``, ``run.json``, the evidence) into
``$SONOBUOY_RESULTS_DIR/gpuconf-results.tar.gz`` and then writing that path into ``done``. A run
that ended before any check was judged (a usage or preflight error, exit code 2) still writes a
``junit.xml`` with one errored test case saying why, so Sonobuoy reports the error instead of
waiting for a ``done`` that never comes.
"""

from __future__ import annotations

import json
import os
import tarfile
from collections.abc import Mapping
from pathlib import Path
from typing import Final
from xml.sax.saxutils import quoteattr

ENV_RESULTS_DIR: Final = "SONOBUOY_RESULTS_DIR"
DONE: Final = "done"
TARBALL: Final = "gpuconf-results.tar.gz"
ARCNAME: Final = "gpuconf-results"


def results_dir(environ: Mapping[str, str] | None = None) -> Path | None:
    """The Sonobuoy results directory this process must report to, or None outside Sonobuoy."""
    value = (os.environ if environ is None else environ).get(ENV_RESULTS_DIR, "").strip()
    return Path(value) if value else None


def error_junit(message: str) -> str:
    """A JUnit document with one errored test case: the run could not judge anything."""
    text = quoteattr(message[:2000])
    return (
        '<?xml version="1.0" encoding="utf-8"?>\n'
        '<testsuites name="gpuconf" tests="1" errors="1" failures="0">\n'
        '  <testsuite name="gpuconf" tests="1" errors="1" failures="0" skipped="0">\n'
        '    <testcase classname="gpuconf" name="gpuconf run">\n'
        f"      <error message={text}>{quoteattr(message)[1:-1]}</error>\n"
        "    </testcase>\n"
        "  </testsuite>\n"
        "</testsuites>\n"
    )


def _why_nothing(report_dir: Path, exit_code: int) -> str:
    preflight = report_dir / "preflight.json"
    try:
        failed = json.loads(preflight.read_text()).get("failed") if preflight.exists() else None
    except (OSError, ValueError):
        failed = None
    if failed:
        return f"preflight failed: {failed}"
    return f"gpuconf run ended with exit code {exit_code} before any check was judged (see the Pod's log)"


def finish(report_dir: Path, results: Path, exit_code: int) -> Path:
    """Hand the run's results to Sonobuoy: the tarball first, ``done`` (naming it) last. Returns the
    tarball's path."""
    report_dir = report_dir.resolve()
    results = results.resolve()
    report_dir.mkdir(parents=True, exist_ok=True)
    results.mkdir(parents=True, exist_ok=True)
    junit = report_dir / "junit.xml"
    if not junit.exists():
        junit.write_text(error_junit(_why_nothing(report_dir, exit_code)))
    tarball = results / TARBALL
    partial = results / f".{TARBALL}.partial"
    skip = {tarball, partial, results / DONE, results / f".{DONE}.partial"}

    def keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        # The report directory may be the results directory itself: never pack the tarball or done.
        relative = Path(info.name).relative_to(ARCNAME) if info.name != ARCNAME else Path()
        return None if report_dir / relative in skip else info

    with tarfile.open(partial, "w:gz") as tar:
        tar.add(report_dir, arcname=ARCNAME, filter=keep)
    partial.replace(tarball)
    done_partial = results / f".{DONE}.partial"
    done_partial.write_text(str(tarball))
    done_partial.replace(results / DONE)
    return tarball

"""Allure results from the result model, and the Allure site built from them.

``write_results`` writes what allure-pytest would have written for the run, from the model alone
(so it works from a recorded run): one ``<uuid>-result.json`` per check, written with
allure-python-commons' own model and file logger, with labels (profile: epic, capability:
feature, check id: story, party: tag, MUST: critical severity; ``not-judged``: a tag, a skipped step
per part of the rule not judged for the implementation, and a line in the description, the
result's status staying the check's outcome) and attachments (the Pod manifests
as submitted, workload results, Events, ``nvidia-smi`` output, logs, Pod timelines, plots), plus
``environment.properties`` and ``executor.json`` in the results directory.

``build_site`` runs the Allure 3 command line (the npm package ``allure``, Node only, no Java)
when it is installed: on PATH, in ``$GPUCONF_ALLURE``, or under ``~/.cache/gpuconf/allure``
(where ``.ci/run`` installs it); otherwise ``AllureUnavailable`` says how to install it.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path
from typing import Final

from allure_commons.logger import AllureFileLogger
from allure_commons.model2 import (
    ATTACHMENT_PATTERN,
    Attachment,
    Label,
    Parameter,
    Status,
    StatusDetails,
    TestResult,
    TestStepResult,
)

from reports import figures, plots
from reports.environment import complete, describe
from reports.levels import level_of
from reports.model import NOT_JUDGED, CheckResult, RunRecord

STATUS: Final = {
    "passed": Status.PASSED,
    "failed": Status.FAILED,
    "error": Status.BROKEN,
    "skipped": Status.SKIPPED,
}
SEVERITY: Final = {"MUST": "critical", "SHOULD": "normal", "MAY": "minor"}
NOT_JUDGED_TAG: Final = "not-judged"
"""The tag of a result with a part of its rule not judged for the implementation (to filter on)."""
CLI_CACHE: Final = Path.home() / ".cache" / "gpuconf" / "allure"
INSTALL_HINT: Final = (
    "the Allure 3 command line is not installed; it needs Node.js (no Java): "
    f"npm install --prefix {CLI_CACHE} allure   (or set GPUCONF_ALLURE to its allure binary)"
)
SITE_TIMEOUT_S: Final = 300.0


class AllureUnavailable(RuntimeError):
    """The Allure command line (or Node.js) is not installed; the message says how to install it."""


def _attach(
    logger: AllureFileLogger, test: TestResult, name: str, body: bytes | str, mime: str, ext: str
) -> None:
    source = ATTACHMENT_PATTERN.format(prefix=uuid.uuid4(), ext=ext)
    logger.report_attached_data(body=body, file_name=source)
    test.attachments.append(Attachment(name=name, source=source, type=mime))


def _svg(uri: str | None) -> bytes | None:
    prefix = "data:image/svg+xml;base64,"
    return base64.b64decode(uri[len(prefix) :]) if uri and uri.startswith(prefix) else None


def _attachments(logger: AllureFileLogger, test: TestResult, record: RunRecord, r: CheckResult) -> None:
    for name, path in sorted(figures.files(record, r).items()):
        is_json = path.suffix == ".json"
        what = "manifest" if name.startswith("pod-") and name.endswith("-submitted.json") else "evidence"
        _attach(
            logger,
            test,
            f"{what}: {name}",
            path.read_bytes(),
            "application/json" if is_json else "text/plain",
            "json" if is_json else "txt",
        )
    f = figures.facts(record, r)
    if f.get("events"):
        _attach(logger, test, "Events", json.dumps(f["events"], indent=1), "application/json", "json")
    for key in ("nvidia_smi", "nvidiaSmi"):
        if f.get(key) is not None:
            _attach(logger, test, "nvidia-smi", json.dumps(f[key], indent=1), "application/json", "json")
    for name, result in figures.workloads(record, r).items():
        _attach(
            logger, test, f"workload result: {name}", json.dumps(result, indent=1), "application/json", "json"
        )
    pods = figures.pods(record, r)
    if pods:
        _attach(
            logger,
            test,
            "Pods (annotations at binding)",
            json.dumps(pods, indent=1),
            "application/json",
            "json",
        )
    for title, uri in (
        ("plot: memory over time", plots.memory_over_time(figures.memory_timelines(record, r), r.key)),
        ("plot: kernel timelines", plots.kernel_timelines(figures.modes(record, r), r.key)),
        ("plot: density ramp", plots.density_ramp(figures.density_ramp(record, r), r.key)),
    ):
        svg = _svg(uri)
        if svg is not None:
            _attach(logger, test, title, svg, "image/svg+xml", "svg")


def test_result(record: RunRecord, r: CheckResult) -> TestResult:
    start = int((r.started or record.started) * 1000)
    ident = hashlib.md5(f"gpuconf:{r.key}".encode(), usedforsecurity=False).hexdigest()
    labels = [
        Label("epic", r.profile),
        Label("feature", r.capability),
        Label("story", r.id),
        Label("tag", r.party),
        Label("tag", r.level),
        Label("severity", SEVERITY.get(r.level, "normal")),
        Label("parentSuite", "gpuconf"),
        Label("suite", r.profile),
        Label("subSuite", r.capability),
        Label("framework", "gpuconf"),
        Label("language", "python"),
    ]
    labels += [Label("tag", f"feature:{f}") for f in r.features]
    params = [Parameter(name="profile", value=r.profile)]
    if r.form:
        params.append(Parameter(name="form", value=r.form))
    not_judged = r.not_judged()
    if not_judged:
        labels.append(Label("tag", NOT_JUDGED_TAG))
    details = None
    if r.outcome != "passed":
        details = StatusDetails(message=r.reason, trace="\n".join([r.detail, *r.notes]).strip() or None)
    return TestResult(
        uuid=str(uuid.uuid4()),
        historyId=ident,
        testCaseId=ident,
        fullName=f"gpuconf.{r.profile}.{r.capability}.{r.key}",
        name=r.key,
        description=description(r),
        status=STATUS[r.outcome],
        statusDetails=details,
        stage="finished",
        start=start,
        stop=start + int(r.duration_s * 1000),
        labels=labels,
        parameters=params,
        titlePath=["gpuconf", r.profile, r.capability],
        # A skipped step per part not judged: Allure shows it apart from the result's status,
        # which stays the check's outcome.
        steps=[
            TestStepResult(
                name=f"{NOT_JUDGED}{part}", status=Status.SKIPPED, stage="finished", start=start, stop=start
            )
            for part in not_judged
        ],
    )


def description(r: CheckResult) -> str:
    """The check's statement, then (Markdown) what it did not judge for the implementation."""
    parts = r.not_judged()
    if not parts:
        return r.statement
    return "\n\n".join(
        [r.statement, "**Not judged** for this implementation (the outcome stands):"]
    ) + "".join(f"\n- {part}" for part in parts)


def write_results(record: RunRecord, directory: Path) -> Path:
    """Write the run's Allure results into ``directory`` (emptied first); returns it."""
    logger = AllureFileLogger(directory, clean=True)
    for r in record.results:
        test = test_result(record, r)
        _attachments(logger, test, record, r)
        logger.report_result(test)
    env = describe(complete(record))
    lines = [f"{_key(label)}={value}" for label, value in env]
    lines += [f"Run={record.run_id}", f"Mode={record.mode}", f"gpuconf={record.gpuconf_version}"]
    # Allure's overview shows these: the level names the checks not judged, and the mechanisms
    # the implementation does not claim were judged by no check.
    lines.append(f"Level={level_of(record).line()}")
    not_claimed = sorted((record.under_test or {}).get("mechanismsNotClaimed") or {})
    if not_claimed:
        lines.append(f"Not.judged.mechanisms={', '.join(not_claimed)}")
    (directory / "environment.properties").write_text("\n".join(lines) + "\n")
    executor = {
        "name": "gpuconf",
        "type": "gpuconf",
        "buildName": record.run_id,
        "reportName": f"gpuconf conformance {record.run_id}",
    }
    (directory / "executor.json").write_text(json.dumps(executor, indent=2) + "\n")
    return directory


def _key(label: str) -> str:
    """``GPU memory (MiB)`` -> ``gpu.memory.mib``: a properties key without spaces."""
    return ".".join("".join(c if c.isalnum() else " " for c in label.lower()).split())


def find_cli() -> list[str]:
    """The command that runs the Allure 3 CLI; ``AllureUnavailable`` when there is none."""
    explicit = os.environ.get("GPUCONF_ALLURE")
    candidates = [explicit] if explicit else []
    candidates += [str(CLI_CACHE / "node_modules" / ".bin" / "allure"), shutil.which("allure") or ""]
    for candidate in candidates:
        if candidate and Path(candidate).is_file() and os.access(candidate, os.X_OK):
            if shutil.which("node") is None:
                raise AllureUnavailable(f"{candidate} needs Node.js, which is not installed")
            return [candidate]
    raise AllureUnavailable(INSTALL_HINT)


def build_site(results: Path, output: Path) -> Path:
    """Build the Allure site from ``results`` into ``output``; returns its ``index.html``."""
    command = [*find_cli(), "generate", str(results), "--output", str(output)]
    try:
        proc = subprocess.run(command, capture_output=True, text=True, timeout=SITE_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise AllureUnavailable(f"{' '.join(command)} could not run: {exc}") from exc
    index = output / "index.html"
    if proc.returncode != 0 or not index.is_file():
        tail = (proc.stderr or proc.stdout).strip()[-2000:]
        raise RuntimeError(f"{' '.join(command)} exited {proc.returncode}: {tail}")
    return index

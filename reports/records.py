"""The files every run writes: ``run.json``, one JSON file per check under ``checks/``, ``junit.xml``.

Apart from the model (``reports.model``), which is plain data and imports no rendering: writing a
run's files includes its JUnit rendering (``reports.junit``).
"""

from __future__ import annotations

import json
from pathlib import Path

from reports.junit import write_junit
from reports.model import RunRecord, check_file_name


def write_run(record: RunRecord, directory: Path) -> list[Path]:
    """Write ``run.json``, one JSON file per check under ``checks/``, and ``junit.xml``."""
    directory.mkdir(parents=True, exist_ok=True)
    checks = directory / "checks"
    checks.mkdir(exist_ok=True)
    for result in record.results:
        (checks / check_file_name(result.key)).write_text(
            json.dumps(result.as_dict(), indent=2, default=str) + "\n"
        )
    run = directory / "run.json"
    run.write_text(json.dumps(record.as_dict(), indent=2, default=str) + "\n")
    junit = write_junit(record, directory / "junit.xml")
    return [run, checks, junit]

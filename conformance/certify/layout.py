"""A submission's layout: the files it holds, the folder it lies in, and how to find it.

``bundle`` writes this layout, ``verify`` judges it and ``attest`` signs over it: the names live here,
below all three, so that none of them imports another for a file name.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

from reports.digests import ARCHIVE
from reports.model import RunRecord

REPORT: Final = "report.yaml"
RUN: Final = "run.json"
JUNIT: Final = "junit.xml"
README: Final = "README.md"
SUMS: Final = "SHA256SUMS"
STATEMENT: Final = "attestation.intoto.json"
PREDICATE: Final = "attestation.predicate.json"
SIGNED: Final = "attestation.sigstore.json"
FILES: Final = (REPORT, RUN, JUNIT, ARCHIVE, README)
"""Every file a submission holds beside ``SHA256SUMS``."""
OPTIONAL_FILES: Final = (STATEMENT, PREDICATE, SIGNED)
"""Provenance over ``SHA256SUMS`` (``gpuconf report attest``, then the vendor's signature)."""
REPRODUCE: Final = "## Reproduce"


def minor_of(version: str) -> tuple[int, int] | None:
    found = re.match(r"v?([0-9]+)\.([0-9]+)", version)
    return (int(found.group(1)), int(found.group(2))) if found else None


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._]+", "-", text.strip()).strip("-.").lower() or "unnamed"


def claimed_profiles(record: RunRecord) -> list[str]:
    return [str(p) for p in record.invocation.get("profiles") or []] or record.profiles()


def submission_path(record: RunRecord) -> Path:
    """``<gpuconf major.minor>/<org>-<project>/<profiles>-<implementation version>``."""
    impl = record.implementation
    version = str(record.suite.get("version") or record.gpuconf_version)
    minor = minor_of(version)
    release = f"{minor[0]}.{minor[1]}" if minor else _slug(version)
    profiles = "+".join(claimed_profiles(record))
    return Path(
        release, f"{_slug(impl.organization)}-{_slug(impl.project)}", f"{profiles}-{_slug(impl.version)}"
    )


def find_submission(directory: Path) -> Path | None:
    """The submission folder: ``directory`` itself when it holds report.yaml, else the one folder
    three levels below that does (``<minor>/<org>-<project>/<profiles>-<version>``)."""
    if (directory / REPORT).is_file() or (directory / RUN).is_file():
        return directory
    found = sorted(p.parent for p in directory.glob(f"*/*/*/{REPORT}"))
    return found[0] if len(found) == 1 else None

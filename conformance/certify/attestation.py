"""``gpuconf report attest``: an in-toto Statement (test-result predicate) over ``SHA256SUMS``.

gpuconf writes the Statement and its predicate only; the vendor signs them with their own tooling
(``cosign attest-blob``), so no key ever passes through the suite. ``verify`` computes the Statement
again from the submission (``statement``) and compares.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Final

from conformance.certify.layout import JUNIT, PREDICATE, REPORT, RUN, STATEMENT, SUMS
from reports.digests import ARCHIVE
from reports.levels import CONFORMANT, level_of
from reports.model import load_run
from reports.provenance import file_digest

STATEMENT_TYPE: Final = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE: Final = "https://in-toto.io/attestation/test-result/v0.1"


def statement(folder: Path) -> dict[str, Any]:
    """The in-toto Statement (test-result predicate) over the submission's ``SHA256SUMS``."""
    record = load_run(folder / RUN)
    sums = (folder / SUMS).read_bytes()
    level = level_of(record)
    configuration = [
        {
            "name": f"gpuconf {record.suite.get('version', '')}",
            "digest": _bare(str(record.suite.get("digest") or "")),
            "annotations": {
                "commit": str(record.suite.get("commit") or ""),
                "catalogDigest": str(record.suite.get("catalogDigest") or ""),
            },
        },
    ]
    for key in ("scheduler", "nodeAgent", "workloadImage"):
        comp = record.components.get(key) or {}
        configuration.append(
            {
                "name": str(comp.get("image") or comp.get("name") or key),
                "digest": _bare(str(comp.get("digest") or "")),
                "annotations": {"component": key, "reference": str(bool(comp.get("reference"))).lower()},
            }
        )
    configuration += [
        {"name": name, "digest": _bare(file_digest(folder / name))} for name in (REPORT, RUN, JUNIT, ARCHIVE)
    ]
    predicate = {
        "result": "PASSED"
        if level.name == CONFORMANT
        else ("FAILED" if level.name == "not conformant" else "WARNED"),
        "configuration": configuration,
        "url": record.implementation.url,
        "passedTests": sorted(r.key for r in record.results if r.outcome == "passed"),
        "warnedTests": sorted(r.key for r in record.results if r.outcome in ("skipped", "error")),
        "failedTests": sorted(r.key for r in record.results if r.outcome == "failed"),
    }
    return {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": SUMS, "digest": {"sha256": hashlib.sha256(sums).hexdigest()}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": predicate,
    }


def _bare(digest: str) -> dict[str, str]:
    return {"sha256": digest.removeprefix("sha256:")} if digest.startswith("sha256:") else {}


def attest(folder: Path) -> list[Path]:
    data = statement(folder)
    (folder / STATEMENT).write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    (folder / PREDICATE).write_text(json.dumps(data["predicate"], indent=2, sort_keys=True) + "\n")
    return [folder / STATEMENT, folder / PREDICATE]

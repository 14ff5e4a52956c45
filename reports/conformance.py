"""The ConformanceReport: what a vendor submits as evidence, shaped like Gateway API's.

``apiVersion: gpuconf.io/v1alpha1``, ``kind: ConformanceReport``; who submits (``implementation``:
organization, project, url, version, contact, given as options and required for a submission),
when (``date``), with which gpuconf (``gpuconfVersion``) and how the implementation was reached
(``mode``: sandbox, cluster or probe), the cluster it ran on, and per profile its result
(``success``, ``partial``, ``failure``; ``reports.verdicts``), statistics, the failed, skipped and
errored checks, and the supported and unsupported features; and, when the suite's version has a
mutation score (``reports.validation``), how good the suite is (``suiteValidation``: the seeded
faults it caught, when that was measured, and those it did not catch). The schema is
``reports/schema/conformance-report.schema.json``.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any, Final

import yaml

from reports.model import OUTCOMES, SCHEMA, Implementation, RunRecord
from reports.validation import validation
from reports.verdicts import profile_results, supported_features

KIND: Final = "ConformanceReport"
SCHEMA_FILE: Final = "conformance-report.schema.json"


def schema() -> dict[str, Any]:
    """The ConformanceReport's JSON Schema (draft 2020-12)."""
    text = resources.files("reports").joinpath("schema", SCHEMA_FILE).read_text()
    data: dict[str, Any] = json.loads(text)
    return data


def _cluster(record: RunRecord) -> dict[str, Any]:
    env = record.environment_view()
    return {
        "kubernetesVersion": env.kubernetes_version,
        "scheduler": {"name": env.scheduler_name, "version": env.scheduler_version},
        "nodeAgent": {"name": env.node_agent, "backend": env.agent_backend},
        "gpus": {
            "simulated": env.simulated,
            "product": env.gpu_product,
            "count": env.gpu_count,
            "memoryMiB": env.gpu_memory_mib,
            "driverVersion": env.driver_version,
            "cudaVersion": env.cuda_version,
        },
        "nodes": len(env.nodes),
    }


def report(record: RunRecord, implementation: Implementation | None = None) -> dict[str, Any]:
    """The ConformanceReport as plain data (``implementation`` overrides the record's)."""
    impl = implementation or record.implementation
    supported, unsupported = supported_features(record)
    profiles = []
    for p in profile_results(record):
        profiles.append(
            {
                "name": p.name,
                "result": p.result,
                "summary": p.summary(),
                "statistics": {o: p.counts[o] for o in OUTCOMES},
                "failedChecks": p.keys("failed"),
                "skippedChecks": [
                    {"name": r.key, "reason": r.reason} for r in p.results if r.outcome == "skipped"
                ],
                "erroredChecks": p.keys("error"),
                "supportedFeatures": p.supported_features,
                "unsupportedFeatures": p.unsupported_features,
            }
        )
    data: dict[str, Any] = {
        "apiVersion": SCHEMA,
        "kind": KIND,
        "implementation": asdict(impl),
        "date": datetime.fromtimestamp(record.started, UTC).isoformat(timespec="seconds"),
        "gpuconfVersion": record.gpuconf_version,
        "mode": record.mode,
        "runId": record.run_id,
        "durationSeconds": round(record.finished - record.started, 1),
        "cluster": _cluster(record),
        "supportedFeatures": supported,
        "unsupportedFeatures": unsupported,
        "profiles": profiles,
    }
    suite = validation(record)
    if suite is not None:
        data["suiteValidation"] = {
            "caught": suite.caught,
            "seeded": suite.seeded,
            "date": suite.date,
            "escaped": suite.escaped,
        }
    return data


def render_yaml(record: RunRecord, implementation: Implementation | None = None) -> str:
    impl = implementation or record.implementation
    head = ""
    if impl.missing():
        head = (
            "# Not yet a submission: give "
            + ", ".join(f"--{name}" for name in impl.missing())
            + " (gpuconf report render RUN_DIR --format yaml ...)\n"
        )
    body = yaml.safe_dump(report(record, impl), sort_keys=False, allow_unicode=True, width=110)
    return head + body


def write_yaml(record: RunRecord, path: Path, implementation: Implementation | None = None) -> Path:
    path.write_text(render_yaml(record, implementation))
    return path


def validate(data: dict[str, Any]) -> list[str]:
    """Schema errors of a ConformanceReport, one line each (empty: valid). Needs ``jsonschema``."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(schema())
    return [
        f"{'/'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}"
        for e in sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path))
    ]

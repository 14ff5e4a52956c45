"""The ConformanceReport: what a vendor submits as evidence, shaped like Gateway API's.

``apiVersion: gpuconf.io/v1alpha2``, ``kind: ConformanceReport`` (``v1alpha1``, the first
release's, is still read and validated against its own schema). It says:

- who submits which product version (``implementation``: organization, project, url, version,
  contact, type, repository and documentation URLs; the submitter file, ``--submitter FILE``);
- when, with which suite (``suite``: version, commit, whether its tree was modified, digests of
  the distribution, the catalog and the mutation score) and how the run was started
  (``invocation``: the redacted command line, profiles, request forms and features with their
  source, every filter, preflight, timeout scale, workers, interrupted);
- on what (``target``: sandbox, cluster or probe, the first release's ``mode``; ``cluster`` with
  ``components``: scheduler, node agent and workload image by digest, which are gpuconf's
  reference ones, per node its versions with its name hashed);
- the ``level`` (``reports.levels``): conformant, partial (with what was not judged) or not
  conformant, and whether it is sandbox-verified or judged gpuconf's reference components;
- per profile the result over its MUST checks (``success``, ``partial``, ``failure``;
  ``reports.verdicts``), MUST and SHOULD statistics apart, and **every** check with its outcome
  and the digest of its evidence (``reports.digests``), and what a check did not judge for the
  implementation (``notJudged``: a part of its rule the implementation does not claim; the outcome
  stands);
- the digests of ``run.json``, ``junit.xml`` and the evidence archive beside it (``evidence``);
- and how good the suite is (``suiteValidation``: the mutation score of its version, the first
  fidelity's at the top and, when it was scored in several, each one under ``fidelities`` with its
  fidelity, mode and date).

The schemas are ``reports/schema/conformance-report.<apiVersion>.schema.json``
(``conformance-report.schema.json`` is ``v1alpha1``'s).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any, Final

import yaml

from reports.digests import check_digests, file_digests
from reports.environment import complete
from reports.levels import level_of
from reports.model import OUTCOMES, SCHEMA, SCHEMA_V1ALPHA1, Implementation, RunRecord
from reports.validation import SuiteValidation, validations
from reports.verdicts import profile_results, supported_features

KIND: Final = "ConformanceReport"
SCHEMA_FILES: Final = {
    SCHEMA_V1ALPHA1: "conformance-report.schema.json",
    SCHEMA: "conformance-report.v1alpha2.schema.json",
}
SCHEMA_FILE: Final = SCHEMA_FILES[SCHEMA]


def schema(api_version: str = SCHEMA) -> dict[str, Any]:
    """The ConformanceReport's JSON Schema (draft 2020-12) for ``api_version``; raises ``KeyError``."""
    text = resources.files("reports").joinpath("schema", SCHEMA_FILES[api_version]).read_text()
    data: dict[str, Any] = json.loads(text)
    return data


def _cluster(record: RunRecord) -> dict[str, Any]:
    env = complete(record)
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
        "components": record.components,
    }


def report(record: RunRecord, implementation: Implementation | None = None) -> dict[str, Any]:
    """The ConformanceReport as plain data (``implementation`` overrides the record's)."""
    impl = implementation or record.implementation
    supported, unsupported = supported_features(record)
    digests = check_digests(record)
    profiles = []
    for p in profile_results(record):
        profiles.append(
            {
                "name": p.name,
                "result": p.result,
                "summary": p.summary(),
                "warnings": p.warnings,
                "coreNotJudged": p.core_not_judged,
                "statistics": {o: p.counts[o] for o in OUTCOMES},
                "statisticsByLevel": {
                    level: {o: counts[o] for o in OUTCOMES} for level, counts in p.by_level.items()
                },
                "checks": [
                    {
                        "name": r.key,
                        "id": r.id,
                        "level": r.level,
                        "outcome": r.outcome,
                        "core": r.core,
                        **({"reason": r.reason} if r.reason else {}),
                        **({"notJudged": r.not_judged()} if r.not_judged() else {}),
                        "evidence": digests[r.key],
                    }
                    for r in p.results
                ],
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
        "target": record.target_kind,
        "runId": record.run_id,
        "durationSeconds": round(record.finished - record.started, 1),
        "level": level_of(record).as_dict(),
        "suite": record.suite,
        "invocation": {**record.invocation, "interrupted": record.interrupted},
        "cluster": _cluster(record),
        "supportedFeatures": supported,
        "unsupportedFeatures": unsupported,
        "profiles": profiles,
        "evidence": file_digests(record),
    }
    scores = [_score(v) for v in validations(record)]
    if scores:
        # The first fidelity's at the top, the block's shape from before fidelities; all of them
        # under ``fidelities`` when there are several, so none is left out.
        data["suiteValidation"] = {**scores[0], **({"fidelities": scores} if len(scores) > 1 else {})}
    return data


def _score(suite: SuiteValidation) -> dict[str, Any]:
    return {
        "caught": suite.caught,
        "seeded": suite.seeded,
        "date": suite.date,
        "escaped": suite.escaped,
        **({"fidelity": suite.fidelity} if suite.fidelity else {}),
        **({"mode": suite.mode} if suite.mode else {}),
    }


def render_yaml(record: RunRecord, implementation: Implementation | None = None) -> str:
    impl = implementation or record.implementation
    head = ""
    if impl.missing():
        head = (
            "# Not yet a submission: give "
            + ", ".join(f"--{name}" for name in impl.missing())
            + " or --submitter FILE (gpuconf report render RUN_DIR --format yaml ...)\n"
        )
    body = yaml.safe_dump(report(record, impl), sort_keys=False, allow_unicode=True, width=110)
    return head + body


def write_yaml(record: RunRecord, path: Path, implementation: Implementation | None = None) -> Path:
    path.write_text(render_yaml(record, implementation))
    return path


def validate(data: dict[str, Any]) -> list[str]:
    """Schema errors of a ConformanceReport for its ``apiVersion``, one line each (empty: valid).
    Needs ``jsonschema``."""
    import jsonschema

    version = data.get("apiVersion") if isinstance(data, dict) else None
    if version not in SCHEMA_FILES:
        return [f"apiVersion: {version!r} is none of {', '.join(SCHEMA_FILES)}"]
    validator = jsonschema.Draft202012Validator(schema(str(version)))
    return [
        f"{'/'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}"
        for e in sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path))
    ]

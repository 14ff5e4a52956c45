"""``gpuconf report bundle``: a recorded run as a submission folder, redacted and deterministic.

The folder is named after the suite's minor version, the submitter and the product version
(``layout.submission_path``); bundling one run twice gives identical bytes, so that ``verify`` can
render every file again and compare.
"""

from __future__ import annotations

import hashlib
import json
import shlex
from pathlib import Path
from typing import Final

from conformance.certify.layout import (
    FILES,
    JUNIT,
    OPTIONAL_FILES,
    README,
    REPORT,
    REPRODUCE,
    RUN,
    SUMS,
    submission_path,
)
from reports import conformance as conformance_report
from reports.digests import ARCHIVE, member_name, write_archive
from reports.figures import resolve
from reports.junit import junit_bytes
from reports.levels import level_of
from reports.model import Implementation, RunRecord, load_run, record_from_dict
from reports.provenance import KUBECONFIG, redact_text
from reports.verdicts import profile_results

VENDOR_STEPS: Final = (
    "<!-- Complete: the steps that install the product under test, exactly as you ran them. -->"
)


class BundleError(Exception):
    """A run that cannot be bundled; the message says why and what to do."""


def _redacted_record(record: RunRecord, implementation: Implementation) -> RunRecord:
    """The record as it may be published: evidence paths relative, no kubeconfig, home path or
    private address left."""
    data = record.as_dict()
    for result in data["results"]:
        files = (result.get("evidence") or {}).get("files") or {}
        for name, path in list(files.items()):
            files[name] = member_name(str(path))
        for section in ("facts", "pods", "workloads"):
            value = (result.get("evidence") or {}).get(section)
            if isinstance(value, dict) and set(value) == {"file"}:
                value["file"] = member_name(str(value["file"]))
    if "kubeconfig" in data["target"]:
        data["target"]["kubeconfig"] = KUBECONFIG
    data = json.loads(redact_text(json.dumps(data)))
    out = record_from_dict(data)
    out.implementation = implementation
    return out


def _evidence_members(record: RunRecord) -> dict[str, bytes]:
    members: dict[str, bytes] = {}
    for result in record.results:
        for path in (result.evidence.get("files") or {}).values():
            found = resolve(record, str(path))
            if found is None:
                continue
            content = found.read_bytes()
            try:
                content = redact_text(content.decode()).encode()
            except UnicodeDecodeError:
                pass  # a binary file is kept as it is; verify looks into text only
            members[member_name(str(path))] = content
    return members


def render_readme(record: RunRecord) -> str:
    """The submission's README: what it is, the level, and a Reproduce section the vendor completes."""
    impl, suite, comps = record.implementation, record.suite, record.components
    level = level_of(record)
    command = shlex.join(record.invocation.get("command") or ["gpuconf", "run"])
    lines = [
        f"# {impl.organization} {impl.project} {impl.version}: gpuconf conformance",
        "",
        f"Type: {impl.type or 'unknown'}; home page {impl.url}; source {impl.repository or 'unknown'}; "
        f"documentation {impl.documentation or 'unknown'}; contact {', '.join(impl.contact) or 'unknown'}.",
        "",
        f"{level.line()}",
        "",
        "| profile | result | checks |",
        "|---|---|---|",
    ]
    for p in profile_results(record):
        lines.append(f"| {p.name} | {p.result} | {p.summary().split(': ', 1)[1]} |")
    lines += [
        "",
        f"Files: `{REPORT}` (the ConformanceReport), `{RUN}` (the run, redacted), `{JUNIT}`, `{ARCHIVE}` "
        f"(the evidence), `{SUMS}`. Check them with `gpuconf report verify .`.",
        "",
        REPRODUCE,
        "",
        "What the run recorded:",
        "",
        f"- gpuconf {suite.get('version', record.gpuconf_version)}, commit {suite.get('commit') or 'unknown'}"
        f" ({'modified' if suite.get('modified') else 'unmodified'}), {suite.get('digestOf') or 'digest'} "
        f"{suite.get('digest') or 'unknown'}",
        f"- target: {record.target_kind}; Kubernetes {comps.get('kubernetesVersion') or 'unknown'}",
    ]
    for label, key in (
        ("scheduler", "scheduler"),
        ("node agent", "nodeAgent"),
        ("workload image", "workloadImage"),
    ):
        comp = comps.get(key) or {}
        name = comp.get("name") or comp.get("image") or "unknown"
        digest = comp.get("digest") or comp.get("note") or "no digest"
        lines.append(f"- {label}: {name} ({digest})")
    for node in comps.get("nodes") or []:
        lines.append(
            f"- node {node.get('name')}: {node.get('gpus')} x {node.get('gpuProduct') or 'GPU'}"
            f"{' (simulated)' if node.get('simulated') else ''}, "
            f"kubelet {node.get('kubeletVersion') or '?'}, "
            f"runtime {node.get('containerRuntimeVersion') or '?'}, "
            f"driver {node.get('driverVersion') or '?'}, CUDA {node.get('cudaVersion') or '?'}"
        )
    lines += [
        "",
        "Install the product under test:",
        "",
        VENDOR_STEPS,
        "",
        f"Then run the suite (`pip install gpuconf=={suite.get('version', record.gpuconf_version)}`):",
        "",
        "```sh",
        command,
        "```",
        "",
    ]
    return "\n".join(lines)


def sums_text(folder: Path, names: list[str]) -> str:
    return "".join(f"{hashlib.sha256((folder / n).read_bytes()).hexdigest()}  {n}\n" for n in sorted(names))


def bundle(
    run_dir: Path, out: Path, implementation: Implementation | None = None, readme: Path | None = None
) -> Path:
    """Write the submission folder for the run at ``run_dir`` under ``out``; returns the folder.
    Raises ``BundleError`` (an interrupted run, no submitter) or ``OSError``/``ValueError``."""
    record = load_run(run_dir)
    if record.interrupted:
        raise BundleError(
            f"{run_dir}: the run was interrupted, so some checks never ran to their verdict; run the suite "
            "to its end and bundle that run"
        )
    impl = implementation or record.implementation
    missing = [n for n in ("organization", "project", "version") if not getattr(impl, n)]
    if missing:
        raise BundleError(
            "the submission folder is named after the organization, project and version, and "
            f"{', '.join(missing)} is not known: give --submitter FILE"
        )
    published = _redacted_record(record, impl)
    folder = out / submission_path(published)
    folder.mkdir(parents=True, exist_ok=True)
    for stale in (*FILES, SUMS, *OPTIONAL_FILES):
        (folder / stale).unlink(missing_ok=True)
    write_archive(_evidence_members(record), folder / ARCHIVE)
    (folder / RUN).write_text(json.dumps(published.as_dict(), indent=2, default=str) + "\n")
    published = load_run(folder)
    (folder / JUNIT).write_bytes(junit_bytes(published))
    (folder / REPORT).write_text(conformance_report.render_yaml(published))
    (folder / README).write_text(readme.read_text() if readme else render_readme(published))
    (folder / SUMS).write_text(sums_text(folder, list(FILES)))
    return folder

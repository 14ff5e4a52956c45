"""``gpuconf report verify``: every requirement of a submission, PASS or FAIL, with how to fix it.

Completeness is judged against the catalog of the claimed suite version (``conformance/catalog.yaml``),
which is why certification lives in ``conformance`` and not in ``reports``. Each requirement is one
method of the checker, in ``REQUIREMENTS``' order, returning findings that name the file, the field,
what was expected, what was found and the fix; docs/certification.md says why each one exists.
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
import shutil
import subprocess
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

from conformance.catalog import CATALOG_PATH, PACKAGE_DIR
from conformance.certify.attestation import PREDICATE_TYPE, statement
from conformance.certify.layout import (
    FILES,
    JUNIT,
    OPTIONAL_FILES,
    PREDICATE,
    README,
    REPORT,
    REPRODUCE,
    RUN,
    SIGNED,
    STATEMENT,
    SUMS,
    claimed_profiles,
    find_submission,
    minor_of,
    submission_path,
)
from reports import conformance as conformance_report
from reports import submitter as submitter_module
from reports.digests import ARCHIVE, check_digests, file_digests, member_name, read_archive
from reports.junit import junit_bytes
from reports.levels import CONFORMANT, FEATURE_SKIP, SANDBOX_VERIFIED, level_of, narrowing, reference_parties
from reports.model import SCHEMA, RunRecord, gpuconf_version, load_run
from reports.provenance import file_digest, leaks
from reports.validation import validations
from reports.verdicts import profile_results

MAX_TIMEOUT_SCALE: Final = 3.0
ACCEPTED_MINORS: Final = 2
"""A submission is valid for the two latest gpuconf minor versions (the verifier's and the one before)."""
MOVING_VERSIONS: Final = ("main", "master", "latest", "head", "dev", "develop", "trunk", "nightly", "edge")
RELEASE: Final = re.compile(r"v?[0-9]+\.[0-9]+(\.[0-9]+)?([-+][0-9A-Za-z.-]+)?")
COMMIT: Final = re.compile(r"[0-9a-f]{7,40}")
KNOWN_RELEASES: Final[dict[str, dict[str, str]]] = {}
"""Earlier releases' catalog and mutation score digests (version: {catalogDigest, mutationScoreDigest}),
so that a bundle of the previous minor version is checked against its own catalog digest."""


@dataclass
class SuiteFacts:
    """What the verifier knows of the suite: its version, the catalog and mutation score it ships."""

    version: str
    catalog: dict[str, Any]
    catalog_digest: str
    score_digest: str
    known: dict[str, dict[str, str]] = field(default_factory=dict)

    @classmethod
    def installed(cls) -> SuiteFacts:
        return cls(
            version=gpuconf_version(),
            catalog=yaml.safe_load(CATALOG_PATH.read_text()),
            catalog_digest=file_digest(CATALOG_PATH),
            score_digest=file_digest(PACKAGE_DIR / "mutation-score.json"),
            known=dict(KNOWN_RELEASES),
        )


def accepted_minors(version: str) -> list[str]:
    """The gpuconf minor versions a bundle may come from when verified with ``version``."""
    minor = minor_of(version)
    if minor is None:
        return []
    major, low = minor
    return [f"{major}.{n}" for n in range(low, max(-1, low - ACCEPTED_MINORS), -1)]


@dataclass
class Finding:
    file: str
    field: str
    expected: str
    found: str
    fix: str

    def as_dict(self) -> dict[str, str]:
        return {
            "file": self.file,
            "field": self.field,
            "expected": self.expected,
            "found": self.found,
            "fix": self.fix,
        }


@dataclass
class Requirement:
    id: str
    title: str
    findings: list[Finding] = field(default_factory=list)
    note: str = ""

    @property
    def passed(self) -> bool:
        return not self.findings

    def lines(self) -> list[str]:
        head = f"{'PASS' if self.passed else 'FAIL'}  {self.id:<18} {self.title}"
        out = [head + (f" ({self.note})" if self.note and self.passed else "")]
        for f in self.findings[:10]:
            out += [
                f"      file: {f.file}   field: {f.field}",
                f"      expected: {f.expected}",
                f"      found: {f.found}",
                f"      fix: {f.fix}",
            ]
        if len(self.findings) > 10:
            out.append(f"      ... and {len(self.findings) - 10} more")
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "title": self.title,
            "passed": self.passed,
            "note": self.note,
            "findings": [f.as_dict() for f in self.findings],
        }


@dataclass
class Verification:
    folder: Path
    requirements: list[Requirement]

    @property
    def passed(self) -> int:
        return sum(r.passed for r in self.requirements)

    @property
    def submittable(self) -> bool:
        return self.passed == len(self.requirements)

    def failed(self) -> list[str]:
        return [r.id for r in self.requirements if not r.passed]

    def lines(self) -> list[str]:
        out = [f"gpuconf report verify {self.folder}"]
        for r in self.requirements:
            out += r.lines()
        verdict = "submittable" if self.submittable else "not submittable"
        out.append(f"{self.passed} of {len(self.requirements)} requirements passed: {verdict}")
        return out

    def as_dict(self) -> dict[str, Any]:
        return {
            "apiVersion": SCHEMA,
            "kind": "SubmissionVerification",
            "submission": str(self.folder),
            "submittable": self.submittable,
            "passed": self.passed,
            "total": len(self.requirements),
            "requirements": [r.as_dict() for r in self.requirements],
        }


REQUIREMENTS: Final = (
    ("layout", "the submission's files and folder names"),
    ("checksums", "SHA256SUMS matches every file"),
    ("schema", "report.yaml is valid for its apiVersion (v1alpha2)"),
    ("render", "report.yaml is byte-identical to a fresh render of run.json"),
    ("junit", "junit.xml is byte-identical to a fresh render of run.json"),
    ("evidence", "every check's evidence digest matches the evidence archive"),
    ("implementation", "who submits which product version: every field, a release or commit version"),
    ("suite-version", "the suite version is in the accepted window"),
    ("suite-unmodified", "the suite ran from a known commit with an unmodified tree"),
    ("catalog", "the suite's catalog digest is that release's"),
    ("completeness", "every check of each claimed profile and request form is present"),
    ("no-narrowing", "no filter narrowed the run (--check, -k, --deselect, -m, node ids, -x)"),
    ("not-interrupted", "the run was not interrupted"),
    ("preflight", "preflight ran (no --skip-preflight)"),
    ("timeout-scale", f"the timeout scale is at most {MAX_TIMEOUT_SCALE:g}"),
    ("verdict", "the verdict recomputed from run.json equals report.yaml's"),
    ("conformant", "every MUST check of the claim passed"),
    ("claims", "node and stack claims come from a cluster with real GPUs; a sandbox claims scheduler only"),
    ("not-reference", "the party under test is not one of gpuconf's reference components"),
    ("readme", "README.md has a Reproduce section whose command is the recorded invocation"),
    ("redaction", "no home path, kubeconfig path or private address in any file"),
    ("mutation-score", "the suite version's mutation score is present with nothing escaped"),
)


class _Checker:
    def __init__(self, folder: Path, root: Path, suite: SuiteFacts, require_signature: bool) -> None:
        self.folder, self.root, self.suite, self.require_signature = folder, root, suite, require_signature
        self.record: RunRecord | None = None
        self.yaml_text = ""
        self.yaml_data: dict[str, Any] = {}
        self.archive: dict[str, bytes] | None = None
        self.load_problems: dict[str, str] = {}
        self._load()

    def _load(self) -> None:
        try:
            self.record = load_run(self.folder / RUN)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            self.load_problems[RUN] = str(exc)
        try:
            self.yaml_text = (self.folder / REPORT).read_text()
            data = yaml.safe_load(self.yaml_text)
            self.yaml_data = data if isinstance(data, dict) else {}
        except (OSError, yaml.YAMLError) as exc:
            self.load_problems[REPORT] = str(exc)
        try:
            self.archive = read_archive(self.folder / ARCHIVE)
        except (OSError, tarfile.TarError, EOFError) as exc:
            self.load_problems[ARCHIVE] = str(exc)

    def unreadable(self, *names: str) -> list[Finding]:
        return [
            Finding(
                n,
                "(file)",
                "a readable file",
                self.load_problems[n],
                "bundle again: gpuconf report bundle RUN_DIR --out DIR",
            )
            for n in names
            if n in self.load_problems
        ]

    # ---- the requirements, in REQUIREMENTS' order -------------------------------------------

    def layout(self) -> list[Finding]:
        out = []
        present = {p.name for p in self.folder.iterdir() if p.is_file()}
        folders = sorted(p.name for p in self.folder.iterdir() if p.is_dir())
        for name in (*FILES, SUMS):
            if name not in present:
                out.append(
                    Finding(name, "(file)", "present", "missing", "bundle again with gpuconf report bundle")
                )
        for name in sorted(present - {*FILES, SUMS, *OPTIONAL_FILES}) + folders:
            out.append(Finding(name, "(file)", "not in a submission", "present", f"remove {name}"))
        if self.record is not None:
            wanted = submission_path(self.record)
            try:
                got = self.folder.resolve().relative_to(self.root.resolve())
            except ValueError:
                got = Path(self.folder.name)
            got_parts = self.folder.resolve().parts[-3:] if got == Path(".") else got.parts
            if tuple(got_parts) != wanted.parts:
                out.append(
                    Finding(
                        str(self.folder),
                        "(folder)",
                        str(wanted),
                        "/".join(got_parts),
                        f"move the files to {wanted}/ (gpuconf report bundle names it)",
                    )
                )
        return out

    def checksums(self) -> list[Finding]:
        try:
            text = (self.folder / SUMS).read_text()
        except OSError as exc:
            return [Finding(SUMS, "(file)", "present", str(exc), "bundle again")]
        listed: dict[str, str] = {}
        out = []
        for line in text.splitlines():
            parts = line.split(None, 1)
            if len(parts) != 2:
                out.append(Finding(SUMS, "(line)", "<sha256>  <file>", line, "bundle again"))
                continue
            listed[parts[1].lstrip("*")] = parts[0]
        for name in FILES:
            path = self.folder / name
            if name not in listed:
                out.append(Finding(SUMS, name, "listed", "not listed", "bundle again"))
                continue
            found = hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "missing"
            if found != listed[name]:
                out.append(
                    Finding(
                        name,
                        "sha256",
                        listed[name],
                        found,
                        f"{name} changed after bundling: bundle the run again (never edit a bundled file)",
                    )
                )
        for name in sorted(set(listed) - set(FILES)):
            out.append(Finding(SUMS, name, "only the submission's files", "listed", "bundle again"))
        return out

    def schema(self) -> list[Finding]:
        if REPORT in self.load_problems:
            return self.unreadable(REPORT)
        version = self.yaml_data.get("apiVersion")
        if version != SCHEMA:
            return [
                Finding(
                    REPORT, "apiVersion", SCHEMA, str(version), "run and bundle with this gpuconf release"
                )
            ]
        return [
            Finding(REPORT, e.split(":", 1)[0], "valid for the schema", e.split(": ", 1)[-1], "bundle again")
            for e in conformance_report.validate(self.yaml_data)
        ]

    def render(self) -> list[Finding]:
        if self.record is None:
            return self.unreadable(RUN)
        fresh = conformance_report.render_yaml(self.record)
        if fresh == self.yaml_text:
            return []
        return [
            Finding(
                REPORT,
                _first_difference(self.yaml_text, fresh),
                "as rendered from run.json",
                "differs",
                "never edit report.yaml: bundle the run again",
            )
        ]

    def junit(self) -> list[Finding]:
        if self.record is None:
            return self.unreadable(RUN)
        fresh = junit_bytes(self.record).decode()
        try:
            found = (self.folder / JUNIT).read_text()
        except OSError as exc:
            return [Finding(JUNIT, "(file)", "present", str(exc), "bundle again")]
        if found == fresh:
            return []
        return [
            Finding(
                JUNIT, _first_difference(found, fresh), "as rendered from run.json", "differs", "bundle again"
            )
        ]

    def evidence(self) -> list[Finding]:
        if self.record is None or self.archive is None:
            return self.unreadable(RUN, ARCHIVE)
        out = []
        recorded = {
            c.get("name"): c.get("evidence")
            for p in self.yaml_data.get("profiles") or []
            for c in p.get("checks") or []
            if isinstance(c, dict)
        }
        for key, digest in check_digests(self.record, self.archive).items():
            if recorded.get(key) != digest:
                out.append(
                    Finding(
                        f"{ARCHIVE} (evidence of {key})",
                        f"profiles[].checks[{key}].evidence",
                        str(recorded.get(key)),
                        digest,
                        "an evidence file or the check's result changed after the run: bundle the run again",
                    )
                )
            for path in (
                next(r for r in self.record.results if r.key == key).evidence.get("files") or {}
            ).values():
                if member_name(str(path)) not in self.archive:
                    out.append(Finding(ARCHIVE, member_name(str(path)), "present", "missing", "bundle again"))
        files = file_digests(self.record)
        for name, key in ((RUN, "runJson"), (JUNIT, "junitXml"), (ARCHIVE, "archive")):
            given = (self.yaml_data.get("evidence") or {}).get(key)
            if given != files[key]:
                out.append(Finding(name, f"evidence.{key}", str(given), files[key], "bundle again"))
        return out

    def implementation(self) -> list[Finding]:
        if self.record is None:
            return self.unreadable(RUN)
        impl = self.record.implementation
        data = {k: v for k, v in impl.__dict__.items()}
        fix = "complete the submitter file (gpuconf report bundle --submitter FILE)"
        out = [
            Finding(
                RUN,
                f"implementation.{e.split(':', 1)[0]}",
                "as the submitter schema says",
                e.split(": ", 1)[-1],
                fix,
            )
            for e in submitter_module.problems(data)
        ]
        version = impl.version.strip()
        if version and (
            version.lower() in MOVING_VERSIONS
            or not (RELEASE.fullmatch(version) or COMMIT.fullmatch(version))
        ):
            out.append(
                Finding(
                    RUN,
                    "implementation.version",
                    "a release (v1.2.3) or a commit (hex)",
                    version,
                    "test a released version or a commit, never a branch or a moving tag",
                )
            )
        return out

    def suite_version(self) -> list[Finding]:
        if self.record is None:
            return self.unreadable(RUN)
        version = str(self.record.suite.get("version") or self.record.gpuconf_version)
        minor = minor_of(version)
        window = accepted_minors(self.suite.version)
        if minor is None or f"{minor[0]}.{minor[1]}" not in window or version.startswith("0+"):
            return [
                Finding(
                    RUN,
                    "suite.version",
                    f"a gpuconf release of {' or '.join(window) or '?'}",
                    version,
                    f"run the suite of a current release (verifier: gpuconf {self.suite.version})",
                )
            ]
        return []

    def suite_unmodified(self) -> list[Finding]:
        if self.record is None:
            return self.unreadable(RUN)
        suite, out = self.record.suite, []
        if not suite.get("commit"):
            out.append(
                Finding(
                    RUN,
                    "suite.commit",
                    "the suite's source commit",
                    "unknown",
                    "run from a release or a git checkout",
                )
            )
        if suite.get("modified") is not False:
            out.append(
                Finding(
                    RUN,
                    "suite.modified",
                    "false",
                    json.dumps(suite.get("modified")),
                    "run the suite from an unmodified tree (git status clean) or a release",
                )
            )
        return out

    def catalog(self) -> list[Finding]:
        if self.record is None:
            return self.unreadable(RUN)
        version = str(self.record.suite.get("version") or "")
        given = str(self.record.suite.get("catalogDigest") or "")
        if version == self.suite.version:
            wanted = self.suite.catalog_digest
        elif version in self.suite.known:
            wanted = self.suite.known[version].get("catalogDigest", "")
        else:
            return [
                Finding(
                    RUN,
                    "suite.catalogDigest",
                    f"gpuconf {version}'s",
                    given,
                    f"verify with gpuconf {version}",
                )
            ]
        if given != wanted:
            return [
                Finding(RUN, "suite.catalogDigest", wanted, given or "none", "run with an unmodified release")
            ]
        return []

    def completeness(self) -> list[Finding]:
        if self.record is None:
            return self.unreadable(RUN)
        record = self.record
        supported = set(record.options.get("supportedFeatures") or [])
        forms = [f["name"] for f in self.suite.catalog.get("features") or [] if f["name"] in FORMS]
        got = {r.key: r for r in record.results}
        out = []
        for profile in claimed_profiles(record):
            for check in self.suite.catalog.get("checks") or []:
                if profile not in check.get("profiles", []):
                    continue
                keys = (
                    [f"{profile}/{check['id']}[{f}]" for f in forms]
                    if check.get("eachRequestForm")
                    else [f"{profile}/{check['id']}"]
                )
                for key in keys:
                    result = got.get(key)
                    if result is None:
                        out.append(
                            Finding(
                                RUN, f"results[{key}]", "present", "missing", "run every check of the profile"
                            )
                        )
                    elif result.outcome == "skipped":
                        claimed = [f for f in result.features if f in supported] if result.features else []
                        feature_skip = result.reason.startswith(FEATURE_SKIP)
                        if not feature_skip or (result.features and len(claimed) == len(result.features)):
                            out.append(
                                Finding(
                                    RUN,
                                    f"results[{key}].outcome",
                                    "run (a skip only for a feature the implementation does not claim)",
                                    f"skipped: {result.reason}",
                                    "make the check runnable, or do not claim the feature",
                                )
                            )
        return out

    def no_narrowing(self) -> list[Finding]:
        if self.record is None:
            return self.unreadable(RUN)
        if not self.record.invocation:
            return [Finding(RUN, "invocation", "recorded", "absent", "run with this gpuconf release")]
        return [
            Finding(
                RUN,
                "invocation.filters",
                "none",
                n,
                "run the whole suite of the claimed profiles, unfiltered",
            )
            for n in narrowing(self.record)
        ]

    def not_interrupted(self) -> list[Finding]:
        if self.record is None:
            return self.unreadable(RUN)
        if self.record.interrupted:
            return [Finding(RUN, "interrupted", "false", "true", "run the suite to its end")]
        return []

    def preflight(self) -> list[Finding]:
        if self.record is None:
            return self.unreadable(RUN)
        skipped = self.record.invocation.get("skipPreflight") or self.record.preflight.get("skipped")
        if skipped:
            return [Finding(RUN, "invocation.skipPreflight", "false", "true", "run without --skip-preflight")]
        return []

    def timeout_scale(self) -> list[Finding]:
        if self.record is None:
            return self.unreadable(RUN)
        scale = float(
            self.record.invocation.get("timeoutScale") or self.record.options.get("timeoutScale") or 1.0
        )
        if scale > MAX_TIMEOUT_SCALE:
            return [
                Finding(
                    RUN,
                    "invocation.timeoutScale",
                    f"<= {MAX_TIMEOUT_SCALE:g}",
                    f"{scale:g}",
                    "run on a cluster that keeps the suite's timeouts",
                )
            ]
        return []

    def verdict(self) -> list[Finding]:
        if self.record is None:
            return self.unreadable(RUN)
        out = []
        given = {
            p.get("name"): p.get("result")
            for p in self.yaml_data.get("profiles") or []
            if isinstance(p, dict)
        }
        for p in profile_results(self.record):
            if given.get(p.name) != p.result:
                out.append(
                    Finding(
                        REPORT, f"profiles[{p.name}].result", p.result, str(given.get(p.name)), "bundle again"
                    )
                )
        level = level_of(self.record).as_dict()
        if self.yaml_data.get("level") != level:
            out.append(
                Finding(
                    REPORT,
                    "level",
                    json.dumps(level),
                    json.dumps(self.yaml_data.get("level")),
                    "bundle again",
                )
            )
        return out

    def conformant(self) -> list[Finding]:
        if self.record is None:
            return self.unreadable(RUN)
        level = level_of(self.record)
        if level.name == CONFORMANT:
            return []
        failed = [r.key for r in self.record.results if r.level == "MUST" and r.outcome == "failed"]
        return [
            Finding(
                RUN,
                "results",
                "every MUST check of the claim passed",
                f"{level.name}: " + ", ".join(failed or level.not_judged),
                "fix the implementation (or the run) and run again",
            )
        ]

    def claims(self) -> tuple[list[Finding], str]:
        if self.record is None:
            return self.unreadable(RUN), ""
        record = self.record
        nodes = record.components.get("nodes") or []
        simulated = (
            record.environment.simulated is True
            or bool(record.preflight.get("simulatedGpus"))
            or any(n.get("simulated") for n in nodes)
        )
        out = []
        for profile in claimed_profiles(record):
            if profile not in ("node", "stack"):
                continue
            if record.target_kind != "cluster" or simulated:
                out.append(
                    Finding(
                        RUN,
                        "invocation.profiles",
                        "node and stack only from a cluster with real GPUs",
                        f"{profile} claimed from {record.target_kind}"
                        + (" on simulated GPUs" if simulated else ""),
                        "claim the scheduler profile only (sandbox-verified), or run node and stack on "
                        "real GPUs",
                    )
                )
        note = SANDBOX_VERIFIED if record.target_kind == "sandbox" and not out else ""
        return out, note

    def not_reference(self) -> list[Finding]:
        if self.record is None:
            return self.unreadable(RUN)
        return [
            Finding(
                RUN,
                f"components.{'scheduler' if party == 'scheduler' else 'nodeAgent'}.reference",
                "false",
                f"true: gpuconf's reference {party} was the party under test",
                "a run of gpuconf's own components is a demo, never a certification: judge your product",
            )
            for party in reference_parties(self.record)
        ]

    def readme(self) -> list[Finding]:
        try:
            text = (self.folder / README).read_text()
        except OSError as exc:
            return [Finding(README, "(file)", "present", str(exc), "bundle again")]
        if self.record is None:
            return self.unreadable(RUN)
        section = _section(text, REPRODUCE)
        if section is None:
            return [
                Finding(
                    README, REPRODUCE, "a Reproduce section", "none", "keep the generated Reproduce section"
                )
            ]
        wanted = shlex.join(self.record.invocation.get("command") or [])
        commands = [line.strip() for line in _code_lines(section) if line.strip()]
        if wanted not in commands:
            return [
                Finding(
                    README,
                    f"{REPRODUCE} command",
                    wanted,
                    " | ".join(commands) or "no command",
                    "the Reproduce command must be the one the run recorded",
                )
            ]
        return []

    def redaction(self) -> list[Finding]:
        out = []
        texts: list[tuple[str, bytes]] = [
            (p.name, p.read_bytes())
            for p in sorted(self.folder.iterdir())
            if p.is_file() and p.name != ARCHIVE
        ]
        texts += [(f"{ARCHIVE}:{name}", content) for name, content in sorted((self.archive or {}).items())]
        for name, content in texts:
            try:
                text = content.decode()
            except UnicodeDecodeError:
                continue
            for kind, what in leaks(text)[:5]:
                out.append(
                    Finding(
                        name, kind, "none", what, "bundle again (it redacts), or remove it by hand and re-run"
                    )
                )
        return out

    def mutation_score(self) -> list[Finding]:
        if self.record is None:
            return self.unreadable(RUN)
        scores = validations(self.record)
        if not scores:
            return [
                Finding(
                    RUN,
                    "suiteValidation",
                    "the suite version's mutation score",
                    "none",
                    "run with a release that ships one",
                )
            ]
        out = []
        # Every fidelity the suite was scored in: a fault that escapes on simulated H200s only is
        # still one the suite misses.
        for score in scores:
            if score.escaped or score.caught != score.seeded:
                where = f" ({score.fidelity} fidelity)" if score.fidelity else ""
                out.append(
                    Finding(
                        RUN,
                        "suiteValidation",
                        "every seeded fault caught",
                        f"{score.caught} of {score.seeded}{where}; escaped: {', '.join(score.escaped)}",
                        "use a release whose suite catches every seeded fault",
                    )
                )
        version = str(self.record.suite.get("version") or "")
        wanted = (
            self.suite.score_digest
            if version == self.suite.version
            else self.suite.known.get(version, {}).get("mutationScoreDigest", "")
        )
        given = str(self.record.suite.get("mutationScoreDigest") or "")
        if wanted and given != wanted:
            out.append(
                Finding(
                    RUN,
                    "suite.mutationScoreDigest",
                    wanted,
                    given or "none",
                    "run with an unmodified release",
                )
            )
        return out

    def signature(self) -> list[Finding]:
        return _check_signature(self.folder)

    def run(self) -> list[Requirement]:
        checks: dict[str, Callable[[], Any]] = {
            "layout": self.layout,
            "checksums": self.checksums,
            "schema": self.schema,
            "render": self.render,
            "junit": self.junit,
            "evidence": self.evidence,
            "implementation": self.implementation,
            "suite-version": self.suite_version,
            "suite-unmodified": self.suite_unmodified,
            "catalog": self.catalog,
            "completeness": self.completeness,
            "no-narrowing": self.no_narrowing,
            "not-interrupted": self.not_interrupted,
            "preflight": self.preflight,
            "timeout-scale": self.timeout_scale,
            "verdict": self.verdict,
            "conformant": self.conformant,
            "claims": self.claims,
            "not-reference": self.not_reference,
            "readme": self.readme,
            "redaction": self.redaction,
            "mutation-score": self.mutation_score,
        }
        out = []
        for rid, title in REQUIREMENTS:
            found = checks[rid]()
            findings, note = found if isinstance(found, tuple) else (found, "")
            out.append(Requirement(rid, title, findings, note))
        if (self.folder / STATEMENT).is_file():
            out.append(
                Requirement(
                    "attestation", "the in-toto Statement covers SHA256SUMS", _check_statement(self.folder)
                )
            )
        if self.require_signature:
            out.append(
                Requirement(
                    "signature", "the attestation is signed and the signature verifies", self.signature()
                )
            )
        return out


FORMS: Final = ("gpu-memory", "gpu-fraction", "nvidia")


def _first_difference(found: str, wanted: str) -> str:
    for number, (a, b) in enumerate(zip(found.splitlines(), wanted.splitlines(), strict=False), start=1):
        if a != b:
            return f"line {number}: {a.strip()[:100]!r} (fresh: {b.strip()[:100]!r})"
    return f"length {len(found)} (fresh: {len(wanted)})"


def _section(text: str, heading: str) -> str | None:
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.strip() == heading:
            rest = []
            for follow in lines[i + 1 :]:
                if follow.startswith("## ") or follow.startswith("# "):
                    break
                rest.append(follow)
            return "\n".join(rest)
    return None


def _code_lines(text: str) -> list[str]:
    out, inside = [], False
    for line in text.splitlines():
        if line.strip().startswith("```"):
            inside = not inside
            continue
        if inside:
            out.append(line)
    return out


def verify(directory: Path, suite: SuiteFacts | None = None, require_signature: bool = False) -> Verification:
    """Every requirement of a submission at ``directory``; raises ``FileNotFoundError`` when there is none."""
    folder = find_submission(directory)
    if folder is None:
        raise FileNotFoundError(
            f"{directory}: no submission here (a folder with {REPORT}, or one <minor>/<org>-<project>/"
            f"<profiles>-<version>/ below it)"
        )
    checker = _Checker(folder, directory, suite or SuiteFacts.installed(), require_signature)
    return Verification(folder, checker.run())


def _check_statement(folder: Path) -> list[Finding]:
    try:
        given = json.loads((folder / STATEMENT).read_text())
        wanted = statement(folder)
    except (OSError, ValueError, KeyError) as exc:
        return [Finding(STATEMENT, "(file)", "a readable Statement", str(exc), "gpuconf report attest DIR")]
    if given.get("subject") != wanted["subject"]:
        return [
            Finding(
                STATEMENT,
                "subject",
                json.dumps(wanted["subject"]),
                json.dumps(given.get("subject")),
                "attest again after bundling",
            )
        ]
    if given.get("predicate") != wanted["predicate"]:
        return [
            Finding(
                STATEMENT,
                "predicate",
                "as computed from the submission",
                "differs",
                "attest again after bundling",
            )
        ]
    return []


def _check_signature(folder: Path) -> list[Finding]:
    fix_sign = (
        f"sign it: cosign attest-blob --predicate {PREDICATE} --type {PREDICATE_TYPE} "
        f"--bundle {SIGNED} {SUMS}"
    )
    if not (folder / SIGNED).is_file():
        return [Finding(SIGNED, "(file)", "present", "missing", fix_sign)]
    cosign = shutil.which("cosign")
    if cosign is None:
        return [
            Finding(
                SIGNED,
                "(verifier)",
                "cosign on PATH",
                "not installed",
                "install cosign (the Sigstore project's release binaries or your package manager), "
                "or verify without --require-signature",
            )
        ]
    done = subprocess.run(
        [
            cosign,
            "verify-blob-attestation",
            "--bundle",
            str(folder / SIGNED),
            "--type",
            PREDICATE_TYPE,
            "--certificate-identity-regexp",
            ".*",
            "--certificate-oidc-issuer-regexp",
            ".*",
            str(folder / SUMS),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        return [
            Finding(SIGNED, "(signature)", "verifies", (done.stderr or done.stdout).strip()[:300], fix_sign)
        ]
    return []

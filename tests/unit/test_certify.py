"""Certification: a recorded sandbox run bundled and verified, and every tampering refused with its finding.

The run is ``tests/data/runs/sandbox-scheduler`` (a real ``gpuconf run --profile scheduler`` of
the embedded sandbox, see that folder's README). As recorded it judged gpuconf's reference
scheduler; ``vendor_run`` makes it the run of a vendor's scheduler in the sandbox (the components
and the command line a ``--scheduler-command`` run records), with the suite facts of the installed
gpuconf, so that a good bundle verifies and each test breaks exactly one thing. A "forged" bundle is
one whose run.json was edited and everything derived from it rendered again, as a careful forger
would: only the requirement that looks at the edited fact can refuse it.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from conformance import certify
from conformance.catalog import CATALOG_PATH, PACKAGE_DIR
from conformance.cli import main
from reports import conformance as conformance_report
from reports.digests import ARCHIVE, read_archive, write_archive
from reports.junit import junit_bytes
from reports.model import Implementation, gpuconf_version, load_run
from reports.provenance import file_digest

RUNS = Path(__file__).resolve().parents[1] / "data" / "runs"
RECORDED = RUNS / "sandbox-scheduler"
SUBMITTER = Implementation(
    organization="Example Inc",
    project="acme-gpu-scheduler",
    url="https://example.com/acme",
    version="v2.1.0",
    contact=["gpu-team@example.com"],
    type="scheduler",
    repository="https://example.com/src/acme",
    documentation="https://example.com/docs/acme",
)
VENDOR_COMMAND = [
    "gpuconf",
    "run",
    "--profile",
    "scheduler",
    "--scheduler",
    "none",
    "--scheduler-command",
    "acme-scheduler --kubeconfig {kubeconfig}",
    "--scheduler-name",
    "acme-gpu",
    "--output-dir",
    "cert-run",
]


def _edit_run(path: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data, indent=2) + "\n")


def _as_vendor(data: dict[str, Any]) -> None:
    data["suite"].update(
        version=gpuconf_version(),
        commit="0" * 40,
        modified=False,
        catalogDigest=file_digest(CATALOG_PATH),
        mutationScoreDigest=file_digest(PACKAGE_DIR / "mutation-score.json"),
    )
    data["suiteValidation"] = json.loads((PACKAGE_DIR / "mutation-score.json").read_text())
    data["options"]["schedulerName"] = "acme-gpu"
    data["invocation"]["command"] = list(VENDOR_COMMAND)
    data["components"]["scheduler"] = {
        "name": "acme-gpu",
        "reference": False,
        "version": "",
        "digest": "",
        "note": "a process of the embedded sandbox (a vendor's command)",
    }


def vendor_run(tmp: Path, edit: Callable[[dict[str, Any]], None] | None = None) -> Path:
    run = tmp / "run"
    shutil.copytree(RECORDED, run)
    _edit_run(run / "run.json", _as_vendor)
    if edit is not None:
        _edit_run(run / "run.json", edit)
    return run


def bundled(tmp: Path, edit: Callable[[dict[str, Any]], None] | None = None) -> Path:
    return certify.bundle(vendor_run(tmp, edit), tmp / "out", SUBMITTER)


def failed(folder: Path, suite: certify.SuiteFacts | None = None) -> list[str]:
    return certify.verify(folder, suite).failed()


def finding(folder: Path, rid: str) -> certify.Finding:
    (req,) = [r for r in certify.verify(folder).requirements if r.id == rid]
    assert req.findings, rid
    return req.findings[0]


def _resum(folder: Path) -> None:
    (folder / certify.SUMS).write_text(certify.sums_text(folder, list(certify.FILES)))


def forge(folder: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    """Edit the bundled run.json and render everything that derives from it again."""
    _edit_run(folder / certify.RUN, edit)
    record = load_run(folder)
    (folder / certify.JUNIT).write_bytes(junit_bytes(record))
    (folder / certify.REPORT).write_text(conformance_report.render_yaml(record))
    (folder / certify.README).write_text(certify.render_readme(record))
    _resum(folder)


# ----------------------------------------------------------------------------- good bundles


def test_a_vendor_scheduler_in_the_sandbox_is_submittable_as_sandbox_verified(tmp_path: Path) -> None:
    folder = bundled(tmp_path)
    assert folder.relative_to(tmp_path / "out").parts == (
        ".".join(gpuconf_version().split(".")[:2]),
        "example-inc-acme-gpu-scheduler",
        "scheduler-v2.1.0",
    )
    assert sorted(p.name for p in folder.iterdir()) == sorted([*certify.FILES, certify.SUMS])
    result = certify.verify(tmp_path / "out")
    assert result.failed() == [], "\n".join(result.lines())
    assert (
        result.lines()[-1]
        == f"{len(certify.REQUIREMENTS)} of {len(certify.REQUIREMENTS)} requirements passed: submittable"
    )
    (claims,) = [r for r in result.requirements if r.id == "claims"]
    assert claims.note == "sandbox-verified, simulated GPUs"
    report = yaml.safe_load((folder / certify.REPORT).read_text())
    assert report["level"] == {
        "name": "conformant",
        "qualifiers": ["sandbox-verified, simulated GPUs"],
        "notJudged": [],
    }
    assert report["target"] == "sandbox" and report["apiVersion"] == "gpuconf.io/v1alpha2"
    assert all(
        c["outcome"] == "passed" and c["evidence"].startswith("sha256:")
        for c in report["profiles"][0]["checks"]
    )
    assert "<kubeconfig>" in (folder / certify.RUN).read_text()


def test_bundling_twice_gives_identical_bytes(tmp_path: Path) -> None:
    run = vendor_run(tmp_path)
    one = certify.bundle(run, tmp_path / "one", SUBMITTER)
    two = certify.bundle(run, tmp_path / "two", SUBMITTER)
    for name in [*certify.FILES, certify.SUMS]:
        assert (one / name).read_bytes() == (two / name).read_bytes(), name
    with tarfile.open(one / ARCHIVE) as tar:
        names = tar.getnames()
        assert names == sorted(names) and {m.mtime for m in tar.getmembers()} == {0}


def test_the_recorded_reference_run_is_refused_as_a_certification(tmp_path: Path) -> None:
    """As recorded: gpuconf's reference scheduler was the party under test."""
    run = tmp_path / "run"
    shutil.copytree(RECORDED, run)
    _edit_run(run / "run.json", lambda d: d["suite"].update(modified=False))
    folder = certify.bundle(run, tmp_path / "out", SUBMITTER)
    assert "not-reference" in failed(folder)
    assert "reference scheduler" in finding(folder, "not-reference").found
    level = yaml.safe_load((folder / certify.REPORT).read_text())["level"]
    assert "reference components" in level["qualifiers"]


def test_node_and_stack_claims_from_the_sandbox_are_refused(tmp_path: Path) -> None:
    folder = bundled(tmp_path, lambda d: d["invocation"].update(profiles=["scheduler", "node", "stack"]))
    assert {"claims", "completeness"} <= set(failed(folder))
    f = finding(folder, "claims")
    assert f.found == "node claimed from sandbox on simulated GPUs" and "scheduler profile only" in f.fix


# ----------------------------------------------------------------------------- tampering


def test_an_edited_report_is_refused(tmp_path: Path) -> None:
    folder = bundled(tmp_path)
    path = folder / certify.REPORT
    path.write_text(path.read_text().replace("result: success", "result: partial", 1))
    assert {"checksums", "render"} <= set(failed(folder))
    _resum(folder)  # even with the checksums made to match
    assert "render" in failed(folder) and "checksums" not in failed(folder)
    assert "never edit report.yaml" in finding(folder, "render").fix


def test_a_changed_evidence_file_is_refused(tmp_path: Path) -> None:
    folder = bundled(tmp_path)
    members = read_archive(folder / ARCHIVE)
    name = sorted(members)[0]
    members[name] = members[name].replace(b"Running", b"Pending", 1) + b" "
    write_archive(members, folder / ARCHIVE)
    assert "checksums" in failed(folder)
    _resum(folder)
    found = failed(folder)
    assert "evidence" in found and "checksums" not in found
    assert "evidence of scheduler/" in finding(folder, "evidence").file


def _narrowed(data: dict[str, Any]) -> None:
    data["invocation"]["filters"]["checks"] = ["memory-fit"]
    data["options"]["checks"] = ["memory-fit"]
    data["results"] = [r for r in data["results"] if r["id"] == "memory-fit"]


def test_a_check_narrowed_run_is_refused(tmp_path: Path) -> None:
    folder = bundled(tmp_path, _narrowed)
    assert {"no-narrowing", "completeness", "conformant"} <= set(failed(folder))
    assert finding(folder, "no-narrowing").found == "--check memory-fit"
    level = yaml.safe_load((folder / certify.REPORT).read_text())["level"]
    assert level["name"] == "partial" and "the run was narrowed: --check memory-fit" in level["notJudged"]


def test_a_keyword_narrowed_run_is_refused(tmp_path: Path) -> None:
    folder = bundled(tmp_path, lambda d: d["invocation"]["filters"].update(keyword="memory"))
    assert "no-narrowing" in failed(folder)
    assert finding(folder, "no-narrowing").found == "-k 'memory'"


def test_a_run_that_skipped_preflight_is_refused(tmp_path: Path) -> None:
    def skip(data: dict[str, Any]) -> None:
        data["invocation"]["skipPreflight"] = True
        data["preflight"] = {"skipped": True}

    assert "preflight" in failed(bundled(tmp_path, skip))


def test_a_fault_escaping_in_one_fidelity_only_is_refused(tmp_path: Path) -> None:
    def escape_on_h200(data: dict[str, Any]) -> None:
        h200 = data["suiteValidation"]["fidelities"]["h200"]
        h200["faults"]["no-eviction"].update(verdict="ESCAPED", caughtBy=[])
        h200["score"]["caught"] -= 1

    folder = bundled(tmp_path, escape_on_h200)
    assert failed(folder) == ["mutation-score"]
    found = finding(folder, "mutation-score").found
    assert "(h200 fidelity)" in found and found.endswith("escaped: no-eviction")


def test_an_interrupted_run_is_not_bundled_and_a_forged_one_is_refused(tmp_path: Path) -> None:
    run = vendor_run(tmp_path, lambda d: d.update(interrupted=True))
    with pytest.raises(certify.BundleError, match="interrupted"):
        certify.bundle(run, tmp_path / "out", SUBMITTER)
    folder = bundled(tmp_path / "again")
    forge(folder, lambda d: d.update(interrupted=True))
    assert {"not-interrupted", "conformant"} <= set(failed(folder))


def test_a_missing_check_is_refused(tmp_path: Path) -> None:
    folder = bundled(tmp_path)
    forge(folder, lambda d: d.update(results=[r for r in d["results"] if r["id"] != "node-readiness"]))
    assert failed(folder) == ["completeness"]
    assert finding(folder, "completeness").field == "results[scheduler/node-readiness]"


def test_a_skipped_check_of_a_claimed_feature_is_refused(tmp_path: Path) -> None:
    def skip(data: dict[str, Any]) -> None:
        (result,) = [r for r in data["results"] if r["id"] == "multi-device"]
        result.update(
            outcome="skipped",
            reason="needs feature(s) multi-device, which the implementation does not support",
        )

    folder = bundled(tmp_path, skip)
    assert "completeness" in failed(folder)
    assert finding(folder, "completeness").field == "results[scheduler/multi-device].outcome"


def _unclaimed(check: str, feature: str) -> Callable[[dict[str, Any]], None]:
    def edit(data: dict[str, Any]) -> None:
        data["options"]["supportedFeatures"].remove(feature)
        data["options"]["unsupportedFeatures"] = [feature]
        (result,) = [r for r in data["results"] if r["id"] == check]
        result.update(
            outcome="skipped",
            reason=f"needs feature(s) {feature}, which the implementation does not support",
        )

    return edit


def test_a_skip_for_an_unclaimed_feature_is_accepted(tmp_path: Path) -> None:
    assert failed(bundled(tmp_path, _unclaimed("modes-side-by-side", "sm-sharing"))) == []


def test_a_core_check_skipped_for_an_unclaimed_feature_is_not_conformant(tmp_path: Path) -> None:
    # multi-device is one of the checks that define the scheduler profile: never outside a claim
    assert failed(bundled(tmp_path, _unclaimed("multi-device", "multi-device"))) == ["conformant"]


def test_a_dirty_suite_tree_is_refused(tmp_path: Path) -> None:
    folder = bundled(tmp_path, lambda d: d["suite"].update(modified=True))
    assert failed(folder) == ["suite-unmodified"]


def test_a_suite_version_outside_the_window_is_refused(tmp_path: Path) -> None:
    folder = bundled(tmp_path)
    later = certify.SuiteFacts.installed()
    later.version = "0.3.0"  # the verifier two minor versions later: 0.1 is no longer current
    assert "suite-version" in failed(folder, later)
    assert certify.accepted_minors("0.3.0") == ["0.3", "0.2"]


def test_a_readme_without_reproduce_or_with_another_command_is_refused(tmp_path: Path) -> None:
    folder = bundled(tmp_path)
    readme = folder / certify.README
    original = readme.read_text()
    readme.write_text(original.replace(certify.REPRODUCE, "## How we ran it"))
    _resum(folder)
    assert failed(folder) == ["readme"]
    readme.write_text(
        original.replace("--scheduler-name acme-gpu", "--scheduler-name acme-gpu --timeout-scale 5")
    )
    _resum(folder)
    assert failed(folder) == ["readme"]
    assert "--timeout-scale 5" in finding(folder, "readme").found


def test_a_completed_readme_is_bundled_and_accepted(tmp_path: Path) -> None:
    folder = bundled(tmp_path)
    completed = tmp_path / "README.md"
    completed.write_text(
        (folder / certify.README).read_text().replace(certify.VENDOR_STEPS, "helm install acme ...")
    )
    folder = certify.bundle(tmp_path / "run", tmp_path / "out", SUBMITTER, completed)
    assert failed(folder) == [] and "helm install acme" in (folder / certify.README).read_text()


def test_a_home_path_left_in_run_json_is_refused(tmp_path: Path) -> None:
    folder = bundled(tmp_path)
    forge(folder, lambda d: d["results"][0].update(detail="kubeconfig at /home/alice/.kube/config"))
    assert failed(folder) == ["redaction"]
    f = finding(folder, "redaction")
    assert (f.file, f.field) == ("run.json", "kubeconfig path")


def test_bundling_redacts_what_the_run_left(tmp_path: Path) -> None:
    folder = bundled(tmp_path, lambda d: d["results"][0].update(detail="from /home/alice/src at 10.1.2.3"))
    text = (folder / certify.RUN).read_text()
    assert "/home/alice" not in text and "10.1.2.3" not in text and "<home>/src" in text


def test_a_moving_implementation_version_is_refused(tmp_path: Path) -> None:
    run = vendor_run(tmp_path)
    folder = certify.bundle(
        run, tmp_path / "out", Implementation(**{**SUBMITTER.__dict__, "version": "latest"})
    )
    assert failed(folder) == ["implementation"]


# ----------------------------------------------------------------------------- the command line


def _main(argv: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(argv)
    return code, out.getvalue()


def test_verify_json_follows_its_schema_and_exit_codes(tmp_path: Path) -> None:
    folder = bundled(tmp_path)
    schema = json.loads((PACKAGE_DIR / "verification.schema.json").read_text())
    code, text = _main(["report", "verify", str(tmp_path / "out"), "--json"])
    data = json.loads(text)
    jsonschema.validate(data, schema)
    assert code == 0 and data["submittable"] and data["passed"] == data["total"]
    forge(folder, lambda d: d["suite"].update(modified=None))
    code, text = _main(["report", "verify", str(folder), "--json"])
    data = json.loads(text)
    jsonschema.validate(data, schema)
    assert code == 1 and not data["submittable"] and data["passed"] == data["total"] - 1
    assert _main(["report", "verify", str(tmp_path / "nothing")])[0] == 2


def test_bundle_from_the_command_line_with_a_submitter_file(tmp_path: Path) -> None:
    run = vendor_run(tmp_path)
    sub = tmp_path / "submitter.yaml"
    sub.write_text(yaml.safe_dump({k: v for k, v in SUBMITTER.__dict__.items()}))
    code, text = _main(
        ["report", "bundle", str(run), "--out", str(tmp_path / "out"), "--submitter", str(sub)]
    )
    assert code == 0 and "wrote" in text
    assert _main(["report", "verify", str(tmp_path / "out")])[0] == 0
    sub.write_text("organization: Example Inc\nversion: v1\n")
    assert (
        _main(["report", "bundle", str(run), "--out", str(tmp_path / "x"), "--submitter", str(sub)])[0] == 2
    )


def test_attest_writes_an_in_toto_statement_over_the_checksums(tmp_path: Path) -> None:
    folder = bundled(tmp_path)
    code, _text = _main(["report", "attest", str(folder)])
    assert code == 0
    statement = json.loads((folder / certify.STATEMENT).read_text())
    assert (
        statement["_type"] == certify.STATEMENT_TYPE and statement["predicateType"] == certify.PREDICATE_TYPE
    )
    (subject,) = statement["subject"]
    assert subject["name"] == certify.SUMS and f"sha256:{subject['digest']['sha256']}" == file_digest(
        folder / certify.SUMS
    )
    assert statement["predicate"]["result"] == "PASSED" and statement["predicate"]["failedTests"] == []
    assert "attestation" in [r.id for r in certify.verify(folder).requirements] and failed(folder) == []
    (folder / certify.README).write_text((folder / certify.README).read_text() + "\n")
    _resum(folder)  # SHA256SUMS changed after the attestation
    assert "attestation" in failed(folder)


def test_require_signature_says_how_to_sign(tmp_path: Path) -> None:
    folder = bundled(tmp_path)
    certify.attest(folder)
    (req,) = [r for r in certify.verify(folder, require_signature=True).requirements if r.id == "signature"]
    assert not req.passed and "cosign attest-blob" in req.findings[0].fix

"""What a run records of its origin: the redacted command line, the invocation, the suite's identity."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from fixtures.suite.frame import RunOptions
from fixtures.suite.invocation import invocation
from reports.provenance import digest_of_files, leaks, redact_argv, redact_text, suite_identity

ROOT = Path(__file__).resolve().parents[2]


def test_a_command_line_is_published_without_secrets_or_local_paths() -> None:
    argv = [
        "/home/alice/src/gpuconf/.venv/bin/gpuconf",
        "run",
        "--kubeconfig",
        "/home/alice/.kube/config",
        "--report-dir=/home/alice/results",
        "--api-token",
        "s3cret",
        "--scheduler-command",
        "/opt/acme/bin/acme-scheduler --kubeconfig {kubeconfig}",
        "--profile",
        "scheduler",
    ]
    assert redact_argv(argv) == [
        "gpuconf",
        "run",
        "--kubeconfig",
        "<kubeconfig>",
        "--report-dir=results",
        "--api-token",
        "<redacted>",
        "--scheduler-command",
        "acme-scheduler --kubeconfig {kubeconfig}",
        "--profile",
        "scheduler",
    ]


def test_home_paths_kubeconfig_paths_and_private_addresses_are_found_and_replaced() -> None:
    text = "at /home/bob/x, /root/.local/state/gpuconf/sandbox/kubeconfig, https://10.2.3.4:6443, 8.8.8.8"
    assert [kind for kind, _ in leaks(text)] == ["kubeconfig path", "home path", "private address"]
    assert redact_text(text) == "at <home>/x, <kubeconfig>, https://<private-address>:6443, 8.8.8.8"
    assert leaks(redact_text(text)) == []


def test_the_suite_is_identified_by_commit_and_digests() -> None:
    found = suite_identity("0.1.0", ROOT, ROOT / "conformance" / "catalog.yaml", None)
    assert len(found["commit"]) == 40 and isinstance(found["modified"], bool)
    assert found["digest"].startswith("sha256:") and found["catalogDigest"].startswith("sha256:")
    assert found["mutationScoreDigest"] == ""
    assert digest_of_files({"b": b"2", "a": b"1"}) == digest_of_files({"a": b"1", "b": b"2"})


def _config(**options: Any) -> Any:
    values = {
        "supported_features": ["gpu-memory,nvidia,sm-sharing"],
        "exempt_features": None,
        "profile": ["scheduler"],
        "skip_preflight": True,
    }
    option = SimpleNamespace(
        keyword="memory", markexpr="", deselect=["x::y"], maxfail=1, lf=False, numprocesses=2
    )
    return SimpleNamespace(
        getoption=lambda name: values[name],
        option=option,
        args=["conformance", "conformance/test_modes.py::test_x"],
        invocation_params=SimpleNamespace(args=("--pyargs", "conformance", "-k", "memory")),
        **options,
    )


def test_the_invocation_records_every_filter_and_where_each_feature_came_from() -> None:
    options = RunOptions(
        scheduler_name="x",
        profiles=("scheduler",),
        supported_features=frozenset({"gpu-memory", "nvidia", "sm-sharing"}),
        run_id="r",
        checks=("memory-fit",),
        timeout_scale=2.0,
    )
    found = invocation(_config(), options)
    assert found["filters"] == {
        "checks": ["memory-fit"],
        "keyword": "memory",
        "markers": "",
        "deselect": ["x::y"],
        "nodeIds": ["conformance/test_modes.py::test_x"],
        "maxfail": 1,
        "lastFailed": False,
    }
    assert (found["skipPreflight"], found["timeoutScale"], found["workers"]) == (True, 2.0, 2)
    forms = {f["name"]: (f["supported"], f["source"]) for f in found["requestForms"]}
    assert forms == {
        "gpu-memory": (True, "command line"),
        "gpu-fraction": (False, "default"),
        "nvidia": (True, "command line"),
    }
    features = {f["name"]: f["supported"] for f in found["features"]}
    assert features == {
        "sm-sharing": True,
        "multi-device": False,
        "soft-limit-eviction": False,
        "agent-restart": False,
        "pinned-mps-limits": False,
        "compute-portion": False,
        "nvml-memory-view": False,
    }
    assert found["pytestArgs"] == ["--pyargs", "conformance", "-k", "memory"]

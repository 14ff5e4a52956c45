"""Each built-in node implementation, emulated in the sandbox: declared and detected, CONFORMANT, with the
mechanisms it does not claim listed as not judged; a declaration the cluster contradicts stops preflight.

One control plane for the module; each test re-ups it with another ``agent_emulate`` (the agents
restart with ``--emulate``, the cluster's condition, CRD, config CR and DaemonSet stand-ins follow).
Only the checks that differ by implementation run (node profile), to keep it lean.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from sandbox_args import RETRY

from fixtures.sandbox.controlplane import Ports, Sandbox, SandboxConfig

pytestmark = pytest.mark.sandbox

CHECKS = ("env-injection", "mode-applied", "fail-closed", "smi-visibility", "cuda-visibility")
TOY = Path(__file__).resolve().parents[2] / "tests" / "data" / "schedulers" / "toy_scheduler.py"
KAI_LIKE = f"{sys.executable} {TOY} --kubeconfig {{kubeconfig}} --name toy-kai --kai-like"
SCHEDULER_CHECKS = ("annotations-at-bind", "memory-fit", "portion-conversion")


@pytest.fixture(scope="module")
def config(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SandboxConfig]:
    cfg = SandboxConfig(
        state_dir=tmp_path_factory.mktemp("impl") / "sb",
        ports=Ports.free(),
        schedulers=("reference",),
        node_runtime=True,
        scheduler_commands=(KAI_LIKE,),
    )
    Sandbox(cfg).up(log=print)
    try:
        yield cfg
    finally:
        Sandbox(cfg).down()


def emulating(config: SandboxConfig, name: str) -> Sandbox:
    box = Sandbox(replace(config, agent_emulate=name))
    box.up(log=print)
    return box


def gpuconf_run(box: Sandbox, out: Path, *extra: str) -> tuple[int, dict[str, Any], str]:
    argv = [sys.executable, "-m", "conformance.cli", "run", "--kubeconfig", str(box.kubeconfig), RETRY]
    argv += ["--scheduler-name", "gpuconf-reference", "--profile", "node", "--report-dir", str(out)]
    argv += [a for c in CHECKS for a in ("--check", c)] + list(extra)
    proc = subprocess.run(
        argv, capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    run = out / "run.json"
    record = json.loads(run.read_text()) if run.exists() else {}
    return proc.returncode, record, proc.stdout + proc.stderr


def notes(record: dict[str, Any]) -> dict[str, list[str]]:
    return {r["id"]: r["notes"] for r in record["results"]}


def outcomes(record: dict[str, Any]) -> dict[str, str]:
    return {r["id"]: r["outcome"] for r in record["results"]}


@pytest.mark.parametrize(
    ("name", "declare"),
    [
        ("operator-gen1", True),
        ("operator-gen1", False),
        ("operator-gen2", False),
        ("operator-gen3", True),
        ("operator-gen3", False),
        ("operator-pr", True),
    ],
)
def test_emulated_generation_is_conformant(
    config: SandboxConfig, tmp_path: Path, name: str, declare: bool
) -> None:
    box = emulating(config, name)
    rc, record, output = gpuconf_run(box, tmp_path, *(("--implementation", name) if declare else ()))
    assert rc == 0, output
    assert "CONFORMANT" in output
    assert record["implementationUnderTest"]["node"]["name"] == name
    chosen = record["implementationUnderTest"]["node"]["chosen"]
    assert chosen.startswith("declared" if declare else "detected"), chosen
    seen = outcomes(record)
    if name == "operator-pr":
        assert seen["smi-visibility"] == "passed"
        assert not any("pinned" in n or "thread cap" in n for n in notes(record)["env-injection"])
    else:
        assert seen["smi-visibility"] == "skipped"
        reason = next(r["reason"] for r in record["results"] if r["id"] == "smi-visibility")
        assert "does not claim nvml-memory-view" in reason and "in no release" in reason
        assert any("pinned-mps-limits" in n for n in notes(record)["env-injection"])
        assert any("thread cap" in n for n in notes(record)["mode-applied"])
        failclosed = " ".join(notes(record)["fail-closed"])
        assert "request-above-limit" in failclosed and "admission" in failclosed
        assert "unknown-device" in failclosed and "container runtime" in failclosed
    assert seen["env-injection"] == seen["mode-applied"] == seen["fail-closed"] == "passed"
    assert seen["cuda-visibility"] == "passed"


def test_declared_generation_the_cluster_contradicts_stops_preflight(
    config: SandboxConfig, tmp_path: Path
) -> None:
    box = emulating(config, "operator-gen1")
    rc, record, output = gpuconf_run(box, tmp_path, "--implementation", "operator-gen3")
    assert rc == 2, output
    said = [line for line in output.splitlines() if "preflight failed" in line]
    assert len(said) == 1, output
    assert (
        "operator-gen3" in said[0]
        and "operator-gen1" in said[0]
        and "gpu-sharing.nvidia.com/Ready" in said[0]
    )
    assert not record.get("results")


def test_unknown_implementation_exits_2_listing_the_known(config: SandboxConfig, tmp_path: Path) -> None:
    rc, _record, output = gpuconf_run(Sandbox(config), tmp_path, "--implementation", "operator-gen9")
    assert rc == 2 and "known: contract-scheduler, gpuconf-reference" in output


def kai_run(box: Sandbox, out: Path, *extra: str) -> tuple[int, dict[str, Any], str]:
    argv = [sys.executable, "-m", "conformance.cli", "run", "--kubeconfig", str(box.kubeconfig), RETRY]
    argv += ["--scheduler-name", "toy-kai", "--profile", "scheduler", "--report-dir", str(out)]
    argv += [a for c in SCHEDULER_CHECKS for a in ("--check", c)] + list(extra)
    proc = subprocess.run(
        argv, capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    run = out / "run.json"
    record = json.loads(run.read_text()) if run.exists() else {}
    return proc.returncode, record, proc.stdout + proc.stderr


def test_kai_like_scheduler_certified_through_its_defaults(config: SandboxConfig, tmp_path: Path) -> None:
    box = emulating(config, "operator-gen3")
    rc, record, output = kai_run(box, tmp_path, "--implementation", "kai-scheduler")
    assert rc == 0, output
    assert record["implementationUnderTest"]["podDecorations"]["labels"] == {
        "kai.scheduler/queue": "default-queue"
    }
    rc, _record, output = kai_run(box, tmp_path / "label", "--pod-label", "kai.scheduler/queue=team-a")
    assert rc == 0, output


def test_kai_like_scheduler_without_its_label_is_told_why(config: SandboxConfig, tmp_path: Path) -> None:
    box = emulating(config, "operator-gen3")
    rc, _record, output = kai_run(box, tmp_path)
    assert rc == 2, output
    said = [line for line in output.splitlines() if "preflight failed" in line]
    assert len(said) == 1 and "binds nothing" in said[0] and "--pod-label" in said[0], output

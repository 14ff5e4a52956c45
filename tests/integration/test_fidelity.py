"""The simulated H200: the whole suite passes the reference stack on it, and a slow-binding scheduler
is judged (and passes when it is correct).

One sandbox in the ``h200`` fidelity (``SandboxConfig.fidelity``: 2 MiB pages, a CUDA context per
process, the kernel cost model, an agent that evicts by CUDA error after a 1 s reaction period),
running the reference scheduler and, as a vendor's command, the toy polling scheduler of
``tests/data/schedulers/toy_scheduler.py`` binding one round every 0.5 s. Then:

- ``gpuconf run`` of every profile against the reference scheduler and agent exits 0, and the
  results say the device was a simulated H200 (the boundary 514 MiB below the limit, the eviction
  by a CUDA error, the calibrated kernel);
- ``gpuconf run --profile stack --check compute-modes`` against the slow binder is judged, not an
  error: the start barrier releases the neighbours together however far apart they were bound.

Wall time on 2 cores: about 5-6 minutes (the suite's own figure is in docs/benchmarks.md).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sandbox_args import RETRY

from fixtures.sandbox.controlplane import Ports, Sandbox, SandboxConfig

pytestmark = pytest.mark.sandbox

ROOT = Path(__file__).resolve().parents[2]
TOY = ROOT / "tests" / "data" / "schedulers" / "toy_scheduler.py"
SLOW = f"{sys.executable} {TOY} --kubeconfig {{kubeconfig}} --name gpuconf-slow --interval 0.5"
REACTION_S = "1.1"  # the h200 reference agent's reaction period (1 s) and one pressure poll


def gpuconf(*argv: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "conformance.cli", *argv],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "GPUCONF_IN_CLUSTER": "0"},
        cwd=ROOT,
    )


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    sandbox = Sandbox(
        SandboxConfig(
            state_dir=tmp_path_factory.mktemp("h200") / "sb",
            ports=Ports.free(),
            node_runtime=True,
            fidelity="h200",
            schedulers=("reference",),
            scheduler_commands=(SLOW,),
        )
    )
    sandbox.down()
    sandbox.up(log=lambda m: None)
    try:
        yield sandbox
    finally:
        sandbox.down()


def results(out: Path) -> dict[str, dict[str, Any]]:
    run = out / "run.json"
    return {r["key"]: r for r in json.loads(run.read_text())["results"]} if run.exists() else {}


def facts(out: Path, key: str) -> dict[str, Any]:
    check = json.loads((out / "checks" / f"{key.replace('/', '.')}.json").read_text())
    return dict(check["evidence"]["facts"])


def test_the_whole_suite_passes_the_reference_stack_on_a_simulated_h200(box: Sandbox, tmp_path: Path) -> None:
    run = gpuconf(
        "run",
        f"--kubeconfig={box.kubeconfig}",
        "--scheduler-name=gpuconf-reference",
        f"--reaction-period={REACTION_S}",
        RETRY,
        f"--report-dir={tmp_path}",
    )
    found = results(tmp_path)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert found and {r["outcome"] for r in found.values()} == {"passed"}
    boundary = facts(tmp_path, "node/hard-limit-oom")["boundary"]
    assert boundary["fidelity"] == "h200" and boundary["device"] == "simulated H200"
    assert boundary["gapMiB"] == 514  # the 512 MiB context and one 2 MiB page inside the limit
    evicting = facts(tmp_path, "node/soft-limit-eviction")
    eviction = evicting["eviction"]
    # The larger of two borrowers, either of which covers the claim; the pressure shown first.
    assert eviction["reason"] == "CUDA error" and eviction["evicted"] == ["borrower-1"]
    assert evicting["pressureShown"]["shown"] and evicting["pressureShown"]["claimant"]["lacked"]
    picked = facts(tmp_path, "node/compute-modes")["calibration"]["picked"]
    assert set(picked.values()) == {1024}  # the largest kernel that does not fill a simulated H200


def test_a_slow_binding_scheduler_is_judged_on_compute_modes(box: Sandbox, tmp_path: Path) -> None:
    run = gpuconf(
        "run",
        f"--kubeconfig={box.kubeconfig}",
        "--scheduler-name=gpuconf-slow",
        f"--reaction-period={REACTION_S}",
        RETRY,
        "--profile=stack",
        "--check=compute-modes",
        f"--report-dir={tmp_path}",
    )
    found = results(tmp_path)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert found["stack/compute-modes"]["outcome"] == "passed"
    comparison = facts(tmp_path, "stack/compute-modes")["comparison"]
    assert all(f["sharedSeconds"] >= 1.0 for f in comparison.values())

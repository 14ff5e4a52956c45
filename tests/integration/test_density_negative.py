"""``density-ramp`` fails against a broken stack, and says at which step.

The mutation run judges agent faults on the ``node`` profile and scheduler faults on the
``scheduler`` profile, so the ``stack`` check ``density-ramp`` is shown failing here instead. The
broken implementation is the reference scheduler with ``leak-completed``: it keeps counting the
guarantees of finished Pods, so each step of the ramp leaves less of the GPU than the last (1 + 2 +
4 workloads of 0.1 of a GPU leak 0.7 of it), and the step of 8 cannot be placed although its
guarantees fit the GPU. (The agent faults do not reach this check: ``leak-on-exit`` keeps
guarantees the simulated device never reserves, since a process's memory goes back when it ends,
and ``overcommit`` is caught already while the stage's fillers are placed, before any step.)

One sandbox of its own (the broken scheduler's ledger must start empty), one ``gpuconf run`` with
halved timeouts: under a minute in all.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sandbox_args import RETRY

from fixtures.sandbox.controlplane import Ports, Sandbox, SandboxConfig

pytestmark = pytest.mark.sandbox

SCHEDULER = "m-leak"


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    sandbox = Sandbox(
        SandboxConfig(
            state_dir=tmp_path_factory.mktemp("density") / "sb",
            ports=Ports.free(),
            schedulers=(f"reference/{SCHEDULER}:leak-completed",),
            node_runtime=True,
        )
    )
    sandbox.up(log=print)
    try:
        yield sandbox
    finally:
        sandbox.down()


def test_density_ramp_fails_at_the_step_a_leaking_scheduler_cannot_place(
    box: Sandbox, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    argv = [sys.executable, "-m", "conformance.cli", "run", f"--kubeconfig={box.kubeconfig}", RETRY]
    argv += [f"--scheduler-name={SCHEDULER}", "--profile=stack", "--check=density-ramp"]
    argv += ["--skip-preflight", "--timeout-scale=0.5", f"--report-dir={out}"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "GPUCONF_IN_CLUSTER": "0"}
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, env=env)
    output = proc.stdout + proc.stderr
    record = json.loads((out / "run.json").read_text())
    (result,) = [r for r in record["results"] if r["id"] == "density-ramp"]
    assert result["outcome"] == "failed", output[-3000:]  # (a SHOULD: the run's exit code stays 0)
    reason = result["reason"]
    assert reason.startswith("the step of 8 workloads"), reason
    assert "step8-" in reason and "was not bound" in reason, reason

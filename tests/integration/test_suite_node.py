"""The node and stack profiles, judged end to end: they pass the reference stack and catch every broken agent.

One sandbox (reference scheduler; per node the simulated device, the reference agent and the
simulated kubelet). First the suite's ``node`` and ``stack`` profiles run against it as they would
against a real cluster (``--kubeconfig``), and every check must pass. Then each seeded fault of the
reference agent (``enforcement.agent.options.FAULTS``, each breaking one duty) is given to one
node's agent, and the ``node`` profile, confined to that node, runs the checks ``CAUGHT_BY`` names
for it: each must fail. The two nodes take two faults at a time, in two concurrent runs (which
also shows that runs against one cluster keep apart).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from enforcement.agent.options import FAULTS
from fixtures.sandbox.controlplane import Ports, Sandbox, SandboxConfig

pytestmark = pytest.mark.sandbox

NODES = ("gpu-a-0", "gpu-a-1")
RUN_TIMEOUT_S = 600
STAGGER_S = 3.0

CAUGHT_BY: dict[str, set[str]] = {
    "no-hard-limit": {"hard-limit-oom"},
    "no-borrowing": {"burst-borrowing"},
    "no-eviction": {"soft-limit-eviction"},
    "evict-guaranteed": {"guarantee-kept"},
    "evict-without-pressure": {"no-eviction-without-pressure", "burst-borrowing"},
    "no-mode-guard": {"mode-guard"},
    "ignore-mode": {"mode-applied", "compute-modes"},
    "whole-gpu-visibility": {"smi-visibility", "env-injection"},
    "full-visibility": {"smi-visibility", "env-injection"},
    "wrong-visible-devices": {"env-injection"},
    "no-release": {"release-on-exit"},
    "no-recovery": {"agent-restart"},
    "fail-open": {"fail-closed"},
    "fail-open-silently": {"fail-closed"},
}
"""Which check catches which broken duty of the node agent (each check listed must fail)."""


def test_every_agent_fault_has_a_check_that_catches_it() -> None:
    assert set(CAUGHT_BY) == set(FAULTS), "a seeded agent fault without a catching check, or a stale entry"


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    sandbox = Sandbox(
        SandboxConfig(
            state_dir=tmp_path_factory.mktemp("node-suite") / "sb",
            ports=Ports.free(),
            schedulers=("reference",),
            node_runtime=True,
        )
    )
    sandbox.up(log=print)
    try:
        yield sandbox
    finally:
        sandbox.down()


def with_agent_faults(box: Sandbox, faults: tuple[str, ...]) -> Sandbox:
    """The same sandbox, its agents restarted with ``faults`` (``NODE:FAULT`` entries)."""
    configured = Sandbox(replace(box.config, agent_faults=faults))
    configured.up(log=print)
    return configured


def run_suite(box: Sandbox, out: Path, *args: str) -> tuple[int, dict[str, Any], str]:
    argv = [sys.executable, "-m", "pytest", "--pyargs", "conformance", "-p", "no:cacheprovider", "-q"]
    argv += ["--kubeconfig", str(box.kubeconfig), "--scheduler-name", "gpuconf-reference"]
    argv += ["--report-dir", str(out), *args]
    proc = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    run = out / "run.json"
    record = json.loads(run.read_text()) if run.exists() else {}
    return proc.returncode, record, proc.stdout[-6000:] + proc.stderr[-3000:]


def test_reference_stack_passes_the_node_and_stack_profiles(box: Sandbox, tmp_path: Path) -> None:
    reference = with_agent_faults(box, ())
    rc, record, output = run_suite(reference, tmp_path, "--profile", "node", "--profile", "stack")
    seen = {r["key"]: (r["outcome"], r["reason"]) for r in record.get("results", [])}
    assert seen, output
    not_passed = {k: v for k, v in seen.items() if v[0] != "passed"}
    assert not not_passed, f"{not_passed}\n{output}"
    assert rc == 0, output
    profiles = {r["profile"] for r in record["results"]}
    assert profiles == {"node", "stack"}


@pytest.fixture(scope="module")
def fault_runs(
    box: Sandbox, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, tuple[int, dict[str, Any], str]]:
    """Each fault judged on its node with the checks that must catch it, two faults (nodes) at a time."""
    faults = sorted(CAUGHT_BY)
    results: dict[str, tuple[int, dict[str, Any], str]] = {}
    for start in range(0, len(faults), len(NODES)):
        chosen = dict(zip(NODES, faults[start : start + len(NODES)], strict=False))
        configured = with_agent_faults(box, tuple(f"{node}:{fault}" for node, fault in chosen.items()))

        def judge(node: str, configured: Sandbox = configured, chosen: dict[str, str] = chosen) -> Any:
            fault = chosen[node]
            # Not both at the same instant: a run starting cleans namespaces of runs whose lease it
            # does not see yet, so the second starts once the first holds its run lease.
            time.sleep(STAGGER_S * list(chosen).index(node))
            checks = [arg for check in sorted(CAUGHT_BY[fault]) for arg in ("--check", check)]
            selector = ["--gpu-node-selector", f"kubernetes.io/hostname={node}", "--skip-preflight"]
            return run_suite(
                configured, tmp_path_factory.mktemp(fault), "--profile", "node", *selector, *checks
            )

        with ThreadPoolExecutor(max_workers=len(chosen)) as pool:
            for node, outcome in zip(chosen, pool.map(judge, chosen), strict=True):
                results[chosen[node]] = outcome
    with_agent_faults(box, ())
    return results


@pytest.mark.parametrize("fault", sorted(CAUGHT_BY))
def test_each_agent_fault_is_caught(
    fault_runs: dict[str, tuple[int, dict[str, Any], str]], fault: str
) -> None:
    rc, record, output = fault_runs[fault]
    results = record.get("results", [])
    failed = {r["id"] for r in results if r["outcome"] == "failed"}
    errors = {r["key"]: r["reason"] for r in results if r["outcome"] == "error"}
    assert not errors, f"{fault}: the suite could not judge: {errors}\n{output}"
    assert CAUGHT_BY[fault] <= failed, (
        f"{fault}: expected {sorted(CAUGHT_BY[fault])} to fail, failed: {failed}\n{output}"
    )
    assert rc == 1, output

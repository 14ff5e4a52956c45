"""The suite end to end through ``gpuconf run --kubeconfig``, as it judges a vendor's cluster.

One sandbox runs the reference scheduler and the upstream kube-scheduler side by side. (The whole
suite passing the reference stack with two xdist workers is the mutation run's control,
``test_mutation.py``, which then judges every seeded fault.) The upstream kube-scheduler,
which knows nothing of fractions, fails, and the failures name the missing annotations; a SIGINT in
the middle of a run leaves nothing behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sandbox_args import RETRY, interruptible

from fixtures.sandbox.controlplane import Ports, Sandbox, SandboxConfig
from fixtures.suite.waiting import wait_until

pytestmark = pytest.mark.sandbox


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    specs = ("reference", "upstream")
    sandbox = Sandbox(
        SandboxConfig(
            state_dir=tmp_path_factory.mktemp("suite") / "sb",
            ports=Ports.free(),
            schedulers=specs,
            node_runtime=True,
        )
    )
    sandbox.up(log=print)
    try:
        yield sandbox
    finally:
        sandbox.down()


def gpuconf_run(box: Sandbox, out: Path, scheduler: str, *extra: str) -> tuple[int, dict[str, Any], str]:
    argv = [sys.executable, "-m", "conformance.cli", "run", "--kubeconfig", str(box.kubeconfig), RETRY]
    argv += ["--scheduler-name", scheduler, "--profile", "scheduler", "--report-dir", str(out), *extra]
    proc = subprocess.run(
        argv, capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    run = out / "run.json"
    record = json.loads(run.read_text()) if run.exists() else {}
    return proc.returncode, record, proc.stdout + proc.stderr


def outcomes(record: dict[str, Any]) -> dict[str, str]:
    return {r["key"]: r["outcome"] for r in record.get("results", [])}


def test_upstream_kube_scheduler_fails_naming_the_missing_annotations(box: Sandbox, tmp_path: Path) -> None:
    rc, record, output = gpuconf_run(box, tmp_path, "default-scheduler")
    assert rc == 1, output
    results = {r["key"]: r for r in record["results"]}
    at_bind = results["scheduler/annotations-at-bind[gpu-memory]"]
    assert at_bind["outcome"] == "failed", at_bind
    assert (
        "gpu-memory.request was missing" in at_bind["reason"]
        and "gpus.devices was missing" in at_bind["reason"]
    )
    assert at_bind["party"] == "scheduler"
    assert results["scheduler/memory-fit"]["outcome"] == "failed"


def test_sigint_mid_run_leaves_nothing_behind(box: Sandbox, tmp_path: Path) -> None:
    run_id = f"sigint-{int(time.time())}"
    argv = [sys.executable, "-m", "conformance.cli", "run", "--kubeconfig", str(box.kubeconfig), RETRY]
    argv += ["--scheduler-name", "gpuconf-reference", "--profile", "scheduler", "--report-dir", str(tmp_path)]
    argv += ["--check", "memory-fit", "--check", "release-on-completion", "--", "--run-id", run_id]
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=interruptible,  # noqa: PLW1509 - one signal call, nothing else runs there
    )
    core = box.core_v1()
    selector = f"gpuconf.io/run={run_id}"
    try:
        # Interrupt while a check is in the middle of its work: its Pods exist.
        wait_until(
            lambda: core.list_pod_for_all_namespaces(label_selector=selector).items, "the run's Pods", 60
        )
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, output
    assert core.list_namespace(label_selector=selector).items == [], output
    assert core.list_pod_for_all_namespaces(label_selector=selector).items == [], output
    leases = box.api_client()
    from kubernetes import client

    held = client.CoordinationV1Api(leases).list_lease_for_all_namespaces(label_selector=selector).items
    assert held == [], [lease.metadata.name for lease in held]


def test_cleanup_pods_leaves_no_pod_and_only_terminating_namespaces(box: Sandbox, tmp_path: Path) -> None:
    """``--cleanup=pods`` (what the mutation run uses) returns once the run's Pods are gone; its
    namespaces may still be terminating, never active. ``--reports=yaml`` renders that report alone
    (the plugin's own junit.xml and run.json are written whatever it says)."""
    run_id = f"pods-{int(time.time())}"
    rc, record, output = gpuconf_run(
        box, tmp_path, "gpuconf-reference", "--check=release-on-completion", "--cleanup=pods",
        "--reports=yaml", "--", "--run-id", run_id,
    )  # fmt: skip
    assert rc == 0, output
    assert set(outcomes(record).values()) == {"passed"}, output
    core = box.core_v1()
    selector = f"gpuconf.io/run={run_id}"
    assert core.list_pod_for_all_namespaces(label_selector=selector).items == [], output
    assert {ns.status.phase for ns in core.list_namespace(label_selector=selector).items} <= {"Terminating"}
    assert (tmp_path / "report.yaml").is_file()
    assert not (tmp_path / "report.html").exists() and not (tmp_path / "allure-results").exists()

"""The scheduler profile, judged end to end: it passes the reference scheduler and catches every broken one.

One sandbox runs, side by side, the reference scheduler, one reference scheduler per seeded fault
(named ``f-<fault>``) and the upstream kube-scheduler. ``gpuconf run --kubeconfig`` judges each, as
it would judge a vendor's scheduler on a real cluster. ``EXPECTED`` states, per fault, the check a
person would expect to catch it: the test runs exactly those checks against that scheduler and
requires each to fail, and the control (no fault) to pass, serially and with two workers.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from fixtures.sandbox.controlplane import Ports, Sandbox, SandboxConfig
from fixtures.scheduler.faults import FAULTS
from fixtures.waiting import wait_until

pytestmark = pytest.mark.sandbox

EXPECTED: dict[str, tuple[str, ...]] = {
    "overcommit": ("memory-fit",),
    "mix-modes": ("mode-separation",),
    "omit-limit": ("limit-and-mode-at-bind",),
    "omit-devices": ("annotations-at-bind",),
    "omit-request": ("annotations-at-bind",),
    "wrong-device-count": ("multi-device",),
    "request-gt-limit": ("annotations-at-bind",),
    "wrong-container-name": ("annotations-at-bind", "annotations-name-the-container"),
    "trust-pod-devices": ("devices-scheduler-owned",),
    "ignore-node-ready": ("node-readiness",),
    "devices-not-on-node": ("multi-device",),
    "annotate-after-bind": ("annotations-at-bind",),
    "leak-completed": ("release-on-completion",),
    "silent-unschedulable": ("unschedulable-reason",),
    "portion-of-wrong-size": ("portion-conversion",),
}


def test_every_seeded_fault_has_an_expected_check() -> None:
    assert set(EXPECTED) == set(FAULTS), (
        "a seeded scheduler fault without an expected check, or a stale entry"
    )


@pytest.fixture(scope="module")
def box(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    specs = ("reference", *(f"reference/f-{fault}:{fault}" for fault in EXPECTED), "upstream")
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
    argv = [sys.executable, "-m", "conformance.cli", "run", "--kubeconfig", str(box.kubeconfig)]
    argv += ["--scheduler-name", scheduler, "--profile", "scheduler", "--report-dir", str(out), *extra]
    proc = subprocess.run(
        argv, capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONUNBUFFERED": "1"}
    )
    run = out / "run.json"
    record = json.loads(run.read_text()) if run.exists() else {}
    return proc.returncode, record, proc.stdout + proc.stderr


def outcomes(record: dict[str, Any]) -> dict[str, str]:
    return {r["key"]: r["outcome"] for r in record.get("results", [])}


FIRST: tuple[str, ...] = ("leak-completed",)
"""Judged alone, before anything else ran: it counts every Pod it ever saw, deleted ones included,
so on a cluster that has been busy it is full and would fail preflight instead of its check."""


@pytest.fixture(scope="module")
def fault_runs(
    box: Sandbox, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, tuple[int, dict[str, Any], str]]:
    """Every faulty scheduler judged on its expected checks; the runs go four at a time, as
    independent runs against one shared cluster, so they also prove that node leases keep them apart."""

    def judge(fault: str) -> tuple[int, dict[str, Any], str]:
        checks = [arg for check in EXPECTED[fault] for arg in ("--check", check)]
        return gpuconf_run(box, tmp_path_factory.mktemp(fault), f"f-{fault}", *checks)

    results = {fault: judge(fault) for fault in FIRST}
    rest = [f for f in EXPECTED if f not in FIRST]
    with ThreadPoolExecutor(max_workers=4) as pool:
        results.update(zip(rest, pool.map(judge, rest), strict=True))
    return results


@pytest.mark.parametrize("fault", sorted(EXPECTED))
def test_each_seeded_fault_is_caught_by_its_check(
    fault_runs: dict[str, tuple[int, dict[str, Any], str]], fault: str
) -> None:
    rc, record, output = fault_runs[fault]
    failed = {r["id"] for r in record.get("results", []) if r["outcome"] == "failed"}
    errors = {r["key"]: r["reason"] for r in record.get("results", []) if r["outcome"] == "error"}
    assert not errors, f"{fault}: the suite could not judge: {errors}\n{output}"
    assert set(EXPECTED[fault]) <= failed, (
        f"{fault}: expected {EXPECTED[fault]} to fail, failed: {failed}\n{output}"
    )
    levels = {r["level"] for r in record["results"] if r["outcome"] == "failed"}
    assert rc == (1 if "MUST" in levels else 0), output


def test_reference_scheduler_passes_the_scheduler_profile(box: Sandbox, tmp_path: Path) -> None:
    rc, record, output = gpuconf_run(box, tmp_path, "gpuconf-reference")
    assert rc == 0, output
    seen = outcomes(record)
    assert seen and set(seen.values()) == {"passed"}, seen
    assert len(seen) >= 14, "every scheduler check, and annotations-at-bind in each request form"
    assert (tmp_path / "junit.xml").exists() and len(list((tmp_path / "checks").glob("*.json"))) == len(seen)


def test_reference_scheduler_passes_with_two_workers(box: Sandbox, tmp_path: Path) -> None:
    rc, record, output = gpuconf_run(box, tmp_path, "gpuconf-reference", "-n", "2")
    assert rc == 0, output
    seen = outcomes(record)
    assert len(seen) >= 14 and set(seen.values()) == {"passed"}, seen


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
    argv = [sys.executable, "-m", "conformance.cli", "run", "--kubeconfig", str(box.kubeconfig)]
    argv += ["--scheduler-name", "gpuconf-reference", "--profile", "scheduler", "--report-dir", str(tmp_path)]
    argv += ["--check", "memory-fit", "--check", "release-on-completion", "--", "--run-id", run_id]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
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

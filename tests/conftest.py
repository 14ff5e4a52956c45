"""Hooks for every gpuconf test: nothing a test started may outlive it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import settings

# No per-example deadline for the property tests: how fast an example runs is the benchmarks' business
# (make bench), and on a busy machine (a loaded CI runner, make test TEST_BESIDE=1) a
# 200 ms deadline fails a correct example for having waited on a CPU.
settings.register_profile("gpuconf", deadline=None)
settings.load_profile("gpuconf")


@pytest.fixture(autouse=True)
def _no_workload_outlives_its_test() -> Iterator[None]:
    yield
    from workloads.process import WorkloadProcess

    WorkloadProcess.kill_leftovers()  # a passing test ended its own; this catches a failed one's


@pytest.fixture(autouse=True)
def _never_in_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    """gpuconf's own tests judge the sandbox they start, even when the machine running them is a Pod
    (a CI runner): a run there must not take the cluster around it for its target."""
    monkeypatch.setenv("GPUCONF_IN_CLUSTER", "0")

"""Hooks for every gpuconf test: nothing a test started may outlive it."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def _no_workload_outlives_its_test() -> Iterator[None]:
    yield
    from workloads.process import WorkloadProcess

    WorkloadProcess.kill_leftovers()  # a passing test ended its own; this catches a failed one's

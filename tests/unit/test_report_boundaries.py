"""A boundary in the reports says what bounded it, so a passing row never reads as a failure.

guarantee-kept's borrower searches until the GPU is full, far below its limit: that distance is what
its neighbours hold, not a fence that failed, and must not be shown or compared as "off by".
"""

from __future__ import annotations

from typing import Any

from reports import figures
from reports.model import CheckResult

MIB = 1 << 20


def result(evidence: dict[str, Any]) -> CheckResult:
    return CheckResult(
        key="node/guarantee-kept",
        id="guarantee-kept",
        profile="node",
        party="node",
        level="MUST",
        statement="",
        capability="",
        outcome="passed",
        evidence=evidence,
    )


def search(reason: str, found_mib: int) -> dict[str, Any]:
    return {
        "steps": [
            {
                "op": "alloc-until-oom",
                "max_bytes": found_mib * MIB,
                "stopped_by": "oom",
                "oom": {"reason": reason},
            }
        ]
    }


def pod(limit_mib: int) -> dict[str, Any]:
    return {"annotationsAtBind": {"nvidia.com/container.main.gpu-memory.limit": f"{limit_mib}Mi"}}


def test_a_search_the_full_gpu_ended_is_bounded_by_free_memory_and_not_an_error() -> None:
    r = result({"workloads": {"borrower": search("device-full", 14377)}, "pods": {"borrower": pod(57508)}})
    (b,) = figures.boundaries(None, r)
    assert b.bounded_by == figures.BOUNDED_BY_DEVICE and not b.by_limit
    assert "boundaryErrorMiB" not in figures.figures_of(None, r)


def test_a_search_the_limit_ended_is_compared_to_the_limit() -> None:
    r = result({"workloads": {"capped": search("hard-limit", 71371)}, "pods": {"capped": pod(71885)}})
    (b,) = figures.boundaries(None, r)
    assert b.by_limit and b.error_mib == 514
    assert figures.figures_of(None, r)["boundaryErrorMiB"] == 514


def test_a_boundary_fact_may_say_what_bounded_it() -> None:
    fact = {"limitMiB": 100, "foundMiB": 40, "boundedBy": figures.BOUNDED_BY_DEVICE}
    (b,) = figures.boundaries(None, result({"facts": {"boundary": fact}}))
    assert not b.by_limit

"""A boundary in the reports says what bounded it, so a passing row never reads as a failure.

guarantee-kept's borrower searches until the GPU is full, far below its limit: that distance is what
its neighbours hold, not a fence that failed, and must not be shown or compared as "off by".
"""

from __future__ import annotations

import json
from html import unescape
from pathlib import Path
from typing import Any

import pytest

from conformance.judgements import judge_boundary, within
from reports import figures, html
from reports.model import CheckResult, RunRecord

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


# ----------------------------------------------------------------------------- from recorded results

RECORDED = json.loads((Path(__file__).parent / "data" / "fidelity_results.json").read_text())


def recorded_search(fidelity: str, check: str, name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """A recorded workload's ``alloc-until-oom`` step and its placement (tests/unit/data)."""
    w = RECORDED[fidelity][check]["workloads"][name]
    (found,) = [s for s in w["result"]["steps"] if s["op"] == "alloc-until-oom"]
    return found, w["placed"]


def test_search_steps_say_what_ended_them() -> None:
    assert (
        figures.bounded_by({"stopped_by": "oom", "oom": {"reason": "hard-limit"}}) == figures.BOUNDED_BY_LIMIT
    )
    assert figures.bounded_by({"stopped_by": "oom", "oom": None}) == figures.BOUNDED_BY_LIMIT  # a real GPU
    assert figures.bounded_by({"stopped_by": "pressure"}) == figures.BOUNDED_BY_NEIGHBOUR
    assert figures.bounded_by({"stopped_by": "limit"}) == figures.BOUNDED_BY_CEILING


@pytest.mark.parametrize("fidelity", ["ideal", "h200"])
def test_agent_restart_s_boundaries_from_a_recorded_run_say_what_bounded_them(fidelity: str) -> None:
    capped, placed = recorded_search(fidelity, "agent-restart", "capped")
    kept = judge_boundary(
        within(placed["requestMiB"]) + capped["max_bytes"] // MIB,
        placed["limitMiB"],
        fidelity,
        "capped",
        capped,
    )
    assert kept.ok and kept.as_fact()["boundedBy"] == figures.BOUNDED_BY_LIMIT
    borrower, lent = recorded_search(fidelity, "agent-restart", "borrower")
    grown = judge_boundary(borrower["max_bytes"] // MIB, lent["limitMiB"], fidelity, "borrower", borrower)
    assert grown.as_fact()["boundedBy"] == figures.BOUNDED_BY_DEVICE  # the GPU was full, far below its limit
    assert (
        "not by the limit" in grown.problem
    )  # were it judged as a fence, the verdict says why it is not one

    r = result({"facts": {"boundary": {**kept.as_fact(), "workload": "capped"}}})
    r.id, r.key = "agent-restart", "node/agent-restart"
    (b,) = figures.boundaries(None, r)
    assert b.by_limit and b.within_tolerance is True and b.tolerance_mib == kept.tolerance_mib
    page = html.render_html(record(r))
    assert f"within the tolerance of {kept.tolerance_mib} MiB" in page and "outside the tolerance" not in page

    r = result({"facts": {"boundary": {**grown.as_fact(), "workload": "borrower"}}})
    (b,) = figures.boundaries(None, r)
    assert not b.by_limit and b.within_tolerance is None
    assert "boundaryErrorMiB" not in figures.figures_of(None, r)
    page = html.render_html(record(r))
    cell = page[page.index("borrower: ") :]
    cell = cell[: cell.index("</td>")]
    assert f"bounded by {figures.BOUNDED_BY_DEVICE}, not the limit of {lent['limitMiB']} MiB" in unescape(
        cell
    )
    assert "below it" not in cell and "o-failed" not in cell  # a passing row never reads as a violation


def test_a_search_beyond_the_tolerance_is_said_so() -> None:
    fact = {"limitMiB": 10000, "foundMiB": 8000, "toleranceMiB": 1024, "boundedBy": figures.BOUNDED_BY_LIMIT}
    (b,) = figures.boundaries(None, result({"facts": {"boundary": fact}}))
    assert b.within_tolerance is False
    assert "outside the tolerance of 1024 MiB" in html.render_html(
        record(result({"facts": {"boundary": fact}}))
    )


def record(r: CheckResult) -> RunRecord:
    return RunRecord(run_id="r", started=0.0, finished=1.0, target={}, options={}, results=[r])

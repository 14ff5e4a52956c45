"""The real-GPU judgements (conformance/judgements.py), fed with results recorded in both fidelities.

``data/fidelity_results.json`` holds, per fidelity (``ideal``, ``h200``), the workload results and Pod
outcomes of the node profile's checks from a passing `gpuconf run` against the reference stack
(recorded with ``gpuconf run --fidelity F``): what a correct stack produces. Each judgement must pass
them in both fidelities, and must fail the variations a broken stack would produce.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from conformance import judgements as j
from enforcement.contract import SM_SHARING, TIME_SLICING
from fixtures.suite.scenario import Outcome

MIB = 1 << 20
RECORDED = json.loads((Path(__file__).parent / "data" / "fidelity_results.json").read_text())
FIDELITIES = ("ideal", "h200")


def workload(fidelity: str, check: str, name: str) -> dict[str, Any]:
    return copy.deepcopy(RECORDED[fidelity][check]["workloads"][name])


def outcome(fidelity: str, check: str, name: str) -> Outcome:
    w = workload(fidelity, check, name)
    o = w["outcome"]
    return Outcome(
        name=name,
        phase=o["phase"],
        exit_code=o["exitCode"],
        reason=o["reason"],
        result=w["result"],
        deleted=o["deleted"],
        disruption=o["disruption"],
    )


def step(result: dict[str, Any], op: str) -> dict[str, Any]:
    return [s for s in result["steps"] if s["op"] == op][-1]


def test_the_recordings_are_of_passing_runs_in_both_fidelities() -> None:
    for fidelity in FIDELITIES:
        assert {c["outcome"] for c in RECORDED[fidelity].values()} == {"passed"}
        assert workload(fidelity, "hard-limit-oom", "capped")["result"]["fidelity"] == fidelity


# ---------------------------------------------------------------------------------- the device


def test_device_fidelity_reads_the_result() -> None:
    assert j.device_fidelity(workload("h200", "hard-limit-oom", "capped")["result"]) == "h200"
    assert j.device_fidelity(workload("ideal", "hard-limit-oom", "capped")["result"]) == "ideal"
    assert j.device_fidelity({"simulated": True}) == "ideal"  # a result from before fidelities
    assert j.device_fidelity({"simulated": False, "backend": "cupy"}) == "real"
    assert j.device_fidelity(None) is None


# ---------------------------------------------------------------------------------- the tolerance


def test_one_tolerance_rule() -> None:
    assert j.tolerance_mib(71885, "ideal") == 1
    assert j.tolerance_mib(71885, "h200") == j.tolerance_mib(71885, "real") == 1437  # 2 % of the limit
    assert j.tolerance_mib(20000, "real") == 1024  # at least 1 GiB
    assert j.tolerance_mib(20000, None) == 1024  # an unknown device is judged as a real one


@pytest.mark.parametrize("fidelity", FIDELITIES)
def test_the_recorded_hard_limit_boundary_passes_in_its_fidelity(fidelity: str) -> None:
    capped = workload(fidelity, "hard-limit-oom", "capped")
    found = step(capped["result"], "alloc-until-oom")["max_bytes"] // MIB
    limit = capped["placed"]["limitMiB"]
    verdict = j.judge_boundary(found, limit, j.device_fidelity(capped["result"]))
    assert verdict.ok, verdict.problem
    if fidelity == "ideal":
        assert verdict.gap_mib == 0
    else:  # the context (512 MiB) and one 2 MiB page lie inside the limit
        assert verdict.gap_mib == 514
        assert not j.judge_boundary(found, limit, "ideal").ok  # the exact rule would fail a real GPU


@pytest.mark.parametrize("fidelity", FIDELITIES)
def test_agent_restart_judges_its_boundary_by_the_same_rule(fidelity: str) -> None:
    capped = workload(fidelity, "agent-restart", "capped")
    limit, request = capped["placed"]["limitMiB"], capped["placed"]["requestMiB"]
    found = j.within(request) + step(capped["result"], "alloc-until-oom")["max_bytes"] // MIB
    assert j.judge_boundary(found, limit, fidelity).ok


def test_a_boundary_above_the_limit_always_fails_and_far_below_fails_too() -> None:
    for fidelity in ("ideal", "h200", "real"):
        above = j.judge_boundary(10001, 10000, fidelity)
        assert not above.ok and "above its limit" in above.problem
    assert not j.judge_boundary(8000, 10000, "real").ok
    assert j.judge_boundary(9000, 10000, "real").ok
    assert j.judge_boundary(10000, 10000, "ideal").ok and not j.judge_boundary(9998, 10000, "ideal").ok


def test_headroom_leaves_room_for_the_context_and_pages_and_never_most_of_a_size() -> None:
    assert j.headroom_mib(71885) == 1437
    assert j.headroom_mib(35942) == 1024
    assert j.within(35942) == 34918
    assert j.headroom_mib(1000) == 250  # never more than a quarter
    assert j.headroom_mib(3) == 0


@pytest.mark.parametrize("fidelity", FIDELITIES)
def test_expected_allocations_leave_the_headroom_in_the_recordings(fidelity: str) -> None:
    keeper = workload(fidelity, "guarantee-kept", "keeper")
    held = step(keeper["result"], "alloc")["bytes"] // MIB
    assert held == j.within(keeper["placed"]["requestMiB"])
    # On the simulated H200 the device counted the context too, and still within the guarantee.
    least = min(step(keeper["result"], "heartbeat")["used_min"]) // MIB
    assert held <= least <= keeper["placed"]["requestMiB"]
    if fidelity == "h200":  # its allocation in whole 2 MiB pages, and its 512 MiB context
        assert least == -(-held // 2) * 2 + 512


# ---------------------------------------------------------------------------------- eviction


@pytest.mark.parametrize(("fidelity", "mechanism"), [("ideal", "Eviction API"), ("h200", "CUDA error")])
def test_the_recorded_borrower_was_evicted_whatever_the_mechanism(fidelity: str, mechanism: str) -> None:
    borrower = workload(fidelity, "soft-limit-eviction", "borrower")
    effect = j.eviction_effect(
        outcome(fidelity, "soft-limit-eviction", "borrower"), borrower["placed"]["requestMiB"]
    )
    assert effect.evicted and effect.mechanism == mechanism
    claimant = j.eviction_effect(outcome(fidelity, "soft-limit-eviction", "claimant"))
    assert not claimant.evicted


@pytest.mark.parametrize("fidelity", FIDELITIES)
def test_the_recorded_claimant_waited_a_bounded_time(fidelity: str) -> None:
    claimant = workload(fidelity, "soft-limit-eviction", "claimant")["result"]
    resolved = step(claimant, "alloc")["pressure_resolved"]
    assert resolved["refused_as"] == ("pressure" if fidelity == "ideal" else "oom")
    assert 0 < resolved["waited_s"] < 10


@pytest.mark.parametrize("fidelity", FIDELITIES)
def test_borrowers_without_pressure_and_kept_guarantees_read_as_not_evicted(fidelity: str) -> None:
    for name in ("borrower-0", "borrower-1"):
        assert not j.eviction_effect(outcome(fidelity, "no-eviction-without-pressure", name), 1).evicted
    keeper = outcome(fidelity, "guarantee-kept", "keeper")
    assert not j.eviction_effect(
        keeper, workload(fidelity, "guarantee-kept", "keeper")["placed"]["requestMiB"]
    ).evicted


def test_a_kill_and_reclaimed_memory_read_as_evictions() -> None:
    killed = Outcome("b", "Failed", 137, "Error", None, False, "")
    assert j.eviction_effect(killed).mechanism == "killed"
    kept = outcome("ideal", "no-eviction-without-pressure", "borrower-0")
    result = copy.deepcopy(kept.result)
    assert result is not None
    beat = step(result, "heartbeat")
    request = workload("ideal", "no-eviction-without-pressure", "borrower-0")["placed"]["requestMiB"]
    beat["used_min"] = [request * MIB]  # the device took back what it borrowed, and it ran on
    reclaimed = Outcome("b", "Succeeded", 0, "Completed", result, False, "")
    effect = j.eviction_effect(reclaimed, request)
    assert effect.evicted and effect.mechanism == "memory reclaimed"
    gone = Outcome(
        "b", "Failed", 16, "Error", {"status": "client-gone", "error": {"reason": "evicted"}}, False, ""
    )
    assert j.eviction_effect(gone).mechanism == "detached by the node"


# ---------------------------------------------------------------------------------- compute modes


def figures(fidelity: str) -> dict[str, dict[str, Any]]:
    def compute(name: str) -> dict[str, Any]:
        return step(workload(fidelity, "compute-modes", name)["result"], "compute")

    return {
        TIME_SLICING: j.compare_modes(
            compute("time-slicing-alone"), compute("sliced-0"), compute("sliced-1")
        ),
        SM_SHARING: j.compare_modes(compute("sm-sharing-alone"), compute("shared-0"), compute("shared-1")),
    }


@pytest.mark.parametrize("fidelity", FIDELITIES)
def test_the_recorded_modes_pass_by_throughput_and_in_ideal_by_overlap(fidelity: str) -> None:
    f = figures(fidelity)
    assert j.judge_modes(f, fidelity) == []
    assert j.too_short(f) == []  # the barrier released the neighbours together
    if fidelity == "h200":
        assert all(r <= j.SHARED_OVER_SOLO_TS for r in f[TIME_SLICING]["sharedOverSolo"])
        assert all(r >= j.SHARED_OVER_SOLO_SM for r in f[SM_SHARING]["sharedOverSolo"])
    else:
        assert f[TIME_SLICING]["overlapFraction"] == 0.0 and f[SM_SHARING]["overlapFraction"] > 0.9


def test_the_ideal_device_is_judged_by_overlap_not_by_a_throughput_a_loaded_machine_bends() -> None:
    """Recorded on a loaded machine: each 50 ms kernel's round trip took so long that a lone
    time-slicing workload ran at 0.69 of the device, and beside its neighbour (which took its turns
    in those gaps) at 0.52 of it: 75 % of solo, though the kernels never overlapped."""
    f = figures("ideal")
    f[TIME_SLICING]["sharedOverSolo"] = [0.755, 0.753]
    assert j.judge_modes(f, "ideal") == []
    assert j.judge_modes(f, "h200") != []


def test_calibration_picks_a_kernel_that_does_not_fill_the_simulated_h200() -> None:
    alone = workload("h200", "compute-modes", "sm-sharing-alone")["result"]
    assert j.calibrated_matrix(alone) == 1024
    table = step(alone, "calibrate")["table"]
    assert [r["matrix"] for r in table] == [4096, 2048, 1024]
    assert table[0]["speedup"] < 1.6 <= table[-1]["speedup"]
    # The ideal device has no cost model: the largest kernel never fills it.
    assert j.calibrated_matrix(workload("ideal", "compute-modes", "sm-sharing-alone")["result"]) == 4096


def test_a_kernel_that_fills_the_gpu_would_fail_a_correct_sm_sharing_stack() -> None:
    """Why the calibration matters: with kernels that fill the GPU, two sm-sharing neighbours keep
    about half their solo throughput each, which reads as not running at the same time."""
    f = figures("h200")
    f[SM_SHARING]["sharedOverSolo"] = [0.51, 0.49]
    assert any("sm-sharing neighbours kept only" in p for p in j.judge_modes(f, "h200"))


def test_modes_that_do_not_take_turns_or_do_not_overlap_fail() -> None:
    f = figures("h200")
    f[TIME_SLICING]["sharedOverSolo"] = [0.95, 0.97]
    assert any("did not take turns" in p for p in j.judge_modes(f, "h200"))
    f = figures("ideal")
    f[TIME_SLICING]["overlapFraction"] = 0.6
    assert any("overlapped for 60%" in p for p in j.judge_modes(f, "ideal"))
    f = figures("ideal")
    f[SM_SHARING]["overlapFraction"] = 0.0
    assert any("did not run at the same time" in p for p in j.judge_modes(f, "ideal"))
    f = figures("h200")
    f[TIME_SLICING]["overlapFraction"] = 0.6  # spans overlap on a real GPU: never judged there
    assert j.judge_modes(f, "h200") == []


def test_the_barrier_window_and_a_short_one() -> None:
    for fidelity in FIDELITIES:
        a = step(workload(fidelity, "compute-modes", "shared-0")["result"], "compute")
        b = step(workload(fidelity, "compute-modes", "shared-1")["result"], "compute")
        _start, _end, both = j.shared_window(a, b)
        assert both > 1.0
    late = dict(b, t0=b["t0"] + 1.4, t_end=b["t_end"] + 1.4)
    assert j.shared_window(a, late)[2] < j.MIN_SHARED_S
    apart: dict[str, dict[str, Any]] = {
        TIME_SLICING: {"sharedSeconds": 1.4},
        SM_SHARING: {"sharedSeconds": 0.2},
    }
    assert j.too_short(apart) == [SM_SHARING]


def test_kernel_rates_over_several_steps() -> None:
    steps = [{"t0": 0.0, "t_end": 1.0, "kernels": 10}, {"t0": 0.5, "t_end": 2.0, "kernels": 20}]
    assert j.kernel_rates(steps) == 15.0
    assert j.kernel_rates([]) == 0.0


def test_kept_bytes_wants_every_written_byte_read_back_as_written() -> None:
    whole = {"op": "verify", "outcome": "ok", "bytes": 256 * j.MiB, "mismatched": 0, "bad": []}
    assert j.kept_bytes("n", 256, whole) == ""
    scrubbed = {
        "op": "verify",
        "outcome": "corrupted",
        "bytes": 256 * j.MiB,
        "mismatched": 64 * j.MiB,
        "bad": [{"label": "", "device": 0, "bytes": 256 * j.MiB, "mismatched": 64 * j.MiB}],
    }
    assert "read back 64.0 MiB of the 256 MiB it wrote differently" in j.kept_bytes("n", 256, scrubbed)
    assert "64.0 of 256 MiB on device 0" in j.kept_bytes("n", 256, scrubbed)
    assert "never read back" in j.kept_bytes("n", 256, {})
    assert "could not read back" in j.kept_bytes("n", 256, {"outcome": "gone", "message": "evicted"})
    assert "only 128 MiB" in j.kept_bytes("n", 256, {**whole, "bytes": 128 * j.MiB})


def test_searches_by_device_keeps_each_devices_own_search() -> None:
    result = {
        "steps": [
            {"op": "alloc-until-oom", "device": 0, "max_bytes": 1},
            {"op": "meminfo"},
            {"op": "alloc-until-oom", "device": 1, "max_bytes": 2},
        ]
    }
    got = j.searches_by_device(result)
    assert sorted(got) == [0, 1] and got[1]["max_bytes"] == 2
    assert j.searches_by_device(None) == {} and j.searches_by_device({"steps": [{"op": "touch"}]}) == {}


def test_the_limit_bounds_what_the_device_counts_its_context_included() -> None:
    # Simulated H200, reference: the search stops 514 MiB short, the context inside the limit.
    kept = j.judge_charged("c", {"i": 0, "total": 1000 * MIB, "used": 1000 * MIB}, 1000, 486)
    assert kept.problem == "" and kept.not_judged == "" and kept.as_fact()["outsideLimitMiB"] == 0
    # Context outside the limit: the allocations reach the limit, the device counts 512 MiB more.
    outside = j.judge_charged("c", {"i": 0, "total": 1000 * MIB, "used": 1512 * MIB}, 1000, 1000)
    assert "1512 MiB" in outside.problem and "512 MiB above its limit of 1000 MiB" in outside.problem
    assert outside.as_fact()["outsideLimitMiB"] == 512
    # A view whose total is the whole GPU is not the container's own: not judged, and said.
    whole = j.judge_charged("c", {"i": 0, "total": 143771 * MIB, "used": 9000 * MIB}, 1000, 900)
    assert whole.problem == "" and "not the container's own" in whole.not_judged
    assert "no memory view" in j.judge_charged("c", None, 1000, 900).not_judged


def test_a_search_that_held_more_than_the_device_total_is_named_with_its_figures() -> None:
    step = {"op": "alloc-until-oom", "stopped_by": "above-total", "max_bytes": 1001 * MIB, "allocs": 600}
    said = j.search_overran("c", {**step, "device_total": 1000 * MIB}, 1000)
    assert "alloc-until-oom step held 1001 MiB in 600 allocations" in said and "total of 1000 MiB" in said
    assert j.search_overran("c", {"stopped_by": "oom", "max_bytes": 1000 * MIB}, 1000) == ""


# ---------------------------------------------------------------------------------- pressure shown first


def ran(name: str, *steps: dict[str, Any], status: str = "ok") -> Outcome:
    return Outcome(name, "Succeeded", 0, "Completed", {"status": status, "steps": list(steps)}, False, "")


def test_what_a_borrower_held_when_ready_is_the_devices_count_else_its_allocations() -> None:
    counted = ran(
        "b",
        {"op": "alloc", "bytes": 100 * MIB},
        {"op": "alloc-until-oom", "max_bytes": 300 * MIB},
        {"op": "meminfo", "devices": [{"i": 0, "used": 412 * MIB, "free": 0}]},
        {"op": "ready"},
        {"op": "meminfo", "devices": [{"i": 0, "used": 0, "free": 0}]},  # after Ready: not counted
    )
    assert j.held_when_ready(counted) == 412
    summed = ran(
        "b", {"op": "alloc", "bytes": 100 * MIB}, {"op": "alloc", "bytes": 50 * MIB}, {"op": "ready"}
    )
    assert j.held_when_ready(summed) == 150
    never_ready = ran("b", {"op": "alloc", "bytes": 100 * MIB})
    assert j.held_when_ready(never_ready) is None
    killed = Outcome("b", "Failed", 137, "Error", None, False, "")
    assert j.held_when_ready(killed) is None
    assert j.held_when_ready(killed, 300) == 300  # what its plan holds once it was seen Ready


def test_a_claimant_lacked_memory_when_refused_at_first_or_shown_too_little_free() -> None:
    refused = ran(
        "c",
        {"op": "meminfo", "devices": [{"i": 0, "used": 0, "free": 512 * MIB}]},
        {
            "op": "alloc",
            "outcome": "ok",
            "ms": 420.0,
            "pressure_resolved": {"attempts": 9, "refused_as": "pressure"},
        },
    )
    figures = j.claim_figures(refused, 400)
    assert figures["lacked"] and figures["refusedAtFirstAs"] == "pressure" and figures["attempts"] == 9
    never_granted = ran("c", {"op": "alloc", "outcome": "oom"}, status="unexpected-oom")
    assert j.claim_figures(never_granted, 400)["refusedAtFirstAs"] == "oom"
    blocked = ran(  # a GPU that blocks the allocation until memory is there: the free memory shows it
        "c",
        {"op": "meminfo", "devices": [{"i": 0, "used": 0, "free": 10 * MIB}]},
        {"op": "alloc", "outcome": "ok", "ms": 900.0},
    )
    assert j.claim_figures(blocked, 400)["lacked"]
    granted = ran(
        "c",
        {"op": "meminfo", "devices": [{"i": 0, "used": 0, "free": 512 * MIB}]},
        {"op": "alloc", "outcome": "ok", "ms": 1.0},
    )
    assert not j.claim_figures(granted, 400)["lacked"]


def test_pressure_is_shown_only_with_borrowers_above_their_request_and_a_claimant_short() -> None:
    short = {"askedMiB": 400, "freeBeforeMiB": 0, "refusedAtFirstAs": "pressure", "lacked": True}
    shown = j.judge_pressure({"b0": (460, 256), "b1": (560, 256)}, "c", short)
    assert shown.shown and not shown.missing
    assert shown.as_fact()["borrowers"]["b1"]["aboveRequestMiB"] == 304
    within = j.judge_pressure({"b0": (256, 256), "b1": (None, 256)}, "c", short)
    assert not within.shown
    assert "b0 held 256 MiB, not more than its request of 256 MiB" in within.missing
    assert any("b1 left no figures" in m for m in within.missing)
    plenty = dict(short, lacked=False, refusedAtFirstAs=None, freeBeforeMiB=900)
    granted = j.judge_pressure({"b0": (460, 256)}, "c", plenty)
    assert not granted.shown and "never lacked memory" in granted.missing[0]
    assert granted.as_fact()["claimant"]["freeBeforeMiB"] == 900


def test_no_more_borrowers_are_evicted_than_the_shortfall_requires() -> None:
    # Each of two borrowers alone covers a claim of 300 MiB on a full GPU: evicting both is one too many.
    assert j.needless_evictions({"b1": 550}, 0, 300) == []
    assert j.needless_evictions({"b0": 450}, 0, 300) == []
    assert j.needless_evictions({"b0": 450, "b1": 550}, 0, 300) == ["b0", "b1"]
    # Two needed together: neither alone covers 700 MiB.
    assert j.needless_evictions({"b0": 450, "b1": 550}, 0, 700) == []
    # Free memory counts: with 200 MiB free, 180 more were needed; b0 (450) was enough, b2 (160) was not.
    assert j.needless_evictions({"b0": 450, "b2": 160}, 200, 380) == ["b2"]


# ---- nvidia-smi's used memory


def _gpu(index: int, used_mib: int) -> dict[str, Any]:
    return {"index": index, "uuid": f"GPU-{index}", "total_mib": 43000, "used_mib": used_mib}


@pytest.mark.parametrize(("fidelity", "context_mib"), [("ideal", 0), ("h200", 512), ("real", 600)])
def test_smi_usage_passes_its_own_allocation_with_a_context(fidelity: str, context_mib: int) -> None:
    listed = [_gpu(0, 14000 + context_mib), _gpu(1, context_mib)]
    assert j.judge_smi_usage("single", listed, {0: 14000}, {0: 28000, 1: 28000}, 43000, fidelity) == []


def test_smi_usage_that_counts_the_neighbour_fails_naming_both_figures() -> None:
    problems = j.judge_smi_usage("single", [_gpu(0, 42512)], {0: 14000}, {0: 28000}, 43000, "h200")
    assert len(problems) == 1
    assert "42512 MiB used" in problems[0] and "14000 MiB" in problems[0]
    assert "a neighbour holds 28000 MiB" in problems[0]


def test_smi_usage_below_its_own_allocation_fails() -> None:
    problems = j.judge_smi_usage("single", [_gpu(0, 0)], {0: 14000}, {}, 43000, "ideal")
    assert problems and "its own memory is not counted" in problems[0]


def test_smi_usage_above_the_tolerance_without_a_neighbour_names_no_neighbour() -> None:
    problems = j.judge_smi_usage("single", [_gpu(0, 16000)], {0: 14000}, {}, 43000, "h200")
    assert problems and "neighbour" not in problems[0]


# ---- nvidia-smi's view: listing, total and used, one judgement (the suite's and the probe's)


def test_smi_view_passes_the_assigned_gpu_with_its_limit_and_its_own_usage() -> None:
    assert (
        j.judge_smi_view("c", [_gpu(0, 14000)], ["GPU-0"], ["GPU-0"], 43000, {0: 14000}, {0: 28000}, "ideal")
        == []
    )


def test_smi_view_names_each_way_it_is_wrong() -> None:
    whole = [{**_gpu(0, 42000), "total_mib": 143771}, {**_gpu(1, 0), "total_mib": 143771}]
    problems = j.judge_smi_view(
        "c", whole, ["GPU-0", "GPU-1"], ["GPU-0"], 43000, {0: 14000}, {0: 28000}, "ideal"
    )
    assert len(problems) == 3
    assert "lists GPU-0, GPU-1, but it was assigned GPU-0" in problems[0]
    assert "memory.total 143771 MiB on GPU-0, 143771 MiB on GPU-1" in problems[1] and "43000" in problems[1]
    assert "its memory is counted as the container's" in problems[2]
    # The total is exact (the shim reports the limit), where used has the tolerance.
    off = [{**_gpu(0, 14000), "total_mib": 42999}]
    assert j.judge_smi_view("c", off, ["GPU-0"], ["GPU-0"], 43000, {0: 14000}, {}, "h200") != []
    assert j.judge_smi_view("c", [], [], ["GPU-0"], 43000, {0: 14000}, {}, "ideal")[0].startswith(
        "c: nvidia-smi lists no GPU"
    )


# ---- no-eviction-without-pressure's figures of the full GPU


def test_fill_figures_sum_what_each_borrower_held_and_say_what_is_left() -> None:
    from conformance.test_eviction import fill_figures

    def held(name: str, used_mib: int, free_mib: int) -> Outcome:
        meminfo = {"op": "meminfo", "devices": [{"used": used_mib * MIB, "free": free_mib * MIB}]}
        return Outcome(name, "Succeeded", 0, "Completed", {"fidelity": "h200", "steps": [meminfo]}, False, "")

    figures = fill_figures(143771, [held("b0", 71373, 512), held("b1", 71371, 1027)], 71885)
    assert figures["deviceUsedMiB"] == 142744 and figures["deviceFreeMiB"] == 1027
    assert figures["headroomMiB"] == 1437 and figures["fidelity"] == "h200"
    # Their limits leave 1 MiB of the GPU, and each its headroom: 2875 MiB free is still full.
    assert figures["fullWithinMiB"] == 2875 and figures["full"] is True
    assert figures["freeSeenMiB"] == {"b0": 512, "b1": 1027}
    assert fill_figures(143771, [held("b0", 70000, 0), held("b1", 70000, 0)], 71885)["full"] is False
    nothing = Outcome("b2", "Failed", 137, "Error", None, False, "")
    half = fill_figures(143771, [held("b0", 71373, 512), nothing], 71885)
    assert half["deviceFreeMiB"] is None and half["full"] is None

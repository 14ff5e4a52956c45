"""The simulated device's semantics, in process: memory ledger, pressure, modes, faults, ownership.

Process-level behaviour (sockets, tokens, dying clients, several client processes) is covered in
test_sim_server.py; here each rule is pinned down directly on ``SimNode``, where a failure points
at the rule and not at the transport.
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from enforcement.clock import REAL, ManualClock
from enforcement.sim.admin import client_spec
from enforcement.sim.messages import ClientGpuSpec, ClientSpec
from enforcement.sim.model import Context, SimNode
from enforcement.sim.topology import make_gpus
from workloads.simwire import (
    OOM_DEVICE_FULL,
    OOM_GUARANTEE_UNSATISFIABLE,
    OOM_HARD_LIMIT,
    KernelReply,
    MiB,
    SimBadRequest,
    SimDenied,
    SimFault,
    SimGone,
    SimModeConflict,
    SimOutOfMemory,
    SimPressure,
)


def make_node(*mib: int, ttl: float = 30.0, clock: ManualClock | None = None) -> SimNode:
    """A node on the real clock (its kernels run in threads here), or on ``clock`` where a test moves
    time itself (the pressure's time to live)."""
    return SimNode(
        "node-a", make_gpus("node-a", list(mib or (1024,))), pressure_ttl_s=ttl, clock=clock or REAL
    )


def join(
    node: SimNode,
    name: str,
    guarantee: int,
    hard: int | None = None,
    gpus: tuple[str, ...] = ("0",),
    mode: str = "time-slicing",
) -> Context:
    token = node.attach(client_spec(name, list(gpus), guarantee, hard, mode)).token
    ctx, _hello = node.open_context(token)
    return ctx


def used(node: SimNode, name: str, ordinal: int = 0) -> int:
    client = next(c for c in node.snapshot().clients if c.name == name)
    return client.gpus[ordinal].used_bytes


# ---- hard limit


def test_allocation_up_to_the_exact_hard_limit_succeeds_and_one_byte_more_fails() -> None:
    node = make_node(1024)
    ctx = join(node, "a", 256, 512)
    node.alloc(ctx, 0, 512 * MiB - 1)
    node.alloc(ctx, 0, 1)
    with pytest.raises(SimOutOfMemory) as exc:
        node.alloc(ctx, 0, 1)
    reply = exc.value.reply
    assert reply.reason == OOM_HARD_LIMIT
    assert (reply.requested_bytes, reply.used_bytes, reply.limit_bytes) == (1, 512 * MiB, 512 * MiB)
    assert "hard limit" in reply.message and "simulated" in reply.message


def test_hard_limit_applies_even_when_the_gpu_is_empty() -> None:
    node = make_node(81920)
    ctx = join(node, "a", 1024, 2048)
    with pytest.raises(SimOutOfMemory) as exc:
        node.alloc(ctx, 0, 2048 * MiB + 1)
    assert exc.value.reply.reason == OOM_HARD_LIMIT
    assert used(node, "a") == 0


def test_hard_limits_are_per_device() -> None:
    node = make_node(1024, 1024)
    ctx = join(node, "a", 100, 200, gpus=("0", "1"))
    node.alloc(ctx, 0, 200 * MiB)
    node.alloc(ctx, 1, 200 * MiB)
    with pytest.raises(SimOutOfMemory):
        node.alloc(ctx, 1, MiB)


# ---- guarantee, borrowing, pressure


def test_a_client_beyond_its_guarantee_cannot_take_more_than_the_gpu_has_free() -> None:
    node = make_node(1024)
    a = join(node, "a", 512, 1024)
    b = join(node, "b", 256, 1024)
    node.alloc(a, 0, 512 * MiB)
    node.alloc(b, 0, 256 * MiB)
    with pytest.raises(SimOutOfMemory) as exc:
        node.alloc(b, 0, 257 * MiB)  # borrowing 257 MiB; 256 MiB free
    assert exc.value.reply.reason == OOM_DEVICE_FULL
    node.alloc(b, 0, 256 * MiB)  # exactly what is free: granted


def test_borrowing_between_guarantee_and_limit_is_kept_while_there_is_no_pressure() -> None:
    node = make_node(1024)
    a = join(node, "a", 256, 768)
    node.alloc(a, 0, 768 * MiB)
    join(node, "b", 256, 256)  # a neighbour that asks for nothing
    (gpu,) = node.pressure()
    assert not gpu.under_pressure
    assert [c.client for c in gpu.candidates] == ["a"]  # evictable in principle, not now
    assert gpu.candidates[0].overage_bytes == 512 * MiB
    assert used(node, "a") == 768 * MiB


def fill_for_pressure(node: SimNode) -> dict[str, Context]:
    """1024 MiB GPU: a over by 272, b over by 372, c within its guarantee; 24 MiB free."""
    ctxs = {
        "a": join(node, "a", 128, 1024),
        "b": join(node, "b", 128, 1024),
        "c": join(node, "c", 200, 1024),
        "d": join(node, "d", 200, 200),
    }
    node.alloc(ctxs["a"], 0, 400 * MiB)
    node.alloc(ctxs["b"], 0, 500 * MiB)
    node.alloc(ctxs["c"], 0, 100 * MiB)
    return ctxs


def test_pressure_names_the_clients_above_their_guarantee_largest_overage_first() -> None:
    node = make_node(1024)
    ctxs = fill_for_pressure(node)
    with pytest.raises(SimPressure) as exc:
        node.alloc(ctxs["d"], 0, 100 * MiB)
    reply = exc.value.reply
    assert reply.candidates == ("b", "a")
    assert reply.shortfall_bytes == 76 * MiB
    assert (reply.requested_bytes, reply.guarantee_bytes) == (100 * MiB, 200 * MiB)
    (gpu,) = node.pressure()
    assert gpu.under_pressure
    assert gpu.shortfall_bytes == 76 * MiB
    assert [(w.client, w.needed_bytes) for w in gpu.waiting] == [("d", 100 * MiB)]
    assert [(c.client, c.overage_bytes) for c in gpu.candidates] == [("b", 372 * MiB), ("a", 272 * MiB)]


def test_a_client_within_or_exactly_at_its_guarantee_is_never_a_candidate() -> None:
    node = make_node(1024)
    a, b = join(node, "a", 128, 1024), join(node, "b", 128, 1024)
    at, under = join(node, "at", 100, 1024), join(node, "under", 200, 1024)
    node.alloc(a, 0, 400 * MiB)
    node.alloc(b, 0, 474 * MiB)
    node.alloc(at, 0, 100 * MiB)  # exactly at its guarantee
    node.alloc(under, 0, 50 * MiB)  # GPU now full
    with pytest.raises(SimPressure) as exc:
        node.alloc(under, 0, 100 * MiB)
    assert exc.value.reply.candidates == ("b", "a")
    assert [c.client for c in node.pressure()[0].candidates] == ["b", "a"]


def test_candidate_order_breaks_ties_by_name() -> None:
    node = make_node(1000)
    z = join(node, "z", 100, 1000)
    y = join(node, "y", 100, 1000)
    w = join(node, "w", 200, 200)
    node.alloc(z, 0, 450 * MiB)
    node.alloc(y, 0, 450 * MiB)
    with pytest.raises(SimPressure) as exc:
        node.alloc(w, 0, 200 * MiB)
    assert exc.value.reply.candidates == ("y", "z")


def test_after_eviction_the_waiting_client_gets_its_memory_and_borrowers_cannot_take_it_first() -> None:
    node = make_node(1024)
    ctxs = fill_for_pressure(node)
    with pytest.raises(SimPressure):
        node.alloc(ctxs["d"], 0, 100 * MiB)
    released = node.evict("b").released_bytes
    assert released == 500 * MiB
    # 524 MiB free now, 100 of it owed to d: a borrower may take 424 at most.
    with pytest.raises(SimOutOfMemory) as exc:
        node.alloc(ctxs["a"], 0, 425 * MiB)
    assert exc.value.reply.reason == OOM_DEVICE_FULL
    node.alloc(ctxs["a"], 0, 424 * MiB)
    node.alloc(ctxs["d"], 0, 100 * MiB)  # the retry succeeds
    (gpu,) = node.pressure()
    assert not gpu.under_pressure and gpu.waiting == ()


def test_a_pressure_wait_lapses_when_the_client_stops_retrying() -> None:
    clock = ManualClock()
    node = make_node(1024, ttl=5.0, clock=clock)
    ctxs = fill_for_pressure(node)
    with pytest.raises(SimPressure):
        node.alloc(ctxs["d"], 0, 100 * MiB)
    clock.advance(4.0)
    with pytest.raises(SimPressure):
        node.alloc(ctxs["d"], 0, 100 * MiB)  # a retry refreshes the wait
    clock.advance(4.0)
    assert node.pressure()[0].under_pressure
    assert node.pressure()[0].waiting[0].waiting_s == pytest.approx(8.0)
    clock.advance(5.1)
    assert not node.pressure()[0].under_pressure


def test_within_guarantee_on_a_full_gpu_without_candidates_is_an_oom_naming_overcommit() -> None:
    node = make_node(1024)
    a = join(node, "a", 800, 800)
    b = join(node, "b", 800, 800)  # the guarantees add up to 1600 MiB on a 1024 MiB GPU
    node.alloc(a, 0, 800 * MiB)
    with pytest.raises(SimOutOfMemory) as exc:
        node.alloc(b, 0, 300 * MiB)
    assert exc.value.reply.reason == OOM_GUARANTEE_UNSATISFIABLE
    assert not node.pressure()[0].under_pressure
    snap = node.snapshot().gpus[0]
    assert snap.guaranteed_bytes == 1600 * MiB > snap.capacity_bytes


def test_an_allocation_that_crosses_the_guarantee_on_a_full_gpu_is_an_oom_not_pressure() -> None:
    node = make_node(1024)
    ctxs = fill_for_pressure(node)
    with pytest.raises(SimOutOfMemory) as exc:
        node.alloc(ctxs["c"], 0, 150 * MiB)  # c holds 100 of its 200: 150 more would borrow 50
    assert exc.value.reply.reason == OOM_DEVICE_FULL


# ---- compute modes


def test_a_gpu_with_time_slicing_clients_refuses_an_sm_sharing_client_naming_both() -> None:
    node = make_node(1024, 1024)
    join(node, "ns/ts/c", 100, gpus=("0",), mode="time-slicing")
    with pytest.raises(SimModeConflict) as exc:
        node.attach(client_spec("ns/sm/c", ["1", "0"], 100, mode="sm-sharing"))
    reply = exc.value.reply
    assert (reply.client, reply.mode, reply.other_client, reply.other_mode) == (
        "ns/sm/c",
        "sm-sharing",
        "ns/ts/c",
        "time-slicing",
    )
    assert "ns/sm/c" in reply.message and "ns/ts/c" in reply.message
    assert all(c.name != "ns/sm/c" for c in node.snapshot().clients)  # nothing half-attached
    node.attach(client_spec("ns/sm/c", ["1"], 100, mode="sm-sharing"))  # another GPU: fine


def test_and_vice_versa() -> None:
    node = make_node(1024)
    join(node, "sm", 100, mode="sm-sharing")
    with pytest.raises(SimModeConflict) as exc:
        node.attach(client_spec("ts", ["0"], 100, mode="time-slicing"))
    assert (exc.value.reply.other_client, exc.value.reply.other_mode) == ("sm", "sm-sharing")


def test_a_gpu_forgets_its_mode_when_its_last_client_leaves() -> None:
    node = make_node(1024)
    join(node, "ts", 100)
    node.detach("ts")
    assert node.snapshot().gpus[0].mode is None
    join(node, "sm", 100, mode="sm-sharing")


def _kernels_in_threads(node: SimNode, ctxs: list[Context], seconds: float, count: int) -> list[list[tuple]]:
    spans: list[list[tuple]] = [[] for _ in ctxs]
    barrier = threading.Barrier(len(ctxs))

    def work(i: int) -> None:
        barrier.wait()
        for _ in range(count):
            r = node.kernel(ctxs[i], 0, seconds)
            spans[i].append((r.start, r.end))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(ctxs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return spans


def overlap(a: list[tuple], b: list[tuple]) -> float:
    return sum(max(0.0, min(e1, e2) - max(s1, s2)) for s1, e1 in a for s2, e2 in b)


def test_time_slicing_kernels_of_neighbours_never_overlap() -> None:
    node = make_node(1024)
    a, b = join(node, "a", 100), join(node, "b", 100)
    sa, sb = _kernels_in_threads(node, [a, b], 0.03, 5)
    assert len(sa) == len(sb) == 5
    assert overlap(sa, sb) == 0.0


def test_sm_sharing_kernels_of_neighbours_run_concurrently() -> None:
    node = make_node(1024)
    a, b = join(node, "a", 100, mode="sm-sharing"), join(node, "b", 100, mode="sm-sharing")
    sa, sb = _kernels_in_threads(node, [a, b], 0.1, 3)
    # Each ran 0.3 s; concurrently they overlap almost entirely. A wide margin for a loaded machine.
    assert overlap(sa, sb) > 0.1


def test_time_slicing_hands_out_turns_in_arrival_order() -> None:
    node = make_node(1024)
    a, b = join(node, "a", 100), join(node, "b", 100)
    sa, sb = _kernels_in_threads(node, [a, b], 0.03, 6)
    merged = sorted([(s, "a") for s, _ in sa] + [(s, "b") for s, _ in sb])
    switches = sum(1 for i in range(1, len(merged)) if merged[i][1] != merged[i - 1][1])
    # Strict FIFO alternates (11 switches); a loaded machine may delay a thread's next request past
    # its neighbour's turn. Starvation would show as a single switch.
    assert switches >= 3, merged


# ---- faults


def test_a_fault_in_time_slicing_hits_only_the_faulting_client_and_is_sticky() -> None:
    node = make_node(1024)
    a, b = join(node, "a", 100), join(node, "b", 100)
    node.alloc(a, 0, MiB)
    with pytest.raises(SimFault) as exc:
        node.fault(a, 0)
    assert exc.value.reply.origin == "a"
    for call in (lambda: node.alloc(a, 0, MiB), lambda: node.meminfo(a), lambda: node.free(a, 1)):
        with pytest.raises(SimFault):
            call()
    node.alloc(b, 0, MiB)  # the neighbour is untouched
    node.kernel(b, 0, 0.001)


def test_a_fault_in_sm_sharing_fails_every_sm_sharing_client_of_that_gpu_only() -> None:
    node = make_node(1024, 1024)
    a = join(node, "a", 100, mode="sm-sharing")
    b = join(node, "b", 100, mode="sm-sharing")
    other = join(node, "other", 100, gpus=("1",), mode="sm-sharing")
    with pytest.raises(SimFault):
        node.fault(a, 0)
    with pytest.raises(SimFault) as exc:
        node.alloc(b, 0, MiB)
    assert exc.value.reply.origin == "a"
    assert "illegal memory access" in exc.value.reply.message
    node.alloc(other, 0, MiB)
    assert {c.name: c.faulted for c in node.snapshot().clients} == {"a": True, "b": True, "other": False}


def _span(reply: KernelReply) -> tuple[float, float]:
    return reply.start, reply.end


def test_time_slicing_clients_in_the_shared_fault_domain_fall_together_and_still_take_turns() -> None:
    node = make_node(1024, 1024)

    def shared(name: str, gpu: str = "0") -> Context:
        spec = replace(client_spec(name, [gpu], 100), shared_fault_domain=True)
        ctx, _hello = node.open_context(node.attach(spec).token)
        return ctx

    a, b, other = shared("a"), shared("b"), shared("other", "1")
    isolated = join(node, "isolated", 100)
    spans: list[tuple[float, float]] = []
    runs = [threading.Thread(target=lambda c=c: spans.append(_span(node.kernel(c, 0, 0.05)))) for c in (a, b)]
    for t in runs:
        t.start()
    for t in runs:
        t.join(10)
    (s1, e1), (s2, e2) = sorted(spans)
    assert e1 <= s2, "time-slicing kernels still run one at a time"
    with pytest.raises(SimFault) as exc:
        node.fault(a, 0)
    assert "shared fault domain" in exc.value.reply.message
    with pytest.raises(SimFault):
        node.alloc(b, 0, MiB)
    node.alloc(isolated, 0, MiB)  # a client of its own fault domain on that GPU is untouched
    node.alloc(other, 0, MiB)  # and so is the shared domain of another GPU
    faulted = {c.name: c.faulted for c in node.snapshot().clients}
    assert faulted == {"a": True, "b": True, "isolated": False, "other": False}
    assert {c.mode for c in node.snapshot().clients} == {"time-slicing"}


def test_a_kernel_running_when_its_sm_sharing_neighbour_faults_fails_at_once() -> None:
    node = make_node(1024)
    a = join(node, "a", 100, mode="sm-sharing")
    b = join(node, "b", 100, mode="sm-sharing")
    outcome: list[BaseException] = []
    started = threading.Event()

    def long_kernel() -> None:
        started.set()
        try:
            node.kernel(b, 0, 30.0)
        except BaseException as exc:  # noqa: BLE001 - recorded for the assertion
            outcome.append(exc)

    t = threading.Thread(target=long_kernel)
    t0 = time.monotonic()
    t.start()
    started.wait(10)
    with pytest.raises(SimFault):
        node.fault(a, 0)
    t.join(20)
    assert not t.is_alive()
    assert isinstance(outcome[0], SimFault)
    assert time.monotonic() - t0 < 20


# ---- ownership, detach, tokens


def test_closing_a_context_releases_exactly_what_it_allocated() -> None:
    node = make_node(1024)
    token = node.attach(client_spec("a", ["0"], 512)).token
    one, _ = node.open_context(token)
    two, _ = node.open_context(token)
    node.alloc(one, 0, 100 * MiB)
    node.alloc(two, 0, 50 * MiB)
    assert node.close_context(one) == 100 * MiB
    assert used(node, "a") == 50 * MiB
    assert node.snapshot().gpus[0].used_bytes == 50 * MiB
    assert node.close_context(one) == 0  # idempotent


def test_memory_reads_back_what_its_owner_wrote_and_nothing_else() -> None:
    node = make_node(1024)
    a = join(node, "a", 256)
    handle = node.alloc(a, 0, 100 * MiB).handle
    assert node.verify(a, handle, 0x37).mismatched_bytes == 100 * MiB  # never written
    node.touch(a, handle, 0x37)
    assert node.verify(a, handle, 0x37).mismatched_bytes == 0
    assert node.verify(a, handle, 0x38).mismatched_bytes == 100 * MiB


def test_a_neighbours_overrun_leaves_its_memory_intact() -> None:
    node = make_node(1024)
    held, capped = join(node, "held", 256), join(node, "capped", 128, 256)
    handle = node.alloc(held, 0, 200 * MiB).handle
    node.touch(held, handle, 0x5A)
    with pytest.raises(SimOutOfMemory):
        node.alloc(capped, 0, 300 * MiB)
    assert node.verify(held, handle, 0x5A).mismatched_bytes == 0


def test_an_unprotected_client_s_overrun_scrubs_its_neighbours_memory() -> None:
    node = make_node(1024)
    held = join(node, "held", 256)
    token = node.attach(replace(client_spec("capped", ["0"], 128, 256), unprotected_memory=True)).token
    capped, _ = node.open_context(token)
    handle = node.alloc(held, 0, 200 * MiB).handle
    node.touch(held, handle, 0x5A)
    with pytest.raises(SimOutOfMemory):  # the allocation is still refused ...
        node.alloc(capped, 0, 300 * MiB)
    # ... but the pages it asked for were taken from the neighbour: they read zero now.
    assert node.verify(held, handle, 0x5A).mismatched_bytes == 200 * MiB
    assert node.verify(held, handle, 0).mismatched_bytes == 0
    assert used(node, "held") == 200 * MiB  # a usage counter does not show it


def test_handles_belong_to_their_context_so_a_client_cannot_free_anothers_memory() -> None:
    node = make_node(1024)
    a, b = join(node, "a", 256), join(node, "b", 256)
    handle = node.alloc(a, 0, 100 * MiB).handle
    with pytest.raises(SimBadRequest):
        node.free(b, handle)
    with pytest.raises(SimBadRequest):
        node.touch(b, handle)
    assert used(node, "a") == 100 * MiB
    node.free(a, handle)
    assert used(node, "a") == 0


def test_detach_releases_all_memory_and_later_calls_say_why() -> None:
    node = make_node(1024)
    token = node.attach(client_spec("a", ["0"], 512)).token
    ctx, _ = node.open_context(token)
    node.alloc(ctx, 0, 300 * MiB)
    reply = node.evict("a")
    assert (reply.reason, reply.released_bytes) == ("evicted", 300 * MiB)
    assert node.snapshot().gpus[0].used_bytes == 0
    with pytest.raises(SimGone) as exc:
        node.meminfo(ctx)
    assert exc.value.reply.reason == "evicted"
    with pytest.raises(SimGone):
        node.open_context(token)
    with pytest.raises(SimDenied):
        node.open_context("0" * 32)
    with pytest.raises(SimBadRequest):
        node.detach("a")


def test_meminfo_shows_the_hard_limit_as_total_and_own_usage_as_used() -> None:
    node = make_node(81920, 81920)
    ctx = join(node, "a", 20480, 40960, gpus=("1", "0"))
    other = join(node, "b", 1024, gpus=("0",))
    node.alloc(other, 0, 1024 * MiB)
    node.alloc(ctx, 1, 1000 * MiB)  # ordinal 1 is node GPU 0
    devices = node.meminfo(ctx).devices
    assert [(d.ordinal, d.uuid) for d in devices] == [(0, node.gpus[1].uuid), (1, node.gpus[0].uuid)]
    assert [(d.total_bytes, d.used_bytes, d.free_bytes) for d in devices] == [
        (40960 * MiB, 0, 40960 * MiB),
        (40960 * MiB, 1000 * MiB, 39960 * MiB),
    ]


def test_a_device_usage_view_shows_nvml_readers_the_whole_gpu_s_usage_and_cuda_its_own() -> None:
    # The seeded agent fault smi-device-used: only the NVML reader (nvidia-smi, no CUDA context) is
    # shown the neighbour's memory; cudaMemGetInfo keeps the client's own figures.
    node = make_node(4096)
    neighbour_token = node.attach(client_spec("b", ["0"], 1024)).token
    other, _ = node.open_context(neighbour_token)
    node.alloc(other, 0, 1024 * MiB)
    token = node.attach(replace(client_spec("a", ["0"], 1024, 2048), device_usage_view=True)).token
    cuda, _ = node.open_context(token)
    node.alloc(cuda, 0, 100 * MiB)
    nvml, _ = node.open_context(token, cuda=False)
    seen = node.meminfo(nvml).devices[0]
    assert (seen.total_bytes, seen.used_bytes, seen.free_bytes) == (2048 * MiB, 1124 * MiB, 924 * MiB)
    own = node.meminfo(cuda).devices[0]
    assert (own.used_bytes, own.free_bytes) == (100 * MiB, 1948 * MiB)
    # Without the fault, an NVML reader of the neighbour sees the neighbour's own usage only.
    reader, _ = node.open_context(neighbour_token, cuda=False)
    assert node.meminfo(reader).devices[0].used_bytes == 1024 * MiB


def test_device_ordinals_outside_the_visible_range_are_refused() -> None:
    node = make_node(1024, 1024)
    ctx = join(node, "a", 100)
    with pytest.raises(SimBadRequest, match="sees 1 device"):
        node.alloc(ctx, 1, MiB)
    with pytest.raises(SimBadRequest):
        node.alloc(ctx, 0, 0)


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        (client_spec("a", ["0"], 100, mode="mig"), "compute mode"),
        (client_spec("a", ["7"], 100), "no GPU"),
        (client_spec("a", ["0"], 200, 100), "guarantee"),
        (client_spec("a", ["0"], 0), "guarantee"),
        (client_spec("a", ["0", "0"], 100), "twice"),
        (client_spec("", ["0"], 100), "empty"),
        (ClientSpec(name="a", gpus=()), "no GPUs"),
    ],
)
def test_attach_refuses_impossible_specs(spec: ClientSpec, match: str) -> None:
    with pytest.raises(SimBadRequest, match=match):
        make_node(1024).attach(spec)


def test_attach_refuses_a_second_client_of_the_same_name_and_accepts_gpu_uuids() -> None:
    node = make_node(1024)
    uuid = node.gpus[0].uuid
    node.attach(ClientSpec(name="a", gpus=(ClientGpuSpec(gpu=uuid, hard_limit_mib=10, guarantee_mib=10),)))
    with pytest.raises(SimBadRequest, match="already attached"):
        node.attach(client_spec("a", ["0"], 10))


def test_snapshot_carries_what_a_restarted_agent_needs_and_no_tokens() -> None:
    node = make_node(1024)
    token = node.attach(client_spec("ns/p/c", ["0"], 100, 200, labels={"pod-uid": "u-1"})).token
    ctx, _ = node.open_context(token, pid=4242)
    node.alloc(ctx, 0, 150 * MiB)
    snap = node.snapshot()
    (client,) = snap.clients
    assert client.labels == {"pod-uid": "u-1"}
    assert client.pids == (4242,) and client.contexts == 1 and not client.faulted
    assert (client.gpus[0].hard_limit_bytes, client.gpus[0].guarantee_bytes, client.gpus[0].used_bytes) == (
        200 * MiB,
        100 * MiB,
        150 * MiB,
    )
    assert token not in repr(snap)


# ---- invariants under arbitrary sequences


ops = st.lists(
    st.tuples(
        st.sampled_from(["alloc", "free", "close", "evict"]),
        st.integers(0, 3),  # client
        st.integers(1, 600),  # MiB
    ),
    max_size=60,
)


@settings(max_examples=60, deadline=None)
@given(ops)
def test_the_ledger_never_breaks_its_invariants(sequence: list[tuple[str, int, int]]) -> None:
    node = make_node(1024)
    limits = [(100, 600), (300, 300), (50, 1024), (200, 500)]
    tokens = [node.attach(client_spec(f"c{i}", ["0"], g, h)).token for i, (g, h) in enumerate(limits)]
    ctxs: dict[int, Context] = {i: node.open_context(t)[0] for i, t in enumerate(tokens)}
    handles: dict[int, list[int]] = {i: [] for i in ctxs}
    gone: set[int] = set()
    for op, i, mib in sequence:
        if i in gone:
            continue
        try:
            if op == "alloc":
                handles[i].append(node.alloc(ctxs[i], 0, mib * MiB).handle)
            elif op == "free" and handles[i]:
                node.free(ctxs[i], handles[i].pop())
            elif op == "close":
                node.close_context(ctxs[i])
                ctxs[i] = node.open_context(tokens[i])[0]
                handles[i] = []
            elif op == "evict":
                node.evict(f"c{i}")
                gone.add(i)
        except (SimOutOfMemory, SimPressure):
            pass
        snap = node.snapshot()
        gpu = snap.gpus[0]
        assert 0 <= gpu.used_bytes <= gpu.capacity_bytes
        assert gpu.used_bytes == sum(c.gpus[0].used_bytes for c in snap.clients)
        for c in snap.clients:
            assert 0 <= c.gpus[0].used_bytes <= c.gpus[0].hard_limit_bytes
        for p in node.pressure():
            overages = [c.overage_bytes for c in p.candidates]
            assert overages == sorted(overages, reverse=True) and all(o > 0 for o in overages)

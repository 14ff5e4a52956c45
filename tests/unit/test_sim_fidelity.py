"""The simulated H200 (``--fidelity h200``), in process: pages, contexts, out-of-memory under
pressure, eviction by CUDA error, and the kernel cost model (docs/contract.md §10)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from enforcement.clock import ManualClock
from enforcement.sim.admin import client_spec
from enforcement.sim.fidelity import H200_CONTEXT_BYTES, fidelity
from enforcement.sim.model import Context, SimNode
from enforcement.sim.topology import make_gpus
from fixtures.suite.waiting import wait_until
from workloads.backends import sm_fraction
from workloads.simwire import OOM_DEVICE_FULL, OOM_HARD_LIMIT, KernelReply, MiB, SimFault, SimOutOfMemory

CONTEXT_MIB = H200_CONTEXT_BYTES // MiB


def node(*mib: int, name: str = "h200") -> SimNode:
    return SimNode("node-a", make_gpus("node-a", list(mib or (10000,))), fidelity=name)


def join(
    n: SimNode, who: str, guarantee: int, hard: int | None = None, mode: str = "time-slicing", **kw: bool
) -> Context:
    token = n.attach(client_spec(who, ["0"], guarantee, hard, mode)).token
    return n.open_context(token, **kw)[0]


def test_the_profiles() -> None:
    assert fidelity("ideal").charge(MiB + 1) == MiB + 1 and fidelity("ideal").context_bytes == 0
    assert fidelity("h200").charge(1) == 2 * MiB and fidelity("h200").charge(4 * MiB) == 4 * MiB
    assert fidelity("h200").label == "simulated H200"
    with pytest.raises(ValueError, match="unknown fidelity"):
        fidelity("a100")


def test_a_context_is_charged_per_process_and_seen_in_meminfo_and_the_device() -> None:
    n = node()
    ctx = join(n, "a", 4000)
    mem = n.meminfo(ctx).devices[0]
    assert mem.used_bytes == H200_CONTEXT_BYTES and mem.total_bytes == 4000 * MiB
    assert n.snapshot().gpus[0].used_bytes == H200_CONTEXT_BYTES
    second = n.open_context(n.attach(client_spec("smi", ["0"], 100, None, "time-slicing")).token, cuda=False)[
        0
    ]
    assert n.meminfo(second).devices[0].used_bytes == 0  # NVML, not CUDA: no context
    n.close_context(ctx)
    assert n.snapshot().gpus[0].used_bytes == 0


def test_pages_and_context_put_the_boundary_below_the_limit() -> None:
    n = node()
    ctx = join(n, "a", 4000)
    got = 0
    with pytest.raises(SimOutOfMemory) as oom:
        while True:
            n.alloc(ctx, 0, MiB)  # each MiB costs a 2 MiB page
            got += 1
    assert oom.value.reply.reason == OOM_HARD_LIMIT
    assert got == (4000 - CONTEXT_MIB) // 2
    ideal = node(name="ideal")  # the ideal device is unchanged: the boundary is the limit
    ctx = join(ideal, "a", 4000)
    ideal.alloc(ctx, 0, 4000 * MiB)


def test_a_context_that_does_not_fit_yet_is_charged_with_the_first_allocation() -> None:
    n = node(2000)
    hog = join(n, "hog", 1000, 2000)
    n.alloc(hog, 0, 2000 * MiB - H200_CONTEXT_BYTES)  # the GPU is full
    late = join(n, "late", 1000)
    assert n.meminfo(late).devices[0].used_bytes == 0
    with pytest.raises(SimOutOfMemory) as oom:
        n.alloc(late, 0, MiB)
    assert oom.value.reply.reason == OOM_DEVICE_FULL  # as CUDA says it, not a pressure refusal
    assert [w.client for w in n.pressure()[0].waiting] == ["late"]  # the agent still sees it
    n.detach("hog", "revoked")
    n.alloc(late, 0, MiB)
    assert n.meminfo(late).devices[0].used_bytes == H200_CONTEXT_BYTES + 2 * MiB


def test_eviction_by_cuda_error_reclaims_the_memory_and_fails_the_next_call() -> None:
    n = node()
    borrower = join(n, "b", 1000, 4000)
    n.alloc(borrower, 0, 3000 * MiB)
    reply = n.detach("b", "revoked")
    assert reply.released_bytes == 3000 * MiB + H200_CONTEXT_BYTES
    assert n.snapshot().gpus[0].used_bytes == 0
    with pytest.raises(SimFault, match="cudaErrorMemoryAllocation") as fault:
        n.alloc(borrower, 0, MiB)
    assert fault.value.reply.origin == "memory-manager"
    assert not n.pressure()[0].candidates
    n.detach("b")  # its container stops later: detached as usual, nothing left to release


# The cost model in virtual time (enforcement.clock.ManualClock): a kernel takes exactly the time
# the model gives it, whatever the machine's load, so the figures are asserted exactly. Measured in
# real time, with threads, they are a benchmark's (tests/bench/bench_simdevice.py, kernel_cost_model).


def virtual_node() -> tuple[SimNode, ManualClock]:
    clock = ManualClock()
    return SimNode("node-a", make_gpus("node-a", [10000]), fidelity="h200", clock=clock), clock


@contextmanager
def a_neighbour_computing(n: SimNode, sm_share: float) -> Iterator[None]:
    """Another client's kernel running on GPU 0 throughout, filling ``sm_share`` of its SMs."""
    running = n._gpus[0].running  # noqa: SLF001 - the device's own test stages a neighbour's kernel
    running[-1] = ("neighbour", sm_share, 0.0)
    try:
        yield
    finally:
        running.pop(-1, None)


def test_a_kernel_alone_takes_its_time_and_shares_nothing() -> None:
    assert sm_fraction(4096) == 1.0 and sm_fraction(1024) == pytest.approx(64 / 132)
    n, _clock = virtual_node()
    a = join(n, "a", 1000, mode="sm-sharing")
    alone = n.kernel(a, 0, 0.04, sm_fraction(4096))
    assert alone.end - alone.start == pytest.approx(0.04) and alone.shared_s == 0 and alone.work_s == 0.04


def test_a_large_kernel_beside_a_large_one_runs_at_half_speed() -> None:
    n, _clock = virtual_node()
    a = join(n, "a", 1000, mode="sm-sharing")
    with a_neighbour_computing(n, sm_fraction(4096)):
        big = n.kernel(a, 0, 0.04, sm_fraction(4096))
    assert big.end - big.start == pytest.approx(0.08)
    assert big.shared_s == pytest.approx(0.08) and big.work_s == pytest.approx(0.04)


def test_small_kernels_side_by_side_keep_their_solo_speed() -> None:
    n, _clock = virtual_node()
    a = join(n, "a", 1000, mode="sm-sharing")
    with a_neighbour_computing(n, sm_fraction(1024)):
        small = n.kernel(a, 0, 0.04, sm_fraction(1024))
    assert small.end - small.start == pytest.approx(0.04) and small.shared_s == pytest.approx(0.04)


def test_two_streams_of_a_small_kernel_run_at_once() -> None:
    n, _clock = virtual_node()
    a = join(n, "a", 1000)
    two = n.kernel(a, 0, 0.02, sm_fraction(1024), streams=2)
    assert two.work_s == pytest.approx(0.04) and two.end - two.start == pytest.approx(0.02)


def test_time_slicing_neighbours_take_turns() -> None:
    n, clock = virtual_node()
    sliced = [join(n, f"t{i}", 1000) for i in range(2)]
    replies: dict[int, KernelReply] = {}
    lock = n._gpus[0].lock  # noqa: SLF001 - held so that both kernels queue before either runs
    lock.acquire()

    def run(i: int) -> None:
        replies[i] = n.kernel(sliced[i], 0, 0.04, sm_fraction(1024))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    wait_until(lambda: lock.waiting() == 2, "both kernels queued for the GPU", 30.0)
    began = clock.time()
    lock.release()
    for t in threads:
        t.join(30.0)
    assert set(replies) == {0, 1}, "a kernel did not finish"
    # Taking turns, the two kernels of 0.04 s each end within 0.08 s of virtual time, both spans
    # stretch over nearly all of it, and no turn of one overlaps a turn of the other.
    assert clock.time() - began == pytest.approx(0.08)
    assert all(r.end - r.start > 0.07 for r in replies.values()), replies
    turns = {who: [(s, e) for w, s, e in n._gpus[0].spans if w == who] for who in ("t0", "t1")}  # noqa: SLF001
    assert all(len(t) >= 2 for t in turns.values()), turns
    assert not any(s0 < e1 and s1 < e0 for s0, e0 in turns["t0"] for s1, e1 in turns["t1"]), turns

"""The simulated H200 (``--fidelity h200``), in process: pages, contexts, out-of-memory under
pressure, eviction by CUDA error, and the kernel cost model (docs/contract.md §10)."""

from __future__ import annotations

import threading
import time

import pytest

from enforcement.sim.admin import client_spec
from enforcement.sim.fidelity import H200_CONTEXT_BYTES, fidelity
from enforcement.sim.model import Context, SimNode
from enforcement.sim.topology import make_gpus
from workloads.backends import sm_fraction
from workloads.simwire import OOM_DEVICE_FULL, OOM_HARD_LIMIT, MiB, SimFault, SimOutOfMemory

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


def rates(n: SimNode, ctxs: list[Context], matrix: int, seconds: float = 0.4) -> list[float]:
    out = [0.0] * len(ctxs)

    def run(i: int) -> None:
        began, work = time.monotonic(), 0.0
        while time.monotonic() - began < seconds:
            work += n.kernel(ctxs[i], 0, 0.04, sm_fraction(matrix)).work_s
        out[i] = work / (time.monotonic() - began)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(ctxs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_the_kernel_cost_model() -> None:
    assert sm_fraction(4096) == 1.0 and sm_fraction(1024) == pytest.approx(64 / 132)
    n = node()
    shared = [join(n, f"s{i}", 1000, mode="sm-sharing") for i in range(2)]
    big = rates(n, shared, 4096)
    small = rates(n, shared, 1024)
    assert all(0.35 < r < 0.65 for r in big), big  # one large kernel fills the GPU: about half each
    assert all(r > 0.85 for r in small), small  # small ones keep their solo speed
    m = node()
    sliced = [join(m, f"t{i}", 1000) for i in range(2)]
    turns = rates(m, sliced, 1024)
    assert all(0.3 < r < 0.7 for r in turns), turns  # time-slicing takes turns, whatever the size
    one = m.kernel(sliced[0], 0, 0.02, sm_fraction(1024), streams=2)
    assert one.work_s == pytest.approx(0.04) and one.end - one.start < 0.035  # two streams at once

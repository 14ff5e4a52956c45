"""A scheduler that crashes and restarts loses nothing: it rebuilds its ledger from the API.

The restarted scheduler must count the memory that bound Pods hold before it places anything,
place the Pods that arrived while it was down, and finish a placement a crash interrupted
(annotations patched, bind never sent) as if it had never started.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from scheduler_helpers import (
    PLACE_TIMEOUT_S,
    Pods,
    bound_fraction_pods,
    node_uuids,
    nv,
    running_schedulers,
    unique,
    wait_for_empty_gpus,
)

from fixtures.sandbox.controlplane import Sandbox
from fixtures.sandbox.scheduler.placement import MARKER
from fixtures.suite.waiting import wait_until

pytestmark = pytest.mark.sandbox


def test_a_restarted_scheduler_never_double_books(sandbox: Sandbox, namespace: str, tmp_path: Path) -> None:
    core = sandbox.core_v1()
    wait_for_empty_gpus(core)
    a0, a1 = node_uuids(core, "gpu-a-0"), node_uuids(core, "gpu-a-1")
    name = unique("it-restart")
    with running_schedulers(sandbox, tmp_path, {name: ()}) as procs:
        scheduler = procs[name]
        pods = Pods(core, namespace, name)
        try:
            pods.create("before", {"gpu-memory": "100000"})
            assert pods.bound("before")["metadata"]["annotations"][nv("main", "gpus.devices")] == a0[0]

            scheduler.kill()  # a crash: nothing saved anywhere but in the cluster
            pods.create("while-down", {"gpu-memory": "100000"})
            # What a crash between the annotation patch and the bind leaves behind.
            pods.create(
                "half-placed",
                {
                    "gpu-fraction": "0.25",
                    nv("main", "gpu-memory.request"): "35942Mi",
                    nv("main", "gpu-memory.limit"): "35942Mi",
                    nv("main", "gpu-compute.mode"): "time-slicing",
                    nv("main", "gpu-compute.portion"): "0.25",
                    nv("main", "gpus.devices"): a1[3],
                    MARKER: name,
                },
            )
            scheduler.start().wait_ready()
            ready = scheduler.lines("ready:")[-1]
            assert "100000 MiB already held on 1 GPUs" in ready and "2 pending Pods" in ready

            down = pods.bound("while-down")
            assert (
                down["spec"]["nodeName"],
                down["metadata"]["annotations"][nv("main", "gpus.devices")],
            ) == (
                "gpu-a-0",
                a0[1],
            ), "placed on the GPU the first Pod holds"
            half = pods.bound("half-placed")
            annotations = half["metadata"]["annotations"]
            assert annotations[nv("main", "gpu-memory.request")] == "35942Mi"
            assert annotations[nv("main", "gpus.devices")] == a0[0]  # binpack's choice, not the leftover
            assert pods.events("half-placed", "UntrustedDevices") == []

            pods.create("after", {"gpu-memory": "7829"})  # exactly what GPU 0 still has: 143771-100000-35942
            after = pods.bound("after")
            assert after["metadata"]["annotations"][nv("main", "gpus.devices")] == a0[0]
            loads = bound_fraction_pods(core)
            assert all(load.request_mib <= 143771 for load in loads.values()), loads
            assert loads[("gpu-a-0", a0[0])].request_mib == 143771
        finally:
            pods.delete_all()


def test_a_stopped_scheduler_exits_cleanly_with_its_figures(
    sandbox: Sandbox, namespace: str, tmp_path: Path
) -> None:
    name = unique("it-stop")
    with running_schedulers(sandbox, tmp_path, {name: ()}) as procs:
        scheduler = procs[name]
        pods = Pods(sandbox.core_v1(), namespace, name)
        try:
            pods.create("p", {"gpu-memory": "10"})
            pods.bound("p")
        finally:
            pods.delete_all()
        scheduler.stop()
        assert scheduler.proc is not None and scheduler.proc.returncode == 0
        stats = wait_until(
            lambda: scheduler.lines('{"stats"'), "the figures line at exit", timeout=PLACE_TIMEOUT_S
        )
        assert '"scheduled": 1' in stats[-1]

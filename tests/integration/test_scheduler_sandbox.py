"""``gpuconf sandbox up --scheduler ... --fault ...``: the schedulers as sandbox components.

One sandbox of its own (the shared one runs no scheduler), configured as that command line
configures it, with the reference scheduler seeded with ``mix-modes`` and the upstream
kube-scheduler as the negative control. It checks the wiring end to end: the processes and
their RBAC, that the fault reaches the scheduler, that kube-scheduler binds a fraction Pod
without writing anything (what the suite must catch), a component restart, and a clean down.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kubernetes import client
from scheduler_helpers import PLACE_TIMEOUT_S, Pods, nv

from fixtures.sandbox import processes
from fixtures.sandbox.controlplane import Ports, Sandbox, SandboxConfig
from fixtures.sandbox.scheduler import rbac
from fixtures.suite.waiting import wait_until

pytestmark = pytest.mark.sandbox

SPECS = ("reference:mix-modes", "upstream")
NOT_READY_TOLERATION = {
    "tolerations": [{"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoSchedule"}]
}


def records(box: Sandbox) -> dict[str, processes.ProcessRecord]:
    state = json.loads(box.state_file.read_text())
    return {n: processes.ProcessRecord.from_json(r) for n, r in state["processes"].items()}


def test_sandbox_runs_the_reference_with_a_fault_and_the_upstream_scheduler(tmp_path: Path) -> None:
    # What `gpuconf sandbox up --scheduler reference --scheduler upstream --fault mix-modes` builds
    # (tests/unit/test_scheduler_parts.py checks the command line turns into these specs).
    box = Sandbox(SandboxConfig(state_dir=tmp_path / "sandbox", ports=Ports.free(), schedulers=SPECS))
    running: dict[str, processes.ProcessRecord] = {}
    try:
        box.up(log=print)
        running = records(box)
        assert {"scheduler/gpuconf-reference", "scheduler/default-scheduler"} <= set(running)
        assert all(r.alive() for r in running.values())
        reference = running["scheduler/gpuconf-reference"]
        assert reference.argv[1:3] == ("-m", "fixtures.sandbox.scheduler") and "mix-modes" in reference.argv

        binding = client.RbacAuthorizationV1Api(box.api_client()).read_cluster_role_binding(
            rbac.role_name("gpuconf-reference")
        )
        assert [s.name for s in binding.subjects] == [rbac.user_for("gpuconf-reference")]

        core = box.core_v1()
        core.create_namespace({"metadata": {"name": "wiring"}})
        pods = Pods(core, "wiring", "gpuconf-reference")
        wait_until(
            lambda: _default_service_account(core),
            "the namespace's default ServiceAccount",
            timeout=PLACE_TIMEOUT_S,
        )

        # the fault is wired: two modes on one GPU
        pods.create("ts", {"gpu-memory": "1000"})
        ts = pods.bound("ts")
        pods.create("sm", {"gpu-memory": "1000", nv("main", "gpu-compute.mode"): "sm-sharing"})
        sm = pods.bound("sm")
        assert (
            sm["metadata"]["annotations"][nv("main", "gpus.devices")]
            == (ts["metadata"]["annotations"][nv("main", "gpus.devices")])
        )

        # the negative control: kube-scheduler binds a fraction Pod and writes nothing. The toleration:
        # the sandbox's Nodes keep the not-ready taint the API server puts on new Nodes (no node
        # lifecycle controller runs to lift it), and kube-scheduler honours it.
        pods.create(
            "upstream", {"gpu-fraction": "0.5"}, scheduler="default-scheduler", spec=NOT_READY_TOLERATION
        )
        plain = pods.bound("upstream", timeout=60)
        assert plain["spec"]["nodeName"] in ("gpu-a-0", "gpu-a-1")
        assert not [k for k in plain["metadata"]["annotations"] if k.startswith("nvidia.com/")]

        # a component restart: a new process that rebuilds its view and goes on placing
        restarted = box.restart_component("scheduler/gpuconf-reference", log=print)
        assert restarted.pid != reference.pid and restarted.argv == reference.argv
        pods.create("later", {"gpu-memory": "1000", nv("main", "gpu-compute.mode"): "sm-sharing"})
        later = pods.bound("later")
        assert (
            later["metadata"]["annotations"][nv("main", "gpus.devices")]
            == (ts["metadata"]["annotations"][nv("main", "gpus.devices")])
        )
        log = Path(restarted.log).read_text()
        assert "2000 MiB already held on 1 GPUs" in log.split("ready:")[-1]

        again = box.up(log=print)
        assert again.reused
        now = records(box)  # the same argv for the same spec: nothing restarted
        assert now["scheduler/gpuconf-reference"].pid == restarted.pid
        assert now["scheduler/default-scheduler"].pid == running["scheduler/default-scheduler"].pid
        pods.delete_all()
    finally:
        box.down()
    assert not (tmp_path / "sandbox").exists(), "down left files behind"
    for rec in running.values():
        assert not rec.alive(), f"{rec.name} still runs"


def _default_service_account(core: client.CoreV1Api) -> bool:
    try:
        core.read_namespaced_service_account("default", "wiring")
        return True
    except client.ApiException:
        return False

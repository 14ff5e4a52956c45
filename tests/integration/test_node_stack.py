"""The whole node stack, as `gpuconf sandbox up` runs it: Pods bound by hand run fenced.

One sandbox with ``node_runtime=True`` (per node: the simulated GPU device, the reference
agent, the simulated kubelet) and no scheduler: each Pod carries the annotations a scheduler
would write and is bound through the Binding subresource, as a scheduler binds. What is
judged is what a real node must do with them (docs/contract.md §5-6): the hard limit, borrowing
and its reclaim through the Eviction API, fail-closed refusal, the mode guard, and an agent
restart that loses nothing.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from prometheus_client.samples import Sample

from enforcement.agent.metrics import parse
from fixtures.sandbox import processes
from fixtures.sandbox.controlplane import Ports, Sandbox, SandboxConfig
from fixtures.suite import manifests
from fixtures.suite.waiting import wait_until

pytestmark = pytest.mark.sandbox
WAIT_S = 90.0  # a node's processes start on a loaded 2-core runner

NODE = "gpu-a-0"
GPU_MIB = 143771
KEY = "nvidia.com/container.app."


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sandbox]:
    box = Sandbox(
        SandboxConfig(
            state_dir=tmp_path_factory.mktemp("stack") / "sb", ports=Ports.free(), node_runtime=True
        )
    )
    box.up(log=print)
    try:
        yield box
    finally:
        box.down()


@pytest.fixture
def ns(stack: Sandbox) -> Iterator[str]:
    core = stack.core_v1()
    name = f"stack-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name}})
    yield name
    core.delete_namespace(name)


def bound_pod(
    box: Sandbox,
    ns: str,
    name: str,
    plan: dict[str, Any],
    request: str,
    limit: str,
    devices: str,
    mode: str = "time-slicing",
) -> None:
    """Create the Pod as its author would, with the annotations a scheduler writes, then bind it."""
    annotations = {
        KEY + "gpu-memory.request": request,
        KEY + "gpu-memory.limit": limit,
        KEY + "gpu-compute.mode": mode,
        KEY + "gpus.devices": devices,
    }
    container = manifests.container(
        "app",
        image="gpuconf/workload:test",
        command=("python", "-m", "workloads.allocate"),
        args=("--plan", json.dumps(plan)),
    )
    pod = manifests.pod(name, [container], annotations=annotations, scheduler="by-hand")
    core = box.core_v1()
    core.create_namespaced_pod(ns, pod)
    binding = client.V1Binding(
        metadata=client.V1ObjectMeta(name=name),
        target=client.V1ObjectReference(api_version="v1", kind="Node", name=NODE),
    )
    core.create_namespaced_binding(ns, binding, _preload_content=False)


def read(box: Sandbox, ns: str, name: str) -> dict[str, Any] | None:
    try:
        return json.loads(box.core_v1().read_namespaced_pod(name, ns, _preload_content=False).data)
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise


def state(pod: dict[str, Any] | None) -> dict[str, Any]:
    statuses = (pod or {}).get("status", {}).get("containerStatuses") or [{}]
    return statuses[0].get("state", {})


def finished(box: Sandbox, ns: str, name: str) -> dict[str, Any]:
    pod = wait_until(
        lambda: (p := read(box, ns, name)) and p["status"].get("phase") in ("Succeeded", "Failed") and p,
        f"{ns}/{name} to finish",
        timeout=WAIT_S,
    )
    return pod


def result(pod: dict[str, Any]) -> dict[str, Any]:
    return json.loads(state(pod)["terminated"]["message"])


def events(box: Sandbox, ns: str, name: str) -> list[Any]:
    return [e for e in box.core_v1().list_namespaced_event(ns).items if e.involved_object.name == name]


def test_allocation_stops_at_the_hard_limit(stack: Sandbox, ns: str) -> None:
    plan = {"name": "probe", "steps": [{"op": "alloc-until-oom", "granularity": "1Mi"}, {"op": "smi"}]}
    bound_pod(stack, ns, "capped", plan, request="2Gi", limit="6Gi", devices="0")
    pod = finished(stack, ns, "capped")
    out = result(pod)
    assert pod["status"]["phase"] == "Succeeded", out
    search = next(s for s in out["steps"] if s["op"] == "alloc-until-oom")
    assert search["max_bytes"] == 6 * 1024**3, "the most it could hold must be exactly the 6Gi limit"
    smi = next(s for s in out["steps"] if s["op"] == "smi")
    assert [g["total_mib"] for g in smi["gpus"]] == [6144], "nvidia-smi must show the limit as the total"


def test_borrower_is_evicted_when_a_guaranteed_neighbour_needs_its_memory(stack: Sandbox, ns: str) -> None:
    borrow = 120 * 1024  # MiB: far above its 1Gi request, leaving too little for the neighbour
    borrower_plan = {
        "name": "borrower",
        "steps": [
            {"op": "alloc", "bytes": f"{borrow}Mi", "chunk": "8Gi"},
            {"op": "heartbeat", "interval": 0.2, "until_signal": "SIGTERM"},
        ],
    }
    bound_pod(stack, ns, "borrower", borrower_plan, request="1Gi", limit=f"{GPU_MIB}Mi", devices="1")
    wait_until(lambda: "running" in state(read(stack, ns, "borrower")), "the borrower to run", timeout=WAIT_S)
    time.sleep(0.5)  # let its allocation land before the neighbour asks
    guaranteed_plan = {
        "name": "guaranteed",
        "steps": [{"op": "alloc", "bytes": "64Gi", "chunk": "8Gi", "retry_on_pressure": 30}],
    }
    bound_pod(stack, ns, "guaranteed", guaranteed_plan, request="64Gi", limit="64Gi", devices="1")

    pod = finished(stack, ns, "guaranteed")
    assert pod["status"]["phase"] == "Succeeded", result(pod)
    assert result(pod)["held_bytes"] == 64 * 1024**3
    wait_until(lambda: read(stack, ns, "borrower") is None, "the evicted borrower to be gone", timeout=WAIT_S)
    reasons = {e.reason for e in events(stack, ns, "borrower")}
    assert "GPUFractionEvicted" in reasons, reasons


def test_malformed_pod_never_starts_and_says_why(stack: Sandbox, ns: str, tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    plan = {"name": "never", "steps": [{"op": "hold", "until_file": str(marker), "seconds": 1}]}
    bound_pod(stack, ns, "malformed", plan, request="1000m", limit="6Gi", devices="0")
    waiting = wait_until(
        lambda: (
            state(read(stack, ns, "malformed")).get("waiting", {}).get("reason")
            == "CreateContainerConfigError"
            and state(read(stack, ns, "malformed"))["waiting"]
        ),
        "the refusal to show",
        timeout=WAIT_S,
    )
    assert "nvidia.com/container.app.gpu-memory.request" in waiting["message"]
    rejected = wait_until(
        lambda: [e for e in events(stack, ns, "malformed") if e.reason == "GPUFractionRejected"],
        "the agent's Event",
        timeout=WAIT_S,
    )
    assert "gpu-memory.request" in rejected[0].message and "memory-quantity" in rejected[0].message
    pod = read(stack, ns, "malformed")
    assert pod is not None and pod["status"]["phase"] == "Pending"
    assert "running" not in state(pod) and "terminated" not in state(pod)


def test_mixed_modes_on_one_gpu_are_refused(stack: Sandbox, ns: str) -> None:
    hold = {
        "name": "ts",
        "steps": [{"op": "alloc", "bytes": "1Gi"}, {"op": "hold", "until_signal": "SIGTERM"}],
    }
    bound_pod(stack, ns, "slicer", hold, request="1Gi", limit="2Gi", devices="2", mode="time-slicing")
    wait_until(
        lambda: "running" in state(read(stack, ns, "slicer")), "the time-slicing Pod to run", timeout=WAIT_S
    )
    bound_pod(stack, ns, "sharer", hold, request="1Gi", limit="2Gi", devices="2", mode="sm-sharing")
    waiting = wait_until(
        lambda: (
            state(read(stack, ns, "sharer")).get("waiting", {}).get("reason") == "CreateContainerConfigError"
            and state(read(stack, ns, "sharer"))["waiting"]
        ),
        "the mode conflict to be refused",
        timeout=WAIT_S,
    )
    assert "sm-sharing" in waiting["message"] and "time-slicing" in waiting["message"]
    assert wait_until(
        lambda: [e for e in events(stack, ns, "sharer") if e.reason == "GPUModeConflict"],
        "the Event",
        timeout=WAIT_S,
    )
    assert "running" in state(read(stack, ns, "slicer")), "the Pod already there must be left alone"


def test_agent_killed_mid_run_loses_nothing(stack: Sandbox, ns: str, tmp_path: Path) -> None:
    go = tmp_path / "go"
    plan = {
        "name": "survivor",
        "steps": [
            {"op": "alloc", "bytes": "1Gi", "label": "first"},
            {"op": "hold", "until_file": str(go)},
            {"op": "alloc", "bytes": "2Gi", "expect": "oom"},  # 1Gi + 2Gi > the 2Gi limit
            {"op": "alloc", "bytes": "512Mi"},
        ],
    }
    bound_pod(stack, ns, "survivor", plan, request="1Gi", limit="2Gi", devices="3")
    wait_until(lambda: "running" in state(read(stack, ns, "survivor")), "the Pod to run", timeout=WAIT_S)
    old = json.loads(stack.state_file.read_text())["processes"][f"agent/{NODE}"]
    os.kill(old["pid"], signal.SIGKILL)
    new = stack.restart_component(f"agent/{NODE}", log=print)
    assert new.pid != old["pid"] and new.alive()

    go.write_text("go")
    pod = finished(stack, ns, "survivor")
    out = result(pod)
    steps = {s["i"]: s for s in out["steps"]}
    assert steps[2]["outcome"] == "oom", "the hard limit must still hold after the agent restarted"
    assert steps[3]["outcome"] == "ok"
    assert out["held_bytes"] == 1024**3 + 512 * 1024**2
    assert pod["status"]["phase"] in ("Succeeded", "Failed")
    assert not [
        e for e in events(stack, ns, "survivor") if e.reason in ("GPUFractionEvicted", "GPUFenceLost")
    ]


def test_agent_metrics_show_the_fraction(stack: Sandbox, ns: str) -> None:
    import urllib.request

    plan = {
        "name": "metered",
        "steps": [{"op": "alloc", "bytes": "300Mi"}, {"op": "hold", "until_signal": "SIGTERM"}],
    }
    bound_pod(stack, ns, "metered", plan, request="200Mi", limit="400Mi", devices="0")
    wait_until(lambda: "running" in state(read(stack, ns, "metered")), "the Pod to run", timeout=WAIT_S)
    port = int((stack.dir / "nodes" / NODE / "agent-metrics-port").read_text())

    def scrape() -> list[Sample]:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            return parse(resp.read().decode())  # read as a scraper reads it

    sample = wait_until(
        lambda: [
            s
            for s in scrape()
            if s.name == "gpu_fractioning_gpu_memory_used_bytes"
            and s.labels.get("pod") == "metered"
            and s.value == 300 * 1024**2  # sampled on the agent's cycle: wait for the value
        ],
        "the fraction's 300Mi usage in the metrics",
        timeout=WAIT_S,
    )[0]
    assert sample.labels["namespace"] == ns and sample.labels["gpu"] == "0"


def test_every_node_process_is_a_recorded_component(stack: Sandbox) -> None:
    recorded = json.loads(stack.state_file.read_text())["processes"]
    for node in ("gpu-a-0", "gpu-a-1"):
        for part in ("sim", "agent", "runtime"):
            rec = processes.ProcessRecord.from_json(recorded[f"{part}/{node}"])
            assert rec.alive(), f"{part}/{node} is not running"

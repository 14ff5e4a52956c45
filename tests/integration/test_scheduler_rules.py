"""The reference scheduler on the real API server: each placement rule, end to end.

One scheduler (its own name, user and RBAC) runs for the module against the shared sandbox
(nodes gpu-a-0 and gpu-a-1, four 143771 MiB GPUs each). Every test starts from empty GPUs and
force-deletes its Pods, so the expected GPUs can be stated exactly: the choice is deterministic
(binpack: fullest GPU that fits, then node name, then GPU index).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from scheduler_helpers import (
    PLACE_TIMEOUT_S,
    Pods,
    SchedulerProcess,
    node_condition,
    nv,
    pods_on_empty_gpus,
    running_schedulers,
    unique,
    uuids_by_node,
    wait_for_empty_gpus,
)

from enforcement.contract import audit_gpus, audit_pod
from fixtures.sandbox.controlplane import Sandbox
from fixtures.suite.waiting import wait_until

pytestmark = pytest.mark.sandbox

MIB = 143771
FRACTIONING = "gpu-fractioning.nvidia.com/Ready"
HOST = "kubernetes.io/hostname"


@pytest.fixture(scope="module")
def scheduler(sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SchedulerProcess]:
    name = unique("it-place")
    with running_schedulers(sandbox, tmp_path_factory.mktemp("sched"), {name: ()}) as procs:
        yield procs[name]


@pytest.fixture
def pods(sandbox: Sandbox, namespace: str, scheduler: SchedulerProcess) -> Iterator[Pods]:
    with pods_on_empty_gpus(sandbox.core_v1(), namespace, scheduler.name) as made:
        yield made


@pytest.fixture(scope="module")
def gpu(sandbox: Sandbox) -> dict[str, list[str]]:
    return uuids_by_node(sandbox.core_v1())


def audit(sandbox: Sandbox, namespace: str) -> list[str]:
    """Every contract violation among the namespace's Pods (given their nodes) and on the GPUs (rule ids)."""
    core = sandbox.core_v1()
    pods = json.loads(core.list_namespaced_pod(namespace, _preload_content=False).data)["items"]
    nodes = {
        n["metadata"]["name"]: n for n in json.loads(core.list_node(_preload_content=False).data)["items"]
    }
    found = [v.rule for p in pods for v in audit_pod(p, nodes.get(p["spec"].get("nodeName", "")))]
    return found + [v.rule for v in audit_gpus(pods, nodes.values())]


# --------------------------------------------------------------------------- dialects


def test_gpu_fraction_pod_gets_the_annotations_then_the_binding(
    pods: Pods, gpu: dict[str, list[str]], scheduler: SchedulerProcess
) -> None:
    pods.create("frac", {"gpu-fraction": "0.5", "gpu-fraction.limit": "0.8"})
    pod = pods.bound("frac")
    assert pod["spec"]["nodeName"] == "gpu-a-0"
    annotations = pod["metadata"]["annotations"]
    assert {k: v for k, v in annotations.items() if k.startswith("nvidia.com/")} == {
        nv("main", "gpu-memory.request"): "71885Mi",
        nv("main", "gpu-memory.limit"): "115016Mi",
        nv("main", "gpu-compute.mode"): "time-slicing",
        nv("main", "gpus.devices"): gpu["gpu-a-0"][0],
        nv("main", "gpu-compute.portion"): "0.5",
    }
    assert annotations["gpuconf.io/scheduled-by"] == scheduler.name
    assert [c["status"] for c in pod["status"]["conditions"] if c["type"] == "PodScheduled"] == ["True"]
    assert "Successfully assigned" in pods.event("frac", "Scheduled").message
    line = f"scheduled {pods.namespace}/frac -> gpu-a-0 [{gpu['gpu-a-0'][0]}]"
    wait_until(lambda: scheduler.lines(line), f"the log line {line!r}", timeout=PLACE_TIMEOUT_S)


def test_absolute_dialect(pods: Pods, gpu: dict[str, list[str]]) -> None:
    pods.create(
        "abs", {nv("main", "gpu-memory.request"): "20Gi", nv("main", "gpu-compute.mode"): "sm-sharing"}
    )
    pod = pods.bound("abs")
    annotations = pod["metadata"]["annotations"]
    assert annotations[nv("main", "gpu-memory.request")] == "20480Mi"
    assert annotations[nv("main", "gpu-memory.limit")] == "20480Mi"
    assert annotations[nv("main", "gpu-compute.mode")] == "sm-sharing"
    assert annotations[nv("main", "gpus.devices")] == gpu["gpu-a-0"][0]
    assert nv("main", "gpu-compute.portion") not in annotations


def test_gpu_memory_dialect_for_a_named_container(pods: Pods) -> None:
    pods.create(
        "mem",
        {"gpu-memory": "4096", "gpu-memory.limit": "8Gi", "gpu-fraction-container-name": "worker"},
        containers=("side", "worker"),
    )
    annotations = pods.bound("mem")["metadata"]["annotations"]
    assert annotations[nv("worker", "gpu-memory.request")] == "4096Mi"
    assert annotations[nv("worker", "gpu-memory.limit")] == "8192Mi"
    assert not any(k.startswith("nvidia.com/container.side.") for k in annotations)


# --------------------------------------------------------------------------- rules


def test_memory_fit_per_gpu_and_binpack(pods: Pods, gpu: dict[str, list[str]], sandbox: Sandbox) -> None:
    a0 = gpu["gpu-a-0"]
    expected = {"big": a0[0], "half": a0[1], "fills": a0[0]}
    pods.create("big", {"gpu-memory": "100000"})
    pods.bound("big")
    pods.create("half", {"gpu-memory": "50000"})  # 43771 MiB left on GPU 0: too little
    pods.bound("half")
    pods.create("fills", {"gpu-memory": "43771"})  # exactly what GPU 0 has left: binpack fills it
    for name, device in expected.items():
        assert pods.bound(name)["metadata"]["annotations"][nv("main", "gpus.devices")] == device, name
    assert audit(sandbox, pods.namespace) == []


def test_two_quick_pods_never_share_the_last_free_memory(pods: Pods, sandbox: Sandbox) -> None:
    names = [pods.create(f"q{i}", {"gpu-memory": "100000"}) for i in range(9)]  # eight GPUs fit eight
    placed = [pods.bound(n) for n in names[:8]]
    devices = {
        (p["spec"]["nodeName"], p["metadata"]["annotations"][nv("main", "gpus.devices")]) for p in placed
    }
    assert len(devices) == 8
    assert "no GPU with 100000 MiB free: the largest free is 43771 MiB" in pods.unschedulable("q8")
    assert audit(sandbox, pods.namespace) == []


def test_modes_are_separated_per_gpu_not_per_node(
    pods: Pods, gpu: dict[str, list[str]], sandbox: Sandbox
) -> None:
    pods.create("ts", {"gpu-memory": "1000"})
    pods.bound("ts")
    pods.create("sm", {"gpu-memory": "1000", nv("main", "gpu-compute.mode"): "sm-sharing"})
    ts, sm = pods.read("ts"), pods.bound("sm")
    assert ts["spec"]["nodeName"] == sm["spec"]["nodeName"] == "gpu-a-0"
    assert ts["metadata"]["annotations"][nv("main", "gpus.devices")] == gpu["gpu-a-0"][0]
    assert sm["metadata"]["annotations"][nv("main", "gpus.devices")] == gpu["gpu-a-0"][1]
    assert audit(sandbox, pods.namespace) == []


def test_num_devices_gets_distinct_gpus_of_one_node(
    pods: Pods, gpu: dict[str, list[str]], sandbox: Sandbox
) -> None:
    pods.create("one", {"gpu-memory": "100000"})
    pods.bound("one")
    pods.create("four", {"gpu-fraction": "0.5", "gpu-fraction-num-devices": "4"})
    pod = pods.bound("four")
    assert pod["spec"]["nodeName"] == "gpu-a-1"  # gpu-a-0 has three GPUs with room, not four
    assert pod["metadata"]["annotations"][nv("main", "gpus.devices")] == ",".join(gpu["gpu-a-1"])
    assert audit(sandbox, pods.namespace) == []


def test_devices_the_pod_set_itself_are_not_trusted(pods: Pods, gpu: dict[str, list[str]]) -> None:
    own = gpu["gpu-a-1"][3]
    pods.create("sneaky", {"gpu-memory": "1000", nv("main", "gpus.devices"): own})
    pod = pods.bound("sneaky")
    assert pod["spec"]["nodeName"] == "gpu-a-0"
    assert pod["metadata"]["annotations"][nv("main", "gpus.devices")] == gpu["gpu-a-0"][0]
    message = pods.event("sneaky", "UntrustedDevices").message
    assert f"ignored gpus.devices {own!r} set by the Pod itself" in message


def test_a_pod_without_a_fraction_is_bound_without_annotations(pods: Pods) -> None:
    pods.create("plain")
    pod = pods.bound("plain")
    assert pod["spec"]["nodeName"] in ("gpu-a-0", "gpu-a-1")
    assert not any(k.startswith("nvidia.com/") for k in pod["metadata"].get("annotations") or {})


# --------------------------------------------------------------------------- unschedulable


def test_insufficient_memory_is_reported_once_and_retried_when_a_pod_finishes(
    pods: Pods, gpu: dict[str, list[str]], scheduler: SchedulerProcess
) -> None:
    pods.create("fill-0", {"gpu-memory": "100000", "gpu-fraction-num-devices": "4"})
    pods.create("fill-1", {"gpu-memory": "100000", "gpu-fraction-num-devices": "4"})
    pods.bound("fill-0")
    pods.bound("fill-1")
    pods.create("waits", {"gpu-memory": "100000"})
    message = pods.unschedulable("waits", "no GPU with 100000 MiB free")
    largest = f"the largest free is 43771 MiB (GPU {gpu['gpu-a-0'][0]} of node gpu-a-0)"
    assert message == f"no GPU with 100000 MiB free: {largest}"
    assert pods.event("waits", "FailedScheduling").message == message
    retries = len(scheduler.lines("retry:"))
    wait_until(
        lambda: len(scheduler.lines("retry:")) >= retries + 2, "two periodic retries", timeout=PLACE_TIMEOUT_S
    )
    assert len(pods.events("waits", "FailedScheduling")) == 1, "an Event per attempt, not per reason"

    pods.finish("fill-1")  # Succeeded: its share is free again
    pod = pods.bound("waits")
    assert pod["spec"]["nodeName"] == "gpu-a-1"
    assert pod["metadata"]["annotations"][nv("main", "gpus.devices")] == gpu["gpu-a-1"][0]


def test_deleting_a_pod_frees_its_share(pods: Pods) -> None:
    pods.create("fill-0", {"gpu-memory": "100000", "gpu-fraction-num-devices": "4"})
    pods.create("fill-1", {"gpu-memory": "100000", "gpu-fraction-num-devices": "4"})
    pods.bound("fill-0")
    pods.bound("fill-1")
    pods.create("waits", {"gpu-memory": "100000"})
    pods.unschedulable("waits", "no GPU with 100000 MiB free")
    pods.delete("fill-0")
    assert pods.bound("waits")["spec"]["nodeName"] == "gpu-a-0"


def test_mode_conflict_on_every_candidate(pods: Pods) -> None:
    for n in ("gpu-a-0", "gpu-a-1"):  # too big to share a GPU: one per node
        pods.create(f"ts-{n}", {"gpu-memory": "100000", "gpu-fraction-num-devices": "4"})
        assert pods.bound(f"ts-{n}")["spec"]["nodeName"] == n
    pods.create("sm", {"gpu-memory": "1000", nv("main", "gpu-compute.mode"): "sm-sharing"})
    message = pods.unschedulable("sm")
    assert message == (
        "mode conflict on every candidate: each of the 8 GPU(s) with enough free memory already runs "
        "time-slicing workloads, and this Pod asks for sm-sharing"
    )
    assert pods.event("sm", "FailedScheduling").message == message


def test_too_few_gpus(pods: Pods) -> None:
    pods.create("wide", {"gpu-memory": "1000", "gpu-fraction-num-devices": "5"})
    assert pods.unschedulable("wide") == "too few GPUs: need 5 on one node, the largest node has 4"
    for n in ("gpu-a-0", "gpu-a-1"):  # three full GPUs on each node
        pods.create(f"full-{n}", {"gpu-memory": str(MIB), "gpu-fraction-num-devices": "3"})
        assert pods.bound(f"full-{n}")["spec"]["nodeName"] == n
    pods.create("two", {"gpu-memory": "1000", "gpu-fraction-num-devices": "2"})
    assert pods.unschedulable("two") == (
        "too few GPUs: need 2 GPUs with 1000 MiB free (time-slicing) on one node, best node gpu-a-0 has 1"
    )


def test_no_ready_node_then_placed_when_a_node_turns_ready(pods: Pods, sandbox: Sandbox) -> None:
    core = sandbox.core_v1()
    with node_condition(core, "gpu-a-0", FRACTIONING, "False"):
        with node_condition(core, "gpu-a-1", "Ready", "False"):
            pods.create("nowhere", {"gpu-fraction": "0.5"})
            message = pods.unschedulable("nowhere")
            assert message == (
                "no ready node: 0/2 nodes are Ready with gpu-fractioning.nvidia.com/Ready=True "
                "(gpu-a-0: gpu-fractioning.nvidia.com/Ready is not True; gpu-a-1: Ready is not True)"
            )
        # gpu-a-1 is ready again and gpu-a-0 still is not, until the Pod is bound: the retry takes
        # gpu-a-1. (Restoring both before the bind raced the retry, which on a busy machine came after
        # both and took gpu-a-0, the first of two ready nodes.)
        assert pods.bound("nowhere")["spec"]["nodeName"] == "gpu-a-1"


def test_an_invalid_request_stays_pending_with_the_violation(pods: Pods) -> None:
    pods.create("bad", {"gpu-fraction": "0.5", "gpu-memory": "1000"})
    message = pods.unschedulable("bad")
    assert message.startswith("the Pod's GPU request is invalid: ")
    assert "dialect-conflict" in message


# --------------------------------------------------------------------------- the Pod's node constraints


@contextmanager
def node_spec(sandbox: Sandbox, node: str, **spec: Any) -> Iterator[None]:
    """Set fields of a Node's spec (taints, unschedulable) for the duration, as an operator would."""
    core = sandbox.core_v1()
    before = json.loads(core.read_node(node, _preload_content=False).data).get("spec") or {}
    core.patch_node(node, {"spec": spec})
    try:
        yield
    finally:
        core.patch_node(node, {"spec": {key: before.get(key) for key in spec}})


def required(**term: list[dict[str, Any]]) -> dict[str, Any]:
    """``spec.affinity`` with one required nodeSelectorTerm."""
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


def test_node_selector_affinity_taints_and_cordons(pods: Pods, sandbox: Sandbox) -> None:
    # nodeSelector and required affinity, for fractional and whole Pods alike
    pods.create("sel", {"gpu-fraction": "0.25"}, spec={"nodeSelector": {HOST: "gpu-a-1"}})
    assert pods.bound("sel")["spec"]["nodeName"] == "gpu-a-1"  # binpack alone: gpu-a-0, first by name
    not_a1 = required(matchExpressions=[{"key": HOST, "operator": "NotIn", "values": ["gpu-a-1"]}])
    pods.create("aff", {"gpu-fraction": "0.25"}, spec={"affinity": not_a1})
    assert pods.bound("aff")["spec"]["nodeName"] == "gpu-a-0"  # binpack alone: beside "sel"
    by_name = required(matchFields=[{"key": "metadata.name", "operator": "In", "values": ["gpu-a-1"]}])
    pods.create("whole-aff", spec={"affinity": by_name})
    assert pods.bound("whole-aff")["spec"]["nodeName"] == "gpu-a-1"
    pods.create("whole-sel", spec={"nodeSelector": {HOST: "gpu-a-0"}})
    assert pods.bound("whole-sel")["spec"]["nodeName"] == "gpu-a-0"

    pods.create("nowhere", {"gpu-fraction": "0.25"}, spec={"nodeSelector": {HOST: "nowhere"}})
    message = pods.unschedulable("nowhere")
    assert (
        message
        == f"0/2 nodes match: 2 do not match the Pod's nodeSelector ({HOST}=nowhere) [gpu-a-0, gpu-a-1]"
    )
    assert pods.event("nowhere", "FailedScheduling").message == message

    # a taint on gpu-a-0 (and one that only prefers on gpu-a-1), then a cordon on gpu-a-1
    taint = {"key": "gpuconf.io/test", "value": "taint", "effect": "NoSchedule"}
    soft = {"key": "gpuconf.io/soft", "effect": "PreferNoSchedule"}
    with node_spec(sandbox, "gpu-a-0", taints=[taint]), node_spec(sandbox, "gpu-a-1", taints=[soft]):
        with node_spec(sandbox, "gpu-a-1", unschedulable=True):
            pods.create("blocked", {"gpu-fraction": "0.25"})
            pods.create("blocked-whole")
            expected = (
                "0/2 nodes match: 1 is cordoned [gpu-a-1], "
                "1 has taint gpuconf.io/test=taint:NoSchedule not tolerated [gpu-a-0]"
            )
            assert pods.unschedulable("blocked") == expected
            assert pods.unschedulable("blocked-whole") == expected
            tolerates = [
                {"key": "gpuconf.io/test", "operator": "Equal", "value": "taint", "effect": "NoSchedule"}
            ]
            pods.create("tolerant", {"gpu-fraction": "0.25"}, spec={"tolerations": tolerates})
            assert pods.bound("tolerant")["spec"]["nodeName"] == "gpu-a-0"
        # uncordoned: the Pods waiting go to gpu-a-1 (its PreferNoSchedule taint keeps nothing off),
        # never to the tainted gpu-a-0
        assert pods.bound("blocked")["spec"]["nodeName"] == "gpu-a-1"
        assert pods.bound("blocked-whole")["spec"]["nodeName"] == "gpu-a-1"
    assert audit(sandbox, pods.namespace) == []


# --------------------------------------------------------------------------- spread


def test_spread_policy_alternates_nodes(
    sandbox: Sandbox, namespace: str, tmp_path: Path, gpu: dict[str, list[str]]
) -> None:
    core = sandbox.core_v1()
    wait_for_empty_gpus(core)
    name = unique("it-spread")
    with running_schedulers(sandbox, tmp_path, {name: ("--policy", "spread")}):
        made = Pods(core, namespace, name)
        try:
            for i in range(3):
                made.create(f"s{i}", {"gpu-fraction": "0.25"})
            placed = [made.bound(f"s{i}") for i in range(3)]
            assert [
                (p["spec"]["nodeName"], p["metadata"]["annotations"][nv("main", "gpus.devices")])
                for p in placed
            ] == [
                ("gpu-a-0", gpu["gpu-a-0"][0]),
                ("gpu-a-1", gpu["gpu-a-1"][0]),
                ("gpu-a-0", gpu["gpu-a-0"][1]),
            ]
        finally:
            made.delete_all()

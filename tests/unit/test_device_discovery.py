"""Device identity known by UUID only (the h200 fidelity): the discovery Pod, the simulated device
plugin and nvidia-smi that answer it, the Nodes that carry nothing of gpuconf's, and the reference
scheduler that takes no fraction where it cannot name the GPUs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from enforcement.contract import NODE_GPU_UUIDS
from enforcement.discovery import CONTAINER, LABEL_DISCOVERY, discovered, discovery_pod, parse_gpu_list
from enforcement.sim import SMI_BIN_DIR
from enforcement.sim.fidelity import H200, IDEAL, fidelity
from fixtures.sandbox import nodes
from fixtures.sandbox.noderuntime.deviceplugin import (
    VISIBLE_DEVICES,
    WHOLE_GPUS_ENV,
    DevicePlugin,
    Gpu,
    OutOfGpus,
    whole_gpus,
)
from fixtures.sandbox.scheduler.placement import NodeInfo
from fixtures.sandbox.topology import GPU, NodeSpec, gpu_uuid
from fixtures.suite.cluster import GpuNode, with_learned_uuids

SMI_LIST = """GPU 0: NVIDIA H200 (UUID: GPU-aaaa-1111)
  MIG 1g.18gb     Device  0: (UUID: MIG-bbbb)
GPU 1: NVIDIA H200 (simulated) (UUID: GPU-cccc-2222)
"""


def test_parse_gpu_list_reads_gpu_lines_only() -> None:
    assert parse_gpu_list(SMI_LIST) == ("GPU-aaaa-1111", "GPU-cccc-2222")


def _ended(phase: str, message: str) -> dict:
    state = {"terminated": {"message": message, "exitCode": 0 if phase == "Succeeded" else 1}}
    return {"status": {"phase": phase, "containerStatuses": [{"name": CONTAINER, "state": state}]}}


def test_discovered_waits_then_checks_the_count() -> None:
    assert discovered({"status": {"phase": "Running"}}, 2) is None
    assert discovered(_ended("Succeeded", SMI_LIST), 2).uuids == ("GPU-aaaa-1111", "GPU-cccc-2222")
    short = discovered(_ended("Succeeded", SMI_LIST), 4)
    assert short is not None and "listed 2 GPU(s)" in short.problem
    failed = discovered(_ended("Failed", "no driver"), 2)
    assert failed is not None and failed.uuids == () and "no driver" in failed.problem


def test_discovery_pod_is_bound_and_asks_for_every_gpu_whole() -> None:
    pod = discovery_pod("d", "node-a", 4, "img")
    spec = pod["spec"]
    assert spec["nodeName"] == "node-a" and spec["restartPolicy"] == "Never"
    assert spec["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": "4"}
    assert pod["metadata"]["labels"][LABEL_DISCOVERY] == "node-a"


def test_device_plugin_gives_free_gpus_and_takes_them_back() -> None:
    plugin = DevicePlugin(tuple(Gpu(f"GPU-{i}", "NVIDIA-H200", 1024) for i in range(3)))
    first = plugin.allocate("c1", 2)
    assert first[VISIBLE_DEVICES] == "GPU-0,GPU-1"
    with pytest.raises(OutOfGpus):
        plugin.allocate("c2", 2)
    plugin.release("c1")
    assert plugin.allocate("c2", 3)[VISIBLE_DEVICES] == "GPU-0,GPU-1,GPU-2"
    assert whole_gpus({"resources": {"limits": {"nvidia.com/gpu": "2"}}}) == 2
    assert whole_gpus({"resources": {}}) == 0


def test_simulated_smi_lists_gpus_given_whole(tmp_path: Path) -> None:
    plugin = DevicePlugin((Gpu("GPU-x-0", "NVIDIA-H200", 143771), Gpu("GPU-x-1", "NVIDIA-H200", 143771)))
    env = {
        "PATH": f"{SMI_BIN_DIR}:{os.path.dirname(sys.executable)}:/usr/bin:/bin",
        **plugin.allocate("c", 2),
    }
    out = subprocess.run(
        ["nvidia-smi", "-L"], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    assert parse_gpu_list(out.stdout) == ("GPU-x-0", "GPU-x-1")
    assert "simulated" in out.stdout
    assert json.loads(env[WHOLE_GPUS_ENV])[0]["uuid"] == "GPU-x-0"


def _spec() -> NodeSpec:
    return NodeSpec("n0", "pool", tuple(GPU(i, gpu_uuid("n0", i), "NVIDIA-H200", 143771) for i in range(2)))


def test_h200_nodes_carry_only_what_a_real_gpu_node_does() -> None:
    assert fidelity(IDEAL).node_conveniences and not fidelity(H200).node_conveniences
    real = nodes.manifest(_spec(), conveniences=False)["metadata"]
    carried = {k: v for k, v in {**real["labels"], **real["annotations"]}.items() if v is not None}
    assert not [k for k in carried if k.startswith("gpuconf.io/")]
    assert carried["nvidia.com/gpu.count"] == "2" and carried["nvidia.com/gpu.product"] == "NVIDIA-H200"
    # the keys of the other fidelity are named for removal, so a reused node loses them
    assert real["annotations"][NODE_GPU_UUIDS] is None
    ideal = nodes.manifest(_spec())["metadata"]
    assert ideal["annotations"][NODE_GPU_UUIDS].startswith("GPU-")
    status = nodes.status(_spec())["status"]
    assert status["capacity"]["nvidia.com/gpu"] == "2"


def _node_dict(conveniences: bool) -> dict:
    spec = _spec()
    body = nodes.manifest(spec, conveniences)
    body["metadata"]["labels"] = {k: v for k, v in body["metadata"]["labels"].items() if v is not None}
    body["metadata"]["annotations"] = {
        k: v for k, v in body["metadata"]["annotations"].items() if v is not None
    }
    return body | nodes.status(spec)


def test_suite_reads_a_uuid_only_node_as_simulated_without_uuids_until_learned() -> None:
    raw = _node_dict(conveniences=False)
    node = GpuNode.from_dict(raw)
    assert node is not None and node.simulated and node.uuids == ()
    learned = GpuNode.from_dict(with_learned_uuids(raw, {"n0": ("GPU-a", "GPU-b")}))
    assert learned is not None and learned.uuids == ("GPU-a", "GPU-b")


def test_scheduler_takes_no_fraction_on_a_node_whose_uuids_are_unknown() -> None:
    info = NodeInfo.from_node(_node_dict(conveniences=False))
    assert info.gpus == ("0", "1")  # what it could write; the loop marks it unknown instead
    from dataclasses import replace

    unknown = replace(info, uuids_unknown=True)
    assert not unknown.takes_fractions and "not known yet" in unknown.why_not(fractions=True)
    known = unknown.learned(("GPU-a", "GPU-b"))
    assert known.takes_fractions and known.gpus == ("GPU-a", "GPU-b")


def test_each_scheduler_has_its_own_discovery_pod_per_node() -> None:
    from fixtures.sandbox.scheduler.discovery import pod_name

    names = {pod_name(owner, node) for owner in ("gpuconf-reference", "m-overcommit") for node in ("a", "b")}
    assert len(names) == 4  # schedulers side by side never take each other's Pod for a leftover
    assert pod_name("gpuconf-reference", "a") == pod_name("gpuconf-reference", "a")  # a leftover is found
    long = pod_name("s", "n" * 80)
    assert len(long) <= 63 and long[0].isalnum() and long[-1].isalnum()

"""Topology files: the built-ins, UUIDs, and every rule with the message a user sees."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from fixtures.sandbox import topology
from fixtures.sandbox.errors import SandboxError
from fixtures.sandbox.topology import TopologyError, gpu_uuid


def doc(**pool_overrides) -> dict:
    pool = {"name": "p", "nodes": 1, "gpusPerNode": 2, "product": "NVIDIA-H200", "memoryMiB": 81920}
    pool.update(pool_overrides)
    return {"apiVersion": "gpuconf.io/v1alpha1", "kind": "SandboxTopology", "pools": [pool]}


def problems(document) -> list[str]:
    with pytest.raises(TopologyError) as err:
        topology.parse(document, "t.yaml")
    return err.value.problems


def test_default_topology_is_two_nodes_of_four_gpus() -> None:
    nodes = topology.load("default").nodes()
    assert [n.name for n in nodes] == ["gpu-a-0", "gpu-a-1"]
    assert all(len(n.gpus) == 4 and n.memory_mib == 143771 and n.product == "NVIDIA-H200" for n in nodes)


def test_scale_topology_is_64_nodes_of_eight_gpus() -> None:
    nodes = topology.load("scale").nodes()
    assert len(nodes) == 64
    assert {len(n.gpus) for n in nodes} == {8}


def test_gpu_uuids_are_stable_unique_and_nvidia_shaped() -> None:
    first = [g.uuid for n in topology.load("scale").nodes() for g in n.gpus]
    again = [g.uuid for n in topology.load("scale").nodes() for g in n.gpus]
    assert first == again
    assert len(set(first)) == 64 * 8
    assert all(u.startswith("GPU-") and len(u) == 40 for u in first)
    assert gpu_uuid("n", 0) != gpu_uuid("n", 1) != gpu_uuid("m", 1)


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"nodes": 0}, "pools[0].nodes: must be an integer from 1 to 1000 (got 0)"),
        ({"nodes": True}, "pools[0].nodes: must be an integer from 1 to 1000 (got True)"),
        ({"nodes": "2"}, "pools[0].nodes: must be an integer from 1 to 1000 (got '2')"),
        ({"gpusPerNode": 17}, "pools[0].gpusPerNode: must be an integer from 1 to 16 (got 17)"),
        ({"memoryMiB": 512}, "pools[0].memoryMiB: must be an integer from 1024 to 4194304 (got 512)"),
        ({"name": "Big_Pool"}, "pools[0].name: must be a lowercase DNS label"),
        ({"name": None}, "pools[0].name: must be a lowercase DNS label"),
        ({"product": "NVIDIA H200"}, "pools[0].product: must be a Kubernetes label value"),
        ({"gpus": 4}, "pools[0].gpus: unknown field"),
    ],
)
def test_each_pool_rule_names_field_and_rule(overrides: dict, expected: str) -> None:
    found = problems(doc(**overrides))
    assert any(p.startswith(expected) for p in found), found


def test_document_level_rules() -> None:
    found = problems({"apiVersion": "v1", "kind": "Topology", "pools": [], "extra": 1})
    assert "apiVersion: must be 'gpuconf.io/v1alpha1' (got 'v1')" in found
    assert "kind: must be 'SandboxTopology' (got 'Topology')" in found
    assert "extra: unknown field (allowed: apiVersion, kind, pools, fidelity)" in found
    assert "pools: must be a non-empty list of pools" in found


def test_a_topology_names_its_fidelity() -> None:
    assert topology.parse(doc()).fidelity == "ideal"
    assert topology.parse({**doc(), "fidelity": "h200"}).fidelity == "h200"
    assert "fidelity: must be one of ideal, h200 (got 'a100')" in problems({**doc(), "fidelity": "a100"})


def test_all_problems_are_reported_at_once_with_the_file() -> None:
    document = doc(nodes=0, memoryMiB=1)
    document["pools"].append(dict(document["pools"][0]))
    with pytest.raises(TopologyError) as err:
        topology.parse(document, "my.yaml")
    assert str(err.value).startswith("invalid topology my.yaml:")
    assert "pools[1].name: duplicate pool name 'p'" in err.value.problems
    assert len(err.value.problems) == 5


def test_too_many_nodes_in_all() -> None:
    document = doc(nodes=600)
    document["pools"].append(dict(document["pools"][0], name="q"))
    assert "pools: at most 1000 nodes in all (got 1200)" in problems(document)


def test_not_a_mapping() -> None:
    assert problems(["a"])[0].startswith("(top level): must be a mapping")


def test_yaml_syntax_error_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("apiVersion: gpuconf.io/v1alpha1\npools:\n  - name: [unclosed\n")
    with pytest.raises(SandboxError, match=rf"topology {path}:\d+:\d+: not valid YAML"):
        topology.load(path)


def test_missing_file_lists_builtins(tmp_path: Path) -> None:
    with pytest.raises(SandboxError, match="cannot read topology .*built-in topologies: default, scale"):
        topology.load(tmp_path / "nope.yaml")


def test_file_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump(doc(nodes=3)))
    topo = topology.load(path)
    assert [n.name for n in topo.nodes()] == ["p-0", "p-1", "p-2"]
    assert topo.source == str(path)

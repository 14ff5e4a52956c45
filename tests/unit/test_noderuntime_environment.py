"""A simulated container's environment: layer order, downward API, ``$(VAR)``, PATH."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from enforcement.sim import SMI_BIN_DIR
from fixtures.sandbox.noderuntime.environment import (
    DEFAULT_PATH,
    PROJECT_ROOT,
    EnvError,
    assemble,
    command,
    container_env,
    expand,
    field_ref,
    interpreter_bin_dir,
    with_tool_path,
)

POD: dict[str, Any] = {
    "metadata": {
        "name": "p1",
        "namespace": "team-a",
        "uid": "1234-5678",
        "labels": {"app": "trainer"},
        "annotations": {"nvidia.com/container.main.gpu-memory.request": "4Gi"},
    },
    "spec": {"nodeName": "gpu-a-0", "containers": [{"name": "main"}]},
}
RUN_DIR = Path("/work/pods/team-a_p1_1234-5678/main/0")


def test_downward_api_fields() -> None:
    assert field_ref(POD, "metadata.name") == "p1"
    assert field_ref(POD, "metadata.namespace") == "team-a"
    assert field_ref(POD, "metadata.uid") == "1234-5678"
    assert field_ref(POD, "spec.nodeName") == "gpu-a-0"
    assert field_ref(POD, "spec.serviceAccountName") == "default"
    assert field_ref(POD, "status.podIP") == field_ref(POD, "status.hostIP") == "127.0.0.1"
    assert field_ref(POD, "metadata.labels['app']") == "trainer"
    assert field_ref(POD, "metadata.annotations['nvidia.com/container.main.gpu-memory.request']") == "4Gi"
    assert field_ref(POD, "metadata.labels['absent']") == ""
    with pytest.raises(EnvError, match="not supported"):
        field_ref(POD, "metadata.labels")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("$(A)", "1"),
        ("x$(A)y$(B)z", "x1y2z"),
        ("$(MISSING)", "$(MISSING)"),
        ("$$(A)", "$(A)"),  # escaped
        ("$$", "$"),
        ("$A", "$A"),
        ("$(A", "$(A"),
        ("cost: 5$", "cost: 5$"),
        ("$($(A))", "$($(A))"),
    ],
)
def test_expansion_follows_the_kubelet(text: str, expected: str) -> None:
    assert expand(text, {"A": "1", "B": "2"}) == expected


@given(st.text(alphabet=st.characters(blacklist_characters="$"), max_size=40))
def test_expansion_leaves_text_without_dollars_alone(text: str) -> None:
    assert expand(text, {"A": "1"}) == text


def test_container_env_in_order_with_references_to_earlier_entries() -> None:
    container = {
        "name": "main",
        "env": [
            {"name": "A", "value": "1"},
            {"name": "B", "value": "$(A)-$(C)"},  # C is defined later: left as written
            {"name": "C", "value": "3"},
            {"name": "EMPTY"},
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        ],
    }
    assert container_env(POD, container) == {
        "A": "1",
        "B": "1-$(C)",
        "C": "3",
        "EMPTY": "",
        "NODE": "gpu-a-0",
    }


@pytest.mark.parametrize(
    "entry",
    [
        {"name": "X", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}},
        {"name": "X", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}},
        {"name": "X", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory"}}},
    ],
)
def test_unsupported_sources_are_refused_by_name(entry: dict[str, Any]) -> None:
    kind = next(iter(entry["valueFrom"]))
    with pytest.raises(EnvError, match=kind):
        container_env(POD, {"name": "main", "env": [entry]})


def test_env_from_is_refused() -> None:
    with pytest.raises(EnvError, match="envFrom"):
        container_env(POD, {"name": "main", "envFrom": [{"configMapRef": {"name": "cm"}}]})


def test_layers_override_in_order() -> None:
    container = {
        "name": "main",
        "env": [
            {"name": "NVIDIA_GPU_MEMORY_LIMIT", "value": "999999"},  # the container tries to lift its limit
            {"name": "HOME", "value": "/root"},
            {"name": "GPUCONF_TERMINATION_PATH", "value": "/elsewhere"},
            {"name": "OWN", "value": "mine"},
        ],
    }
    env = assemble(
        POD,
        container,
        run_dir=RUN_DIR,
        agent_env={"NVIDIA_GPU_MEMORY_LIMIT": "4096", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=4096M"},
        runtime_env={"GPUCONF_TERMINATION_PATH": str(RUN_DIR / "termination-log")},
    )
    assert env["NVIDIA_GPU_MEMORY_LIMIT"] == "4096"  # the agent's enforcement wins
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"
    assert env["GPUCONF_TERMINATION_PATH"] == str(RUN_DIR / "termination-log")  # the runtime's convention
    assert env["HOME"] == "/root" and env["OWN"] == "mine"  # the container over the image
    assert env["HOSTNAME"] == "p1" and env["TMPDIR"] == str(RUN_DIR)
    assert env["PYTHONPATH"] == str(PROJECT_ROOT)


def test_runtime_environment_is_not_inherited(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUCONF_SIM_ADMIN_TOKEN", "secret")
    env = assemble(POD, {"name": "main"}, run_dir=RUN_DIR, agent_env={}, runtime_env={})
    assert "GPUCONF_SIM_ADMIN_TOKEN" not in env
    assert set(env) == {"PATH", "HOME", "TMPDIR", "HOSTNAME", "PYTHONPATH"}


def test_path_puts_the_simulated_smi_then_the_project_interpreter_first() -> None:
    env = assemble(POD, {"name": "main"}, run_dir=RUN_DIR, agent_env={}, runtime_env={})
    parts = env["PATH"].split(os.pathsep)
    assert parts[:2] == [str(SMI_BIN_DIR), interpreter_bin_dir()]
    assert parts[2:] == [p for p in DEFAULT_PATH.split(os.pathsep) if p not in parts[:2]]

    own = {"name": "main", "env": [{"name": "PATH", "value": f"/opt/tools:{SMI_BIN_DIR}"}]}
    parts = assemble(POD, own, run_dir=RUN_DIR, agent_env={}, runtime_env={})["PATH"].split(os.pathsep)
    assert parts[:3] == [str(SMI_BIN_DIR), interpreter_bin_dir(), "/opt/tools"]
    assert parts.count(str(SMI_BIN_DIR)) == 1


def test_with_tool_path_deduplicates_and_drops_empty_parts() -> None:
    assert with_tool_path("/b::/a:/c", ["/a", "/b"]) == "/a:/b:/c"


def test_command_and_args_expand_against_the_final_env() -> None:
    container = {"command": ["python", "-c"], "args": ["print('$(GREETING)')", "$$(GREETING)"]}
    assert command(container, {"GREETING": "hi"}) == ["python", "-c", "print('hi')", "$(GREETING)"]


def test_no_command_means_unknown_entrypoint() -> None:
    assert command({"args": ["--flag"]}, {}) == []
    assert command({"command": []}, {}) == []

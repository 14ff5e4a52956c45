"""What a fenced container sees: its enforcement environment, and its GPUs as ``nvidia-smi`` shows them.

docs/contract.md §5. The node agent gives a fenced container ``NVIDIA_GPU_MEMORY_REQUEST`` and
``NVIDIA_GPU_MEMORY_LIMIT`` (whole MiB), ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` (the limit per
container-visible ordinal: ``0=4096M,1=4096M``), ``CUDA_MPS_PIPE_DIRECTORY`` and
``NVIDIA_VISIBLE_DEVICES`` (the assigned GPUs), over whatever the container set itself; and the
NVML shim makes ``nvidia-smi`` list exactly those GPUs, each with the limit as its total memory.

The values are judged against the placement annotations as the node read them (what the suite or
the scheduler wrote), with GPUs compared by identity: an index, a UUID and a CDI name of one GPU
are the same GPU.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from enforcement.agent.environment import (
    CONTRACT_ENV,
    ENV_LIMIT,
    ENV_PINNED_LIMIT,
    ENV_PIPE_DIRECTORY,
    ENV_REQUEST,
    ENV_THREAD_PERCENTAGE,
    ENV_VISIBLE_DEVICES,
)
from enforcement.contract import resolve_device
from fixtures.suite.checks import Needs, check
from fixtures.suite.frame import Suite, fail
from fixtures.suite.scenario import Placed, Stage, plan, require

SHARE: Final = 0.25
LIMIT_SHARE: Final = 0.3
DECOYS: Final[dict[str, str]] = {
    ENV_REQUEST: "1",
    ENV_LIMIT: "1",
    ENV_PINNED_LIMIT: "0=1M",
    ENV_PIPE_DIRECTORY: "/tmp/not-the-mps-server",
    ENV_VISIBLE_DEVICES: "all",
}
"""What the container sets itself: the agent's values must replace every one."""
_PINNED: Final = re.compile(r"(\d+)=(\d+)M")


def device_count(suite: Suite) -> int:
    """Two devices where the implementation supports multi-device requests and the node has two."""
    return 2 if "multi-device" in suite.options.supported_features and suite.node.gpu_count >= 2 else 1


def env_problems(placed: Placed, env: Mapping[str, Any], node: Mapping[str, Any] | None) -> list[str]:
    """Every way ``env`` disagrees with what the node must give ``placed`` (docs/contract.md §5)."""
    problems = []
    limit, request, count = placed.written_limit_mib, placed.written_request_mib, len(placed.gpus)
    expected = {ENV_REQUEST: str(request), ENV_LIMIT: str(limit)}
    for key, want in expected.items():
        if env.get(key) != want:
            problems.append(f"{key}={env.get(key)!r}, expected {want!r} (MiB)")
    pinned = env.get(ENV_PINNED_LIMIT) or ""
    entries = [_PINNED.fullmatch(e) for e in pinned.split(",")] if pinned else []
    got = {int(m.group(1)): int(m.group(2)) for m in entries if m}
    want_pinned = {i: limit for i in range(count)}
    if None in entries or got != want_pinned:
        shown = ",".join(f"{i}={limit}M" for i in range(count))
        problems.append(f"{ENV_PINNED_LIMIT}={pinned!r}, expected {shown!r} (the limit per visible ordinal)")
    visible = env.get(ENV_VISIBLE_DEVICES) or ""
    gpus = tuple(resolve_device(d, node) for d in visible.split(",") if d)
    if gpus != placed.gpus:
        problems.append(
            f"{ENV_VISIBLE_DEVICES}={visible!r} names GPU(s) {', '.join(gpus) or 'none'}, but the "
            f"container was assigned {', '.join(placed.gpus)} ({placed.devices})"
        )
    pipe = env.get(ENV_PIPE_DIRECTORY)
    if not pipe or pipe == DECOYS[ENV_PIPE_DIRECTORY]:
        problems.append(f"{ENV_PIPE_DIRECTORY}={pipe!r}: not the MPS server of its mode")
    if placed.mode == "time-slicing" and env.get(ENV_THREAD_PERCENTAGE) is not None:
        problems.append(
            f"{ENV_THREAD_PERCENTAGE}={env.get(ENV_THREAD_PERCENTAGE)!r} on a time-slicing container"
        )
    return problems


@check(
    id="env-injection",
    level="MUST",
    statement="A fenced container MUST get the enforcement environment of docs/contract.md §5 with "
    "values that match its placement annotations (visible devices = the assigned GPUs; limits in MiB per "
    "container-visible ordinal), overriding whatever the container set itself.",
    profiles=("node", "stack"),
    seed="000/4",
    needs=Needs(nodes=1, gpus=1, idle=True),
)
def test_env_injection(suite: Suite) -> None:
    count = device_count(suite)
    stage = Stage(suite, gpus=count)
    placed = stage.place(
        "env",
        plan("env", {"op": "env", "names": list(CONTRACT_ENV)}),
        request_mib=stage.mib(SHARE),
        limit_mib=stage.mib(LIMIT_SHARE),
        devices=count,
        env=DECOYS,
    )
    out = stage.wait_ended(placed.name)
    require(out, ("ok",), "it only reads its environment")
    env = out.step("env").get("env") or {}
    suite.evidence.fact("environment", {"seen": env, "containerSet": DECOYS, "placement": placed.as_dict()})
    problems = env_problems(placed, env, suite.cluster.read_node(placed.node))
    if problems:
        raise fail(f"{placed.name}: " + "; ".join(problems))


@check(
    id="smi-visibility",
    level="MUST",
    statement="nvidia-smi inside a fenced container MUST list exactly the GPUs assigned to it, each with "
    "memory.total equal to its gpu-memory.limit.",
    profiles=("node", "stack", "probe"),
    seed="000/4",
    needs=Needs(nodes=1, gpus=1, idle=True),
)
def test_smi_visibility(suite: Suite) -> None:
    count = device_count(suite)
    stage = Stage(suite, gpus=count)
    look = plan("smi", {"op": "smi"})
    request, limit = stage.mib(SHARE), stage.mib(LIMIT_SHARE)
    names = [stage.pod("single", look, request_mib=request, limit_mib=limit)]
    if count > 1:
        names.append(stage.pod("pair", look, request_mib=request, limit_mib=limit, devices=2))
    problems = []
    seen = {}
    for name in names:
        placed = stage.placed(name)
        out = stage.wait_ended(name)
        require(out, ("ok",), "nvidia-smi must answer inside a fenced container")
        listed = out.step("smi").get("gpus") or []
        seen[name] = {"listed": listed, "assigned": list(placed.gpus), "limitMiB": placed.written_limit_mib}
        node = suite.cluster.read_node(placed.node)
        uuids = tuple(resolve_device(str(g.get("uuid")), node) for g in listed)
        if sorted(uuids) != sorted(placed.gpus) or len(uuids) != len(placed.gpus):
            problems.append(
                f"{name}: nvidia-smi lists {', '.join(uuids) or 'no GPU'}, but it was assigned "
                f"{', '.join(placed.gpus)}"
            )
        totals = {g.get("uuid"): g.get("total_mib") for g in listed}
        wrong = {u: t for u, t in totals.items() if t != placed.written_limit_mib}
        if wrong:
            problems.append(
                f"{name}: memory.total "
                + ", ".join(f"{t} MiB on {u}" for u, t in wrong.items())
                + f", expected its limit of {placed.written_limit_mib} MiB"
            )
    suite.evidence.fact("nvidiaSmi", seen)
    if problems:
        raise fail("; ".join(problems))

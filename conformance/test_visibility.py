"""What a fenced container sees: its enforcement environment, and its GPUs as ``nvidia-smi`` shows them.

docs/contract.md §5. The node agent gives a fenced container ``NVIDIA_GPU_MEMORY_REQUEST`` and
``NVIDIA_GPU_MEMORY_LIMIT`` (whole MiB), ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` (the limit per
container-visible ordinal: ``0=4096M,1=4096M``), ``CUDA_MPS_PIPE_DIRECTORY`` and
``NVIDIA_VISIBLE_DEVICES`` (the assigned GPUs), over whatever the container set itself; and the
NVML shim makes ``nvidia-smi`` list exactly those GPUs, each with the limit as its total memory and
the container's own usage as its used memory (judged beside a neighbour holding memory on the GPU).

The values are judged against the placement annotations as the node read them (what the suite or
the scheduler wrote), with GPUs compared by identity: an index, a UUID and a CDI name of one GPU
are the same GPU.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, Final

from conformance.judgements import device_fidelity, judge_smi_view, within
from enforcement.agent.environment import (
    ENV_LIMIT,
    ENV_PINNED_LIMIT,
    ENV_PIPE_DIRECTORY,
    ENV_REQUEST,
    ENV_THREAD_PERCENTAGE,
    ENV_VISIBLE_DEVICES,
)
from enforcement.contract import resolve_device
from enforcement.implementations import MECHANISMS, NodePart, builtins, reference_node
from fixtures.suite.checks import Needs, check
from fixtures.suite.frame import Suite, fail
from fixtures.suite.scenario import Placed, Stage, plan, require
from workloads.plan import MiB, alloc, cuda_devices, heartbeat, meminfo, read_env, ready, smi
from workloads.simwire import SIM_TOKEN_ENV

SHARE: Final = 0.25
LIMIT_SHARE: Final = 0.3
OWN_SHARE: Final = 0.1
"""What a container allocates before its nvidia-smi looks (well within its request)."""
NEIGHBOUR_SHARE: Final = 0.25
"""The neighbour's request: above the 0.2 a scheduler's stage leaves beside a filler, so it shares
the scenario's GPU in every profile."""
NEIGHBOUR_HELD_SHARE: Final = 0.2
"""What the neighbour holds (within its request's headroom), far more than the usage tolerance."""
BEAT_S: Final = 0.1
SIDECAR: Final = "sidecar"
"""A second container of the fenced Pod, with no gpu annotations of its own."""
DECOY_VALUES: Final[dict[str, str]] = {
    ENV_REQUEST: "1",
    ENV_LIMIT: "1",
    ENV_PINNED_LIMIT: "0=1M",
    ENV_PIPE_DIRECTORY: "/tmp/not-the-mps-server",
    ENV_VISIBLE_DEVICES: "all",
}
DECOYS: Final = DECOY_VALUES
"""What the container sets itself (the reference agent's names): the agent's values must replace them."""
_PINNED: Final = re.compile(r"(\d+)=(\d+)M")
_ROLES: Final = ("memoryRequest", "memoryLimit")


def device_count(suite: Suite) -> int:
    """Two devices where the implementation supports multi-device requests and the node has two."""
    return 2 if "multi-device" in suite.options.supported_features and suite.node.gpu_count >= 2 else 1


def decoys(part: NodePart) -> dict[str, str]:
    """What the container sets itself: only variables the implementation is known to replace (whether
    the operator's release keeps a container's own NVIDIA_GPU_MEMORY_* is not established)."""
    generic = {
        part.env.memory_request: "1",
        part.env.memory_limit: "1",
        part.env.pipe_directory: DECOY_VALUES[ENV_PIPE_DIRECTORY],
        part.env.visible_devices: "all",
    }
    if part.env.pinned_limit:
        generic[part.env.pinned_limit] = "0=1M"
    return {k: v for k, v in generic.items() if k in part.env.replaces_container_values}


def variants() -> dict[str, dict[str, str]]:
    """Per role (memoryRequest, memoryLimit), every built-in's name for it, with what is known of it."""
    out: dict[str, dict[str, str]] = {r: {} for r in _ROLES}
    for impl in builtins().values():
        if impl.node is None:
            continue
        env = impl.node.env
        for role, name in (("memoryRequest", env.memory_request), ("memoryLimit", env.memory_limit)):
            fact = env.known_unenforced.get(name, "")
            out[role].setdefault(name, f"{impl.name}'s name" + (f"; {fact}" if fact else ""))
    return out


def read_names(part: NodePart) -> list[str]:
    """Every variable the workload reads: the dialect's, and every other built-in's for the same roles."""
    names = list(part.env.names())
    for role in variants().values():
        names += role
    return list(dict.fromkeys([*names, ENV_THREAD_PERCENTAGE]))


def sidecar_problems(fenced: Mapping[str, Any], sidecar: Mapping[str, Any] | None) -> list[str]:
    """What shows a container without gpu annotations was fenced beside its Pod's fractional one:
    a variable holding the value the fenced container got for it (an image's own default, such as
    ``NVIDIA_VISIBLE_DEVICES=all``, differs from the fence's), or an attachment to the simulated
    device (its token: a client of its own, with a share of the GPU's accounting)."""
    if sidecar is None:
        return ["reported no environment (it did not run the plan)"]
    out = [
        f"got {name}={value!r}, the fenced container's value"
        for name, value in sidecar.items()
        if value is not None and name != SIM_TOKEN_ENV and fenced.get(name) == value
    ]
    if sidecar.get(SIM_TOKEN_ENV):
        out.append(
            f"was attached to the simulated GPU device ({SIM_TOKEN_ENV} set): a share of the GPU of its own"
        )
    return out


def env_problems(
    placed: Placed,
    env: Mapping[str, Any],
    node: Mapping[str, Any] | None,
    part: NodePart | None = None,
    claims: Callable[[str], bool] | None = None,
    skipped: Callable[[str, str], None] | None = None,
) -> list[str]:
    """Every way ``env`` disagrees with what the node must give ``placed``, in ``part``'s dialect
    (default: the reference agent's), name by name; mechanisms only where ``claims`` says so."""
    part = part or reference_node()
    dialect = part.env
    claims = claims or part.claims
    skipped = skipped or (lambda _what, _why: None)
    problems = []
    limit, request, count = placed.written_limit_mib, placed.written_request_mib, len(placed.gpus)
    known = variants()
    for role, name, mib in (
        ("memoryRequest", dialect.memory_request, request),
        ("memoryLimit", dialect.memory_limit, limit),
    ):
        allowed = dialect.memory_values(mib)
        got = env.get(name)
        if got in allowed:
            continue
        shown = " or ".join(repr(v) for v in allowed)
        if got is None:
            others = [(n, why) for n, why in known[role].items() if n != name and env.get(n) is not None]
            if others:
                other, why = others[0]
                problems.append(
                    f"expects {name} ({part.implementation}), found {other}={env.get(other)!r} instead "
                    f"({why}): the variable its consumer reads is missing"
                )
                continue
        problems.append(f"{name}={got!r}, expected {shown} ({dialect.memory_unit}, from {mib} MiB)")
    if dialect.pinned_limit and claims("pinned-mps-limits"):
        pinned = env.get(dialect.pinned_limit) or ""
        entries = [_PINNED.fullmatch(e) for e in pinned.split(",")] if pinned else []
        got_pinned = {int(m.group(1)): int(m.group(2)) for m in entries if m}
        want_pinned = {i: limit for i in range(count)}
        if None in entries or got_pinned != want_pinned:
            shown = ",".join(f"{i}={limit}M" for i in range(count))
            problems.append(
                f"{dialect.pinned_limit}={pinned!r}, expected {shown!r} (the limit per visible ordinal)"
            )
    else:
        skipped("pinned-mps-limits", mechanism_fact(part, "pinned-mps-limits"))
    visible = env.get(dialect.visible_devices) or ""
    if dialect.visible_devices_value == "verbatim":
        if visible != placed.devices.strip():
            problems.append(
                f"{dialect.visible_devices}={visible!r}, expected the gpus.devices value verbatim "
                f"({placed.devices!r})"
            )
    else:
        gpus = tuple(resolve_device(d, node) for d in visible.split(",") if d)
        if gpus != placed.gpus:
            problems.append(
                f"{dialect.visible_devices}={visible!r} names GPU(s) {', '.join(gpus) or 'none'}, but the "
                f"container was assigned {', '.join(placed.gpus)} ({placed.devices})"
            )
    pipe = env.get(dialect.pipe_directory)
    want_pipe = dialect.pipe_directories.get(placed.mode)
    if not pipe or pipe == DECOY_VALUES[ENV_PIPE_DIRECTORY]:
        problems.append(f"{dialect.pipe_directory}={pipe!r}: not the MPS server of its mode")
    elif want_pipe and pipe != want_pipe:
        problems.append(
            f"{dialect.pipe_directory}={pipe!r}, expected {want_pipe!r} "
            f"({part.implementation}'s {placed.mode} server)"
        )
    threads = dialect.thread_percentage or ENV_THREAD_PERCENTAGE
    if (
        placed.mode not in dialect.thread_cap_modes
        and env.get(threads) is not None
        and claims("compute-portion")
    ):
        problems.append(f"{threads}={env.get(threads)!r} on a {placed.mode} container")
    return problems


def mechanism_fact(part: NodePart, mechanism: str) -> str:
    return f"{part.implementation} does not claim {mechanism} ({MECHANISMS[mechanism]})"


@check(
    id="env-injection",
    level="MUST",
    statement="A fenced container MUST get the enforcement environment of the declared implementation's "
    "dialect (docs/contract.md §5, §9) with values that match its placement annotations, name by name "
    "(memory request and limit in the dialect's unit, visible devices = the assigned GPUs, the MPS pipe "
    "directory of its mode; the pinned limit per visible ordinal where claimed), overriding what the "
    "container set itself where the implementation is known to; the fence is per container: a sidecar "
    "of the same Pod without gpu annotations MUST get none of it and no share of the GPU.",
    profiles=("node", "stack"),
    seed="000/4",
    needs=Needs(nodes=1, gpus=1, idle=True),
)
def test_env_injection(suite: Suite) -> None:
    part = suite.options.node_part()
    count = device_count(suite)
    stage = Stage(suite, gpus=count)
    set_itself = decoys(part)
    # The sidecar reads the same names (and the simulated device's token: an attached client, a
    # share of the GPU) in the same Pod: the fence is the fractional container's alone.
    sidecar_names = [*read_names(part), SIM_TOKEN_ENV]
    placed = stage.place(
        "env",
        plan("env", read_env(*read_names(part))),
        request_mib=stage.mib(SHARE),
        limit_mib=stage.mib(LIMIT_SHARE),
        devices=count,
        env=set_itself,
        sidecars={SIDECAR: plan("sidecar", read_env(*sidecar_names))},
    )
    out = stage.wait_ended(placed.name)
    require(out, ("ok",), "it only reads its environment")
    env = out.step("env").get("env") or {}
    side = stage.container_result(placed.name, SIDECAR) or {}
    side_env = next((st.get("env") for st in side.get("steps") or [] if st.get("op") == "env"), None)
    suite.evidence.fact(
        "environment",
        {
            "seen": env,
            "containerSet": set_itself,
            "placement": placed.as_dict(),
            "dialect": part.implementation,
            "sidecar": {"seen": side_env, "status": side.get("status")},
        },
    )
    names = [n for n in part.env.names() if n != part.env.thread_percentage]
    if any(n not in part.env.replaces_container_values for n in names):
        replaced = part.env.replaces_container_values
        suite.not_judged(
            "container's own values replaced",
            f"{part.implementation} is known to replace only {', '.join(replaced)} of them"
            if replaced
            else f"no source says {part.implementation} replaces a value the container set itself",
        )
    problems = env_problems(
        placed, env, suite.cluster.read_node(placed.node), part, suite.options.claims, suite.not_judged
    )
    leaked = sidecar_problems(env, side_env)
    if leaked:
        problems.append(f"its sidecar {SIDECAR!r}, which has no gpu annotations, " + "; ".join(leaked))
    if problems:
        raise fail(f"{placed.name}: " + "; ".join(problems))


@check(
    id="smi-visibility",
    level="MUST",
    statement="nvidia-smi inside a fenced container MUST list exactly the GPUs assigned to it, each with "
    "memory.total equal to its gpu-memory.limit and memory.used counting its own allocations only (not "
    "a neighbour's on the same GPU), where the implementation claims an NVML memory view.",
    profiles=("node", "stack", "probe"),
    features=("nvml-memory-view",),
    seed="000/4",
    needs=Needs(nodes=1, gpus=1, idle=True),
)
def test_smi_visibility(suite: Suite) -> None:
    count = device_count(suite)
    stage = Stage(suite, gpus=count)
    # A neighbour holding a large share of the same GPU first: a view that counts the whole device's
    # usage shows it (it is far larger than the tolerance), one that counts the container's does not.
    beside = stage.mib(NEIGHBOUR_SHARE)
    held = min(stage.mib(NEIGHBOUR_HELD_SHARE), within(beside))
    neighbour = stage.place(
        "neighbour",
        plan(
            "neighbour",
            alloc(held),
            ready(),
            heartbeat(BEAT_S, until_signal="SIGTERM"),
        ),
        request_mib=beside,
    )
    stage.must_be_ready(
        neighbour.name, f"it holds {held} MiB within its own guarantee and limit on an idle GPU"
    )
    request, limit = stage.mib(SHARE), stage.mib(LIMIT_SHARE)
    own = stage.mib(OWN_SHARE)  # on its first GPU, well within its request: then nvidia-smi looks
    look = plan("smi", alloc(own), smi())
    names = [stage.pod("single", look, request_mib=request, limit_mib=limit)]
    if count > 1:
        names.append(stage.pod("pair", look, request_mib=request, limit_mib=limit, devices=2))
    problems = []
    seen = {}
    for name in names:
        placed = stage.placed(name)
        out = stage.wait_ended(name)
        require(out, ("ok",), "it allocates within its request, and nvidia-smi must answer in it")
        listed = out.step("smi").get("gpus") or []
        node = suite.cluster.read_node(placed.node)
        uuids = tuple(resolve_device(str(g.get("uuid")), node) for g in listed)
        # What each listed GPU holds of its own (ordinal 0) and of the neighbour's, by node GPU.
        own_by_index = {int(g.get("index") or 0): own for g in listed if int(g.get("index") or 0) == 0}
        shared = {
            int(g.get("index") or 0): held for g, u in zip(listed, uuids, strict=True) if u in neighbour.gpus
        }
        seen[name] = {
            "listed": listed,
            "assigned": list(placed.gpus),
            "limitMiB": placed.written_limit_mib,
            "ownAllocationMiB": own_by_index,
            "neighbourHeldMiB": shared,
            "fidelity": device_fidelity(out.result),
        }
        problems += judge_smi_view(
            name,
            listed,
            uuids,
            placed.gpus,
            placed.written_limit_mib,
            own_by_index,
            shared,
            device_fidelity(out.result),
        )
        if not shared:
            suite.not_judged(
                f"{name}'s used memory beside a neighbour",
                f"the neighbour was placed on {', '.join(neighbour.gpus)}, none of its GPUs",
            )
    late = stage.stop(neighbour.name)
    beat = late.step("heartbeat")
    kept = beat.get("ended_by") == "signal"
    seen["neighbour"] = {"heldMiB": held, "gpus": list(neighbour.gpus), "heldUntilStopped": kept}
    suite.evidence.fact("nvidiaSmi", seen)
    if not kept:
        # It may have ended before nvidia-smi looked: its memory was then no test of the view.
        suite.not_judged(
            "used memory beside a neighbour",
            f"the neighbour {neighbour.name} did not hold its memory until stopped "
            f"(it ended {late.status or late.phase})",
        )
    if problems:
        raise fail("; ".join(problems))


@check(
    id="cuda-visibility",
    level="MUST",
    statement="CUDA inside a fenced container MUST report exactly the devices assigned to it, each with a "
    "total memory equal to its gpu-memory.limit (transparent memory limits).",
    profiles=("node", "stack"),
    seed="000/4",
    needs=Needs(nodes=1, gpus=1, idle=True),
)
def test_cuda_visibility(suite: Suite) -> None:
    count = device_count(suite)
    stage = Stage(suite, gpus=count)
    placed = stage.place(
        "cuda",
        # What CUDA enumerates (count, UUIDs), then its memory view of each device it may use.
        plan("cuda", cuda_devices(), meminfo()),
        request_mib=stage.mib(SHARE),
        limit_mib=stage.mib(LIMIT_SHARE),
        devices=count,
    )
    out = stage.wait_ended(placed.name)
    require(out, ("ok",), "it only reads the devices CUDA reports")
    devices = out.step("meminfo").get("devices") or []
    totals = [int(d.get("total") or 0) // MiB for d in devices]
    listed = out.step("cuda-devices").get("devices") or []
    uuids = [str(d.get("uuid") or "") for d in listed]
    suite.evidence.fact(
        "cuda",
        {
            "enumerated": [
                {
                    "i": d.get("i"),
                    "uuid": d.get("uuid"),
                    "name": d.get("name"),
                    "totalMiB": int(d.get("total") or 0) // MiB,
                }
                for d in listed
            ],
            "enumeratedCount": len(listed),
            "devices": devices,
            "totalMiB": totals,
            "assigned": list(placed.gpus),
            "limitMiB": placed.written_limit_mib,
        },
    )
    suite.not_judged(
        "the total memory in CUDA's device properties (totalGlobalMem)",
        "whether a memory limit changes it is not established; each device's total is judged from "
        "CUDA's memory view (cudaMemGetInfo) instead",
    )
    problems = []
    assigned = sorted(placed.gpus)
    if len(listed) != len(placed.gpus) or sorted(uuids) != assigned:
        unassigned = [
            f"{u} ({int(d.get('total') or 0) // MiB} MiB)"
            for u, d in zip(uuids, listed, strict=True)
            if u not in assigned
        ]
        problems.append(
            f"CUDA enumerates {len(listed)} device(s) ({', '.join(uuids) or 'none'}), but "
            f"{len(placed.gpus)} were assigned ({', '.join(placed.gpus)})"
            + (f": it also lists GPUs not assigned to it: {', '.join(unassigned)}" if unassigned else "")
        )
    if len(devices) != len(placed.gpus):
        problems.append(
            f"CUDA's memory view reports {len(devices)} device(s), but {len(placed.gpus)} were assigned"
        )
    wrong = [(i, t) for i, t in enumerate(totals) if t != placed.written_limit_mib]
    if wrong:
        problems.append(
            "total memory "
            + ", ".join(f"{t} MiB on device {i}" for i, t in wrong)
            + f", expected its limit of {placed.written_limit_mib} MiB"
        )
    if problems:
        raise fail(f"{placed.name}: " + "; ".join(problems))

"""Learning a node's GPU UUIDs the way a real cluster allows: a device-discovery Pod.

A real GPU node carries GPU feature discovery's labels (count, memory, product) and no UUIDs
(docs/contract.md §5). Whoever must name a node's GPUs by UUID (a scheduler that writes
``gpus.devices`` as UUIDs, the suite when it places Pods itself or judges identities) learns them as
KAI's reservation Pods do: a Pod bound to the node that gets its GPUs whole from the device plugin
(``nvidia.com/gpu``) and lists what the container sees with ``nvidia-smi -L``
(``python -m workloads.discover`` writes that list to the termination message, which every cluster
returns through the API, logs API or not).

This module holds what the parties share: the Pod (``discovery_pod``), reading its answer
(``discovered``, ``parse_gpu_list``). Creating, waiting and cleaning up are each party's own.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

DISCOVERY_COMMAND: Final = ("python", "-m", "workloads.discover")
LABEL_DISCOVERY: Final = "gpuconf.io/device-discovery"
"""Marks a discovery Pod (its value: the node), so that its owner finds and deletes it."""
CONTAINER: Final = "discover"
WHOLE_GPU: Final = "nvidia.com/gpu"

# nvidia-smi -L: "GPU 0: NVIDIA H200 (UUID: GPU-1b2c...)"; MIG devices are indented lines of their own.
_GPU_LINE: Final = re.compile(r"^GPU (?P<index>\d+): (?P<name>.*?) \(UUID: (?P<uuid>GPU-[0-9A-Za-z-]+)\)\s*$")


@dataclass(frozen=True)
class Discovered:
    """What a finished discovery Pod says: the UUIDs in the container's order, or why not."""

    uuids: tuple[str, ...]
    problem: str = ""


def discovery_pod(
    name: str, node: str, gpus: int, image: str, labels: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """A Pod bound to ``node`` (``nodeName``: no scheduler involved) that asks the device plugin for
    ``gpus`` whole GPUs and lists them. It must run on an idle node, so that it gets every GPU."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {**dict(labels or {}), LABEL_DISCOVERY: node}},
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "tolerations": [{"operator": "Exists"}],
            "containers": [
                {
                    "name": CONTAINER,
                    "image": image,
                    "command": list(DISCOVERY_COMMAND),
                    "resources": {"limits": {WHOLE_GPU: str(gpus)}},
                    "terminationMessagePolicy": "FallbackToLogsOnError",
                }
            ],
        },
    }


def parse_gpu_list(text: str) -> tuple[str, ...]:
    """The UUIDs of ``nvidia-smi -L``'s GPU lines, in order (MIG lines and anything else ignored)."""
    return tuple(m.group("uuid") for m in map(_GPU_LINE.match, text.splitlines()) if m)


def discovered(pod: Mapping[str, Any] | None, gpus: int) -> Discovered | None:
    """The answer of a discovery Pod once it has ended; None while it has not."""
    status = (pod or {}).get("status") or {}
    phase = status.get("phase")
    if phase not in ("Succeeded", "Failed"):
        return None
    message = ""
    for entry in status.get("containerStatuses") or ():
        if entry.get("name") == CONTAINER:
            message = str(((entry.get("state") or {}).get("terminated") or {}).get("message") or "")
    uuids = parse_gpu_list(message)
    if phase != "Succeeded":
        return Discovered((), f"the discovery Pod failed: {message.strip()[:300] or 'no message'}")
    if len(uuids) != gpus:
        return Discovered(
            uuids, f"nvidia-smi -L listed {len(uuids)} GPU(s) where the node's labels say {gpus}"
        )
    return Discovered(uuids)

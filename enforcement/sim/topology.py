"""The GPUs of a simulated node: from a compact command-line spec or a JSON file, with stable UUIDs.

UUIDs are derived from the node name and GPU index (UUID v5), not drawn at random: the node labels,
the scheduler's ``gpus.devices`` annotation and the device server must agree on them, and a device
server restarted for the same node must come back with the same GPUs.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .messages import GpuSpec

DEFAULT_PRODUCT = "NVIDIA H100 80GB HBM3"
_UUID_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "https://gpuconf/simulated-gpu")


class TopologyError(ValueError):
    """A GPU spec or topology file that cannot describe a node."""


def gpu_uuid(node: str, index: int) -> str:
    """The UUID of simulated GPU ``index`` of ``node``, stable across runs."""
    return f"GPU-{uuid.uuid5(_UUID_NAMESPACE, f'{node}/{index}')}"


def make_gpus(node: str, memory_mib: list[int], product: str = DEFAULT_PRODUCT) -> tuple[GpuSpec, ...]:
    for i, mib in enumerate(memory_mib):
        if mib < 1:
            raise TopologyError(f"GPU {i} of node {node}: memory must be at least 1 MiB, got {mib}")
    return tuple(
        GpuSpec(index=i, uuid=gpu_uuid(node, i), product=product, memory_mib=mib)
        for i, mib in enumerate(memory_mib)
    )


_COUNT_X_MIB = re.compile(r"^(\d+)x(\d+)$")


def parse_gpus(node: str, spec: str, product: str = DEFAULT_PRODUCT) -> tuple[GpuSpec, ...]:
    """``COUNTxMIB`` (``4x81920``) or a comma list of MiB per GPU (``81920,40960``)."""
    text = spec.strip()
    m = _COUNT_X_MIB.match(text)
    try:
        if m:
            count, mib = int(m.group(1)), int(m.group(2))
            if count < 1:
                raise TopologyError(f"GPU spec {spec!r}: need at least one GPU")
            return make_gpus(node, [mib] * count, product)
        return make_gpus(node, [int(part) for part in text.split(",")], product)
    except ValueError as exc:
        if isinstance(exc, TopologyError):
            raise
        raise TopologyError(
            f"GPU spec {spec!r} is neither COUNTxMIB (4x81920) nor a list of MiB (81920,40960)"
        ) from None


def topology_from_mapping(data: Mapping[str, Any]) -> tuple[str, tuple[GpuSpec, ...]]:
    """``{"node": NAME, "gpus": [{"memory_mib": N, "product": P?, "uuid": U?}, ...]}``."""
    node = data.get("node")
    gpus = data.get("gpus")
    if not isinstance(node, str) or not node:
        raise TopologyError('topology: "node" must be a non-empty string')
    if not isinstance(gpus, list) or not gpus:
        raise TopologyError('topology: "gpus" must be a non-empty list')
    out = []
    for i, g in enumerate(gpus):
        if not isinstance(g, dict) or set(g) - {"memory_mib", "product", "uuid"}:
            raise TopologyError(f"topology: gpus[{i}] must be an object with memory_mib, product?, uuid?")
        mib = g.get("memory_mib")
        if not isinstance(mib, int) or isinstance(mib, bool) or mib < 1:
            raise TopologyError(f"topology: gpus[{i}].memory_mib must be an integer >= 1")
        out.append(
            GpuSpec(
                index=i,
                uuid=str(g.get("uuid") or gpu_uuid(node, i)),
                product=str(g.get("product") or DEFAULT_PRODUCT),
                memory_mib=mib,
            )
        )
    return node, tuple(out)


def load_topology(path: str | Path) -> tuple[str, tuple[GpuSpec, ...]]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise TopologyError(f"cannot read topology {path}: {exc}") from None
    if not isinstance(data, dict):
        raise TopologyError(f"topology {path}: expected a JSON object")
    return topology_from_mapping(data)

"""The environment a fenced container gets: the GPU Fractioning Operator's keys (docs/contract.md §5).

A pure function of the parsed fraction, the resolved GPUs and the backend's own additions, so
every contract case is a unit test and the probe uses exactly what the agent hands the runtime.

- ``NVIDIA_GPU_MEMORY_REQUEST`` / ``NVIDIA_GPU_MEMORY_LIMIT``: whole MiB, per device;
- ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT``: ``0=4096M,1=4096M``, one entry per *container-visible*
  ordinal (the order of ``gpus.devices``), from the limit; MPS reads ``M`` as MiB;
- ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``: only for sm-sharing with a portion (floor(portion x 100),
  at least 1; ``Fraction.active_thread_percentage`` computes it);
- ``CUDA_MPS_PIPE_DIRECTORY``: the MPS server of the container's mode (the backend says which);
- ``NVIDIA_VISIBLE_DEVICES``: the assigned GPUs as UUIDs, so an index, a UUID and a CDI name of
  the same GPU all become the same, unambiguous value.

The runtime applies these over the container's own environment (``Adjustment.env`` overrides),
so a container that sets ``NVIDIA_VISIBLE_DEVICES=all`` or its own pinned limit does not escape.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Final

from enforcement.contract import Fraction
from enforcement.implementations import NodePart, builtins

ENV_REQUEST: Final = "NVIDIA_GPU_MEMORY_REQUEST"
ENV_LIMIT: Final = "NVIDIA_GPU_MEMORY_LIMIT"
ENV_PINNED_LIMIT: Final = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
ENV_THREAD_PERCENTAGE: Final = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
ENV_PIPE_DIRECTORY: Final = "CUDA_MPS_PIPE_DIRECTORY"
ENV_VISIBLE_DEVICES: Final = "NVIDIA_VISIBLE_DEVICES"
CONTRACT_ENV: Final = (
    ENV_REQUEST,
    ENV_LIMIT,
    ENV_PINNED_LIMIT,
    ENV_THREAD_PERCENTAGE,
    ENV_PIPE_DIRECTORY,
    ENV_VISIBLE_DEVICES,
)


def pinned_limit(limit_mib: int, count: int) -> str:
    """``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` for ``count`` visible devices of ``limit_mib`` each."""
    return ",".join(f"{ordinal}={limit_mib}M" for ordinal in range(count))


def enforcement_env(
    fraction: Fraction,
    gpu_uuids: Sequence[str],
    pipe_directory: str,
    backend_env: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The container's enforcement environment; ``gpu_uuids`` in container-visible order.

    ``backend_env`` (the simulated device's socket and token, MPS's log directory) is added; it
    cannot replace a contract key, which is computed here and nowhere else.
    """
    env = {k: v for k, v in (backend_env or {}).items() if k not in CONTRACT_ENV}
    env[ENV_REQUEST] = str(fraction.request_mib)
    env[ENV_LIMIT] = str(fraction.limit_mib)
    env[ENV_PINNED_LIMIT] = pinned_limit(fraction.limit_mib, len(gpu_uuids))
    threads = fraction.active_thread_percentage
    if threads is not None:
        env[ENV_THREAD_PERCENTAGE] = str(threads)
    env[ENV_PIPE_DIRECTORY] = pipe_directory
    env[ENV_VISIBLE_DEVICES] = ",".join(gpu_uuids)
    return env


def dialect_env(
    part: NodePart,
    fraction: Fraction,
    gpu_uuids: Sequence[str],
    devices_written: str,
    pipe_directory: str,
    backend_env: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment an emulated implementation gives (``--emulate``): its dialect's names, unit
    and rounding, its pipe directories (where it names them), the visible devices as it writes them,
    and only the mechanisms it claims (docs/contract.md §9)."""
    d = part.env
    ours = set(CONTRACT_ENV) | set(d.names())
    env = {k: v for k, v in (backend_env or {}).items() if k not in ours}
    env[d.memory_request] = d.memory_value(fraction.request_mib)
    env[d.memory_limit] = d.memory_value(fraction.limit_mib)
    if d.pinned_limit and part.claims("pinned-mps-limits"):
        env[d.pinned_limit] = pinned_limit(fraction.limit_mib, len(gpu_uuids))
    threads = fraction.active_thread_percentage
    if d.thread_percentage and part.claims("compute-portion") and threads is not None:
        if fraction.mode in d.thread_cap_modes:
            env[d.thread_percentage] = str(threads)
    env[d.pipe_directory] = d.pipe_directories.get(fraction.mode, pipe_directory)
    verbatim = d.visible_devices_value == "verbatim"
    env[d.visible_devices] = devices_written.strip() if verbatim else ",".join(gpu_uuids)
    return env


@functools.cache
def emulated_part(name: str) -> NodePart:
    """The node part of built-in implementation ``name``; raises ``ValueError`` when it has none."""
    impl = builtins().get(name)
    if impl is None or impl.node is None:
        known = ", ".join(n for n, i in builtins().items() if i.node is not None)
        raise ValueError(f"--emulate {name!r}: not a built-in node implementation; known: {known}")
    return impl.node

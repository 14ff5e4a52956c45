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

from collections.abc import Mapping, Sequence
from typing import Final

from enforcement.contract import Fraction

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

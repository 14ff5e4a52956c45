"""How closely the simulated device imitates a real GPU: ``ideal`` or ``h200``.

``ideal`` is the device gpuconf always had: the allocation boundary lies exactly at the limit,
nothing is reserved per process, kernels cost only the time they are asked to take, and a pressure
refusal is a message of its own. A check that fails there fails because of what the scheduler or
the agent did, never because of device noise.

``h200`` is a **simulated H200** that is as unkind as a real one (docs/contract.md §10 gives every
size and its source):

- every allocation is charged in whole pages of ``granularity_bytes`` (2 MiB);
- each process that opens the device is charged a CUDA context of ``context_bytes``, counted
  against its limit and the device, and shown in its ``cudaMemGetInfo`` and in the device's used
  memory; the free memory a client sees is also bounded by what the GPU has left;
- a client within its guarantee on a full GPU gets an out-of-memory, as CUDA gives it, not the
  simulator's ``pressure`` refusal (the device still records the wait, so the agent sees pressure);
- kernels follow a cost model: each occupies a share of the SMs (``sm_fraction``); sm-sharing
  kernels that together ask for more than the whole GPU slow each other down in proportion, small
  ones run at full speed side by side; time-slicing clients take turns in slices of
  ``timeslice_s``, so their kernel spans stretch and overlap as on a real GPU;
- devices are known by UUID only: the Nodes carry GPU feature discovery's labels and nothing of
  gpuconf's (``node_conveniences``), and the simulated ``nvidia-smi -L`` lists the UUIDs a
  container was given.

Nothing here pretends to be a GPU: logs, results and reports name it "simulated H200".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from workloads.plan import MiB

IDEAL: Final = "ideal"
H200: Final = "h200"
FIDELITIES: Final = (IDEAL, H200)


@dataclass(frozen=True)
class Fidelity:
    name: str
    label: str
    """How logs and reports name the device."""
    granularity_bytes: int = 1
    context_bytes: int = 0
    pressure_as_oom: bool = False
    kernel_cost_model: bool = False
    timeslice_s: float | None = None
    """Time-slicing turn length; None: a kernel keeps the GPU for its whole duration."""
    agent_evict_by: str = "api"
    """How the sandbox's reference agent evicts in this fidelity (its ``--evict-by``)."""
    agent_reaction_period_s: float = 0.0
    """The sandbox's reference agent's reaction period in this fidelity (its ``--reaction-period``)."""
    node_conveniences: bool = True
    """Whether the sandbox's Nodes carry gpuconf's own conveniences (the annotation
    ``gpuconf.io/gpu-uuids``, the labels ``gpuconf.io/simulated`` and ``gpuconf.io/pool``). Without
    them a Node carries only what a real GPU node does, and every party learns the GPUs' UUIDs as on
    a real cluster (``enforcement.discovery``)."""

    def charge(self, nbytes: int) -> int:
        """What an allocation of ``nbytes`` costs the ledger: whole pages."""
        g = self.granularity_bytes
        return -(-nbytes // g) * g


H200_GRANULARITY_BYTES: Final = 2 * MiB
"""cudaMalloc's allocation granularity on Hopper (docs/contract.md §10, [CUDA-VMM])."""
H200_CONTEXT_BYTES: Final = 512 * MiB
"""A CUDA context's device memory on an H200 with lazy loading (docs/contract.md §10; to be set
from ``make gpu-check`` once it has run on a real H200)."""
H200_TIMESLICE_S: Final = 0.004
"""Time-slicing turn length (docs/contract.md §10: a few milliseconds; gpuconf's choice)."""
H200_AGENT_REACTION_S: Final = 1.0
"""The reference agent's reaction period in the h200 sandbox: seconds rather than milliseconds."""

SM_COUNT: Final = 132
"""SMs of an H200 SXM (docs/contract.md §10)."""


PROFILES: Final = {
    IDEAL: Fidelity(name=IDEAL, label="simulated GPU"),
    H200: Fidelity(
        name=H200,
        label="simulated H200",
        granularity_bytes=H200_GRANULARITY_BYTES,
        context_bytes=H200_CONTEXT_BYTES,
        pressure_as_oom=True,
        kernel_cost_model=True,
        timeslice_s=H200_TIMESLICE_S,
        agent_evict_by="cuda-error",
        agent_reaction_period_s=H200_AGENT_REACTION_S,
        node_conveniences=False,
    ),
}


def fidelity(name: str) -> Fidelity:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"unknown fidelity {name!r}; choose one of {', '.join(FIDELITIES)}") from None

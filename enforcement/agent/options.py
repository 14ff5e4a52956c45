"""The agent's settings, and the faults it can be told to commit on purpose.

Faults exist for self-validation (docs/architecture.md §7): a conformance check is only worth something if it
fails against a broken node, so the reference agent can be broken in named, documented ways and
the suite (and ``gpuconf probe``) must catch each. A fault never turns on by accident: it is only
ever set by ``--fault NAME`` or by a test.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

FAULTS: Final[dict[str, str]] = {
    "no-hard-limit": "applies no hard limit: a container's limit becomes its GPUs' whole memory",
    "clobber-neighbour": "a container's allocation past its hard limit is refused, but the pages it asked "
    "for are first scrubbed out of its GPU neighbours' memory (they read back zero)",
    "limit-first-device-only": "a container given several GPUs is fenced on the first only: on the others "
    "its hard limit is the GPU's whole memory",
    "limit-from-request": "applies the request as the hard limit: no burst up to the limit",
    "no-eviction": "the evictor never evicts anyone",
    "evict-guaranteed": "under pressure the evictor evicts the waiting clients (within their guarantee)",
    "evict-without-pressure": "the evictor evicts every borrower above its request, pressure or not",
    "evict-all-borrowers": "under pressure the evictor evicts every borrower above its request on the GPU, "
    "though evicting one already covers the shortfall",
    "evict-guaranteed-for-borrower": "borrowers above their request that have filled a GPU (less than 2 % of "
    "it free, nobody within a guarantee waiting) get the client within its guarantee holding the most "
    "there evicted, as if a borrower's growth were a guaranteed claim",
    "evict-when-full": "the evictor evicts the borrower above its request holding the most on a GPU whose "
    "free memory drops under 10 % of it, though nobody within a guarantee lacks memory (no pressure)",
    "no-mode-guard": "mixes time-slicing and sm-sharing on one GPU instead of refusing",
    "mode-guard-one-way": "refuses an sm-sharing container on a GPU running time-slicing, but starts a "
    "time-slicing one (or one with no mode) on a GPU running sm-sharing",
    "forget-modes-after-restart": "a restarted agent re-adopts its containers' fences but not which mode "
    "each GPU runs: a container of the other mode, created after the restart, is started beside them",
    "lenient-after-restart": "a restarted agent that re-adopted running containers starts a malformed "
    "contract unfenced instead of refusing it (fail-open from then on)",
    "ignore-mode": "every container runs time-slicing, whatever its gpu-compute.mode asks",
    "shared-fault-domain": "time-slicing containers of a GPU share one fault domain, as sm-sharing ones "
    "do: a device fault in one ends its neighbours (they still take turns)",
    "whole-gpu-visibility": "every fractional container sees every GPU of the node, unlimited",
    "full-visibility": "every fractional container sees every GPU of the node (each with its own limit)",
    "smi-device-used": "a fractional container's nvidia-smi reports its GPUs' whole used memory, its "
    "neighbours' included, instead of its own (its NVML view counts the whole device)",
    "fence-whole-pod": "a Pod's fraction fences every container of it: a sidecar without gpu annotations "
    "gets the enforcement environment and its own share of the GPU",
    "wrong-visible-devices": "NVIDIA_VISIBLE_DEVICES names other GPUs than the container is fenced on",
    "leak-on-exit": "a stopped container's memory and guarantee are never released",
    "no-recovery": "a restarted agent adopts nothing the backend still holds",
    "fail-open": "a malformed contract starts the container unfenced (as --fail-open)",
    "fail-open-silently": "a malformed contract starts the container unfenced, with no Event saying so",
    "accept-bare-number": "a bare number below 1 MiB (4096) is read as bytes, rounded up to 1 MiB and "
    "fenced with, instead of refused (memory-minimum)",
    "blank-mode-default": "a present but blank gpu-compute.mode (empty or whitespace) is taken as the "
    "default (time-slicing), as an older operator version did, instead of refused as malformed (mode-word)",
    "vague-refusal": "a malformed contract is refused, but the message only echoes the values: it names "
    "neither the key nor the rule",
    "ready-without-backend": "the node condition stays True while the GPU backend is unavailable (the agent "
    "cannot fence, and says it can)",
    "start-while-unfenced": "while the GPU backend is unavailable, a fractional container is started anyway, "
    "with no enforcement (and no Event saying so)",
    "evict-borrowers-late": "the evictor evicts any borrower that has stayed above its request for more than "
    "20 s, pressure or not (a reconcile loop enforcing the request as a limit, late)",
    "context-outside-limit": "a container's CUDA context is charged to the device and shown in its used "
    "memory, but not counted against its hard limit: it holds its limit plus its context (the ideal "
    "device, which has no context, is given one of 64 MiB for it)",
    "free-sub-page": "an allocation smaller than a page (2 MiB) is granted but not charged against the limit "
    "or the device",
    "cuda-enumerates-all": "CUDA in a fractional container enumerates every GPU of the node (its own first, "
    "the others whole), while its environment and nvidia-smi show only the assigned ones",
}

DEVICE_FAULTS: Final = ("context-outside-limit", "free-sub-page", "cuda-enumerates-all")
"""The faults the agent has the device commit for its containers (``ClientRequest.device_faults``):
where the device applies the rule they break (``enforcement.sim.model.DEVICE_FAULTS``)."""
LATE_EVICTION_S: Final = 20.0
"""The fault ``evict-borrowers-late`` evicts a borrower that has stayed above its request this long."""

FAULT_ALIASES: Final[dict[str, str]] = {
    "no-borrowing": "limit-from-request",
    "no-release": "leak-on-exit",
}
"""Earlier names of faults, still accepted wherever a fault is named; each means its canonical name."""


def canonical_fault(name: str) -> str:
    """The canonical name of fault ``name`` (an alias's target); any other name unchanged."""
    return FAULT_ALIASES.get(name, name)


EVICT_BY = ("api", "cuda-error", "kill")
"""The agent's eviction mechanisms (``AgentOptions.evict_by``)."""


@dataclass(frozen=True)
class AgentOptions:
    """Everything that changes what the agent does, in one value."""

    node: str
    """The Node this agent serves (``spec.nodeName`` of its Pods)."""
    fail_open: bool = False
    """Start a container whose contract is malformed, unfenced, with a Warning Event (default: refuse)."""
    evict_interval_s: float = 0.1
    """How often the evictor reads the backend's pressure; the reaction target is 1 s."""
    health_interval_s: float = 1.0
    """How often the backend's health is checked for the node condition."""
    heartbeat_s: float = 60.0
    """The node condition is re-written at least this often, so its heartbeat shows the agent alive."""
    resync_s: float = 300.0
    """The Pod watch lists again this often (a list is what reveals a deletion nobody saw)."""
    eviction_retry_s: float = 2.0
    """After the Eviction API refused (429, an API error), wait this long before trying that Pod again."""
    nri_plugin_timeout_s: float | None = None
    """When set, the node's containers are fenced through the NRI plugin (``enforcement/nri``): the
    node condition is False unless the plugin reported, within this many seconds, that it is
    registered with the container runtime. None: the hook's caller is the simulated kubelet."""
    emulate: str = ""
    """A built-in node implementation whose mechanisms the agent reproduces (``--emulate``): its
    condition, env dialect and the mechanisms it claims, while enforcing the same effects; empty:
    the reference agent's own (``enforcement.implementations``)."""
    evict_by: str = "api"
    """How a borrower is evicted under pressure (``EVICT_BY``): ``api``, the Eviction API (its Pod is
    deleted); ``cuda-error``, its memory is reclaimed and its next allocation or kernel fails with a
    CUDA-style error (as a driver that enforces soft limits may do it); ``kill``, its processes are
    killed. The suite judges eviction by its effect, whichever is used."""
    reaction_period_s: float = 0.0
    """How long pressure must have lasted before the agent evicts (a real agent reacts in seconds,
    not milliseconds; the sandbox's h200 fidelity uses 1 s)."""
    faults: frozenset[str] = field(default_factory=frozenset)
    """Seeded faults (``FAULTS``, or an alias of ``FAULT_ALIASES``: kept as its canonical name);
    empty in every real deployment."""

    def __post_init__(self) -> None:
        if self.evict_by not in EVICT_BY:
            raise ValueError(f"unknown eviction mechanism {self.evict_by!r}; known: {', '.join(EVICT_BY)}")
        if self.reaction_period_s < 0:
            raise ValueError(f"the reaction period must not be negative, got {self.reaction_period_s}")
        object.__setattr__(self, "faults", frozenset(canonical_fault(f) for f in self.faults))
        unknown = sorted(set(self.faults) - set(FAULTS))
        if unknown:
            raise ValueError(f"unknown agent fault(s) {', '.join(unknown)}; known: {', '.join(FAULTS)}")

    def has(self, fault: str) -> bool:
        return fault in self.faults

    @property
    def fails_open(self) -> bool:
        return self.fail_open or self.has("fail-open") or self.has("fail-open-silently")

"""The soft-limit evictor: keeps every GPU's guarantees by evicting borrowers under pressure.

docs/contract.md §6: usage above the request (the guarantee) is the pressure zone; such a client is an
eviction candidate and is evicted only under real memory pressure, and a client within its
guarantee never is. The backend measures pressure (``Backend.pressure``); this module decides
and acts:

- ``choose_victims`` is pure: per GPU under pressure, candidates in order of overage (largest
  first), skipping any whose overage is not positive, until the memory they hold covers the
  shortfall; plus, on any GPU, clients above their *hard* limit (possible only where the backend
  could not apply it). Evicting a client frees all it holds on that GPU, so its whole usage
  counts toward the shortfall, not only its overage.
- ``victims_for_growth`` is the seeded fault ``evict-guaranteed-for-borrower`` only (pure as well):
  it reads a borrower's growth into a full GPU as if it were a guaranteed claim.
- ``victims_when_full`` is the seeded fault ``evict-when-full`` only (pure as well): it reads a
  nearly full GPU as pressure, though nobody within a guarantee lacks memory.
- ``victims_over_long`` is the seeded fault ``evict-borrowers-late`` only (pure as well): a
  borrower that has stayed above its request for ``LATE_EVICTION_S`` goes, pressure or not (a
  reconcile loop that enforces the request as a limit, late).
- ``Evictor`` polls every ``evict_interval_s`` (100 ms by default; the target is a reaction
  within 1 s), evicts the victim's Pod through the **Eviction API** (so the Pod is deleted with
  its disruption budget honoured, and the runtime stops it), then reclaims its memory in the
  backend at once: the guaranteed client is waiting now, the kubelet's grace period is not its
  problem. An Event on the evicted Pod names the GPU, the usage, the guarantee and whom it was
  evicted for. A refused eviction (429: a PodDisruptionBudget) is reported and retried after
  ``eviction_retry_s``; meanwhile the next candidate is considered.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from enforcement.agent import kube as k
from enforcement.agent.handler import AgentCore
from enforcement.agent.options import LATE_EVICTION_S
from enforcement.backends import BackendUnavailable, GpuPressure, Usage
from workloads.plan import MiB

FULL_SHARE = 0.02
"""The fault ``evict-guaranteed-for-borrower`` counts a GPU with less than this share free as filled
(a borrower growing until out of memory stops within one granule of the edge)."""
NEARLY_FULL_SHARE = 0.1
"""The fault ``evict-when-full`` evicts a borrower from a GPU with less than this share free."""


@dataclass(frozen=True)
class Victim:
    client: str
    gpu: str
    reason: Literal["pressure", "hard-limit"]
    used_bytes: int
    guarantee_bytes: int
    hard_limit_bytes: int
    for_clients: tuple[str, ...]
    """The clients within their guarantee that need the memory."""


def choose_victims(
    pressures: Iterable[GpuPressure],
    skip: Iterable[str] = (),
    *,
    evict_guaranteed: bool = False,
    without_pressure: bool = False,
    every_borrower: bool = False,
) -> list[Victim]:
    """Whom to evict now (see the module docstring). ``skip``: clients not to choose this round.

    ``evict_guaranteed``, ``without_pressure`` and ``every_borrower`` are the seeded faults
    ``evict-guaranteed`` (it picks the waiting clients), ``evict-without-pressure`` (every borrower,
    pressure or not) and ``evict-all-borrowers`` (under pressure, every borrower, however small the
    shortfall).
    """
    skipped = set(skip)
    chosen: list[Victim] = []
    taken: set[str] = set()
    for p in pressures:
        for c in p.over_limit:
            if c.client not in skipped and c.client not in taken:
                taken.add(c.client)
                chosen.append(
                    Victim(
                        c.client,
                        p.uuid,
                        "hard-limit",
                        c.used_bytes,
                        c.guarantee_bytes,
                        c.hard_limit_bytes,
                        (),
                    )
                )
        if without_pressure and not p.under_pressure:
            for c in p.candidates:
                if c.overage_bytes > 0 and c.client not in skipped and c.client not in taken:
                    taken.add(c.client)
                    chosen.append(
                        Victim(
                            c.client,
                            p.uuid,
                            "pressure",
                            c.used_bytes,
                            c.guarantee_bytes,
                            c.hard_limit_bytes,
                            (),
                        )
                    )
            continue
        if not p.under_pressure:
            continue
        if evict_guaranteed:
            for name in p.waiting:
                if name not in skipped and name not in taken:
                    taken.add(name)
                    chosen.append(Victim(name, p.uuid, "pressure", 0, 0, 0, p.waiting))
            continue
        # The fault evict-all-borrowers: the shortfall never runs out, so every borrower goes.
        need = p.shortfall_bytes if not every_borrower else sum(c.used_bytes for c in p.candidates) + 1
        for c in sorted(p.candidates, key=lambda c: (-c.overage_bytes, c.client)):
            if need <= 0:
                break
            if c.overage_bytes <= 0 or c.client in skipped:
                continue  # never a client within its guarantee
            if c.client in taken:  # already chosen on another GPU: its memory here goes too
                need -= c.used_bytes
                continue
            taken.add(c.client)
            chosen.append(
                Victim(
                    c.client,
                    p.uuid,
                    "pressure",
                    c.used_bytes,
                    c.guarantee_bytes,
                    c.hard_limit_bytes,
                    p.waiting,
                )
            )
            need -= c.used_bytes
    return chosen


def victims_for_growth(
    pressures: Iterable[GpuPressure], usage: Usage, skip: Iterable[str] = ()
) -> list[Victim]:
    """The seeded fault ``evict-guaranteed-for-borrower``, never the reference's behaviour: on each GPU
    that borrowers above their request have filled (less than ``FULL_SHARE`` of it free) while nobody
    within a guarantee waits, the client within its guarantee holding the most there, as if the
    borrowers' growth were a guaranteed claim. (A borrower's growth is no claim: it borrows only idle
    memory, docs/contract.md §6.)"""
    skipped = set(skip)
    capacity = {g.uuid: g.capacity_bytes for g in usage.gpus}
    chosen: list[Victim] = []
    for p in pressures:
        cap = capacity.get(p.uuid, 0)
        borrowers = tuple(c.client for c in p.candidates if c.overage_bytes > 0)
        if p.under_pressure or not borrowers or not cap or p.free_bytes >= cap * FULL_SHARE:
            continue
        within = [
            (share.used_bytes, client.name, share)
            for client in usage.clients
            for share in client.gpus
            if share.uuid == p.uuid
            and 0 < share.used_bytes <= share.guarantee_bytes
            and client.name not in skipped
        ]
        if not within:
            continue
        used, name, share = max(within, key=lambda w: (w[0], w[1]))
        chosen.append(
            Victim(name, p.uuid, "pressure", used, share.guarantee_bytes, share.hard_limit_bytes, borrowers)
        )
    return chosen


def victims_when_full(
    pressures: Iterable[GpuPressure], usage: Usage, skip: Iterable[str] = ()
) -> list[Victim]:
    """The seeded fault ``evict-when-full``, never the reference's behaviour: on each GPU whose free
    memory is under ``NEARLY_FULL_SHARE`` of it while nobody within a guarantee waits, the borrower
    with the largest overage, as if a full GPU were pressure. (Pressure is a guarantee that cannot be
    met; borrowers that fill a GPU take only idle memory, docs/contract.md §6.)"""
    skipped = set(skip)
    capacity = {g.uuid: g.capacity_bytes for g in usage.gpus}
    chosen: list[Victim] = []
    for p in pressures:
        cap = capacity.get(p.uuid, 0)
        if p.under_pressure or p.waiting or not cap or p.free_bytes >= cap * NEARLY_FULL_SHARE:
            continue
        borrowers = [c for c in p.candidates if c.overage_bytes > 0 and c.client not in skipped]
        if not borrowers:
            continue
        c = max(borrowers, key=lambda c: (c.overage_bytes, c.client))
        chosen.append(
            Victim(c.client, p.uuid, "pressure", c.used_bytes, c.guarantee_bytes, c.hard_limit_bytes, ())
        )
    return chosen


def victims_over_long(
    pressures: Iterable[GpuPressure], over_since: dict[str, float], now: float, skip: Iterable[str] = ()
) -> list[Victim]:
    """The seeded fault ``evict-borrowers-late``, never the reference's behaviour: every borrower that
    has stayed above its request for more than ``LATE_EVICTION_S`` (``over_since``: when each was
    first seen above it; updated here, a client back within its request forgotten), pressure or not.
    (A borrower keeps what it borrowed for as long as nobody within a guarantee needs it,
    docs/contract.md §6.)"""
    skipped = set(skip)
    over = {c.client: (p, c) for p in pressures for c in p.candidates if c.overage_bytes > 0}
    for client in [c for c in over_since if c not in over]:
        del over_since[client]
    chosen: list[Victim] = []
    for client, (p, c) in sorted(over.items()):
        since = over_since.setdefault(client, now)
        if now - since > LATE_EVICTION_S and client not in skipped:
            chosen.append(
                Victim(client, p.uuid, "pressure", c.used_bytes, c.guarantee_bytes, c.hard_limit_bytes, ())
            )
    return chosen


def _mib(n: int) -> str:
    return f"{n / MiB:.0f} MiB" if n % MiB == 0 or n >= 10 * MiB else f"{n} bytes"


class Evictor:
    """The polling loop around ``choose_victims`` (see the module docstring)."""

    def __init__(self, core: AgentCore) -> None:
        self.core = core
        self._retry_at: dict[str, float] = {}
        self._pressure_since: dict[str, float] = {}
        self._victim_since: dict[str, float] = {}
        self._over_since: dict[str, float] = {}
        self._unknown_logged: set[str] = set()

    def run(self, stop: threading.Event) -> None:
        interval = self.core.options.evict_interval_s
        while not stop.is_set():
            try:
                self.run_once()
            except Exception as exc:  # noqa: BLE001 - one bad round must not end eviction for good
                self.core.log(f"evictor: {type(exc).__name__}: {exc}")
            stop.wait(interval)

    def run_once(self) -> list[Victim]:
        """One round: read pressure, evict; returns who was evicted."""
        core = self.core
        if core.options.has("no-eviction"):
            return []
        try:
            pressures = core.backend.pressure()
        except BackendUnavailable:
            return []
        now = time.monotonic()
        for p in pressures:
            if p.under_pressure:
                self._pressure_since.setdefault(p.uuid, now)
            else:
                self._pressure_since.pop(p.uuid, None)
        skip = {c for c, at in self._retry_at.items() if at > now}
        victims = choose_victims(
            pressures,
            skip,
            evict_guaranteed=core.options.has("evict-guaranteed"),
            without_pressure=core.options.has("evict-without-pressure"),
            every_borrower=core.options.has("evict-all-borrowers"),
        )
        if core.options.has("evict-borrowers-late"):
            victims += victims_over_long(pressures, self._over_since, now, skip | {v.client for v in victims})
        growth, full = core.options.has("evict-guaranteed-for-borrower"), core.options.has("evict-when-full")
        if growth or full:
            try:
                usage = core.backend.usage()
            except BackendUnavailable:
                usage = None
            if usage is not None and growth:
                victims += victims_for_growth(pressures, usage, skip | {v.client for v in victims})
            if usage is not None and full:
                victims += victims_when_full(pressures, usage, skip | {v.client for v in victims})
        done: list[Victim] = []
        waited = {p.uuid: max(p.waiting_s, now - self._pressure_since.get(p.uuid, now)) for p in pressures}
        period = core.options.reaction_period_s
        if period > 0:
            # A declared reaction period: the agent reacts this long (seconds, as a real agent does)
            # after it first has a reason to evict a client: the pressure on its GPU began, or it was
            # first chosen (whatever chose it, a seeded fault included: the period delays, never hides).
            chosen = {v.client for v in victims}
            self._victim_since = {c: t for c, t in self._victim_since.items() if c in chosen}
            for v in victims:
                self._victim_since.setdefault(v.client, now)

            def age(v: Victim) -> float:
                pressure = waited.get(v.gpu, 0.0) if v.reason == "pressure" else 0.0
                return max(pressure, now - self._victim_since[v.client])

            victims = [v for v in victims if age(v) >= period]
        for victim in victims:
            if self._evict(victim, waited.get(victim.gpu, 0.0)):
                done.append(victim)
        return done

    def _evict(self, victim: Victim, waited_s: float) -> bool:
        core = self.core
        tracked = core.registry.get(victim.client)
        if tracked is None:
            if victim.client not in self._unknown_logged:
                self._unknown_logged.add(victim.client)
                core.log(
                    f"evictor: {victim.client} is a candidate but not a container this agent fences; "
                    "left alone"
                )
            return False
        ref = tracked.ref
        if core.options.evict_by == "cuda-error":
            return self._revoke(victim, tracked, waited_s)
        if core.options.evict_by == "kill":
            killed = self._kill(victim)
            core.log(f"evictor: killed {victim.client} (pids {', '.join(map(str, killed)) or 'none seen'})")
            outcome = "evicted"
        else:
            try:
                outcome = core.kube.evict(ref)
            except k.KubeError as exc:
                core.metrics.inc("gpu_fractioning_agent_eviction_failures_total")
                self._retry_at[victim.client] = time.monotonic() + core.options.eviction_retry_s
                core.log(f"evictor: could not evict Pod {ref.namespace}/{ref.pod}: {exc}")
                return False
        if outcome == "blocked":
            core.metrics.inc("gpu_fractioning_agent_eviction_failures_total")
            self._retry_at[victim.client] = time.monotonic() + core.options.eviction_retry_s
            core.kube.event(
                ref,
                k.WARNING,
                k.REASON_EVICTION_BLOCKED,
                f"GPU {victim.gpu} of node {core.node} is under memory pressure and this Pod borrows beyond "
                "its guarantee, but the Eviction API refused to evict it (a PodDisruptionBudget); retrying",
            )
            return False
        # Evicted (or already gone): reclaim every client of the Pod now, not after its grace period.
        for other in core.registry.by_pod(ref.pod_uid):
            core.registry.remove(other.client)
            core._detach(other.client, "evicted")
        self._retry_at.pop(victim.client, None)
        core.metrics.inc("gpu_fractioning_agent_evictions_total", reason=victim.reason)
        core.metrics.set("gpu_fractioning_agent_last_eviction_reaction_seconds", round(waited_s, 4))
        if outcome == "evicted":
            core.kube.event(ref, k.WARNING, k.REASON_EVICTED, self._message(victim))
        core.log(
            f"evicted Pod {ref.namespace}/{ref.pod} ({victim.reason}, GPU {victim.gpu}, {waited_s:.3f} s)"
        )
        return True

    def _revoke(self, victim: Victim, tracked: Any, waited_s: float) -> bool:
        """``--evict-by cuda-error``: the device reclaims the borrower's memory and fails its next call."""
        core = self.core
        ref = tracked.ref
        try:
            core.backend.detach(victim.client, "revoked")
        except BackendUnavailable as exc:
            core.log(f"evictor: could not revoke {victim.client} now: {exc}")
            return False
        core.metrics.inc("gpu_fractioning_agent_evictions_total", reason=victim.reason)
        core.metrics.set("gpu_fractioning_agent_last_eviction_reaction_seconds", round(waited_s, 4))
        core.kube.event(ref, k.WARNING, k.REASON_EVICTED, self._message(victim) + " (by a CUDA error)")
        core.log(
            f"evicted {victim.client} of Pod {ref.namespace}/{ref.pod} by CUDA error ({victim.reason}, "
            f"GPU {victim.gpu}, {waited_s:.3f} s)"
        )
        return True

    def _kill(self, victim: Victim) -> list[int]:
        """``--evict-by kill``: SIGKILL every process the backend counts as the client's."""
        try:
            usage = self.core.backend.usage().client(victim.client)
        except BackendUnavailable:
            usage = None
        killed = []
        for pid in usage.pids if usage is not None else ():
            try:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
            except OSError:
                pass
        return killed

    def _message(self, victim: Victim) -> str:
        core = self.core
        if victim.reason == "hard-limit":
            return (
                f"evicted: uses {_mib(victim.used_bytes)} on GPU {victim.gpu} of node {core.node}, above "
                f"its hard limit of {_mib(victim.hard_limit_bytes)} (the backend could not apply the limit)"
            )
        owed = []
        for name in victim.for_clients:
            t = core.registry.get(name)
            owed.append(f"Pod {t.ref.namespace}/{t.ref.pod}" if t is not None else name)
        needed_by = ", ".join(owed) or "a client within its guarantee"
        return (
            f"evicted under GPU memory pressure on GPU {victim.gpu} of node {core.node}: it used "
            f"{_mib(victim.used_bytes)}, {_mib(max(0, victim.used_bytes - victim.guarantee_bytes))} "
            f"above its guarantee of {_mib(victim.guarantee_bytes)} (borrowed memory is reclaimed under "
            f"pressure, largest overage first); needed by {needed_by}"
        )

"""The agent's few Kubernetes calls, behind one Protocol: evict, record an Event, set the node condition.

The agent's logic (admission, eviction, recovery) is unit-tested and run by ``gpuconf probe``
without any cluster, so it speaks to ``Kube``, not to the client library. ``KubeClient`` is the
real one (``enforcement.kubeapi.CoreApi`` on the official client's ``ApiClient``, without
``CoreV1Api``'s models; each call is one the agent's ClusterRole grants, see ``rbac``);
``RecordingKube`` keeps Events and evictions in memory for tests and the probe.

Event reasons (all ``Warning``; the runtime records none for the agent's refusals):

| reason | when |
|---|---|
| ``GPUFractionRejected`` | fail-closed refusal of a malformed contract; the message names key and rule |
| ``GPUFractionUnfenced`` | fail-open start of a container whose contract is malformed |
| ``GPUModeConflict`` | the container's compute mode conflicts with its GPU's; names both Pods' modes |
| ``GPUBackendUnavailable`` | the GPU backend could not be reached; the container is not started |
| ``GPUFractionEvicted`` | evicted under GPU memory pressure (or above its hard limit) |
| ``GPUFractionEvictionBlocked`` | the Eviction API refused (a PodDisruptionBudget) |
| ``GPUFenceLost`` | the backend lost a running container's client (device restarted) |

Events go through ``enforcement.events.EventRecorder`` (the one recorder of every gpuconf
component): aggregated like the kubelet's recorder, best effort, and queued here, since an Event
is never worth failing a container for, nor worth making the runtime wait for its answer while the
API server is slow. What is remembered for aggregation is dropped when the Pod is deleted.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final, Literal, Protocol

from enforcement.events import NORMAL as NORMAL  # the event types, for the agent's modules
from enforcement.events import WARNING as WARNING
from enforcement.events import EventRecorder, InvolvedPod
from enforcement.hook import ContainerRef
from enforcement.implementations import reference_node
from enforcement.kubeapi import CoreApi

COMPONENT: Final = "gpuconf-node-agent"
CONDITION_TYPE: Final = reference_node().condition
"""The reference agent's condition; an emulation writes its own (``KubeClient(condition=...)``)."""

REASON_REJECTED: Final = "GPUFractionRejected"
REASON_UNFENCED: Final = "GPUFractionUnfenced"
REASON_MODE_CONFLICT: Final = "GPUModeConflict"
REASON_BACKEND_UNAVAILABLE: Final = "GPUBackendUnavailable"
REASON_EVICTED: Final = "GPUFractionEvicted"
REASON_EVICTION_BLOCKED: Final = "GPUFractionEvictionBlocked"
REASON_FENCE_LOST: Final = "GPUFenceLost"

EvictOutcome = Literal["evicted", "gone", "blocked"]


class KubeError(Exception):
    """A Kubernetes call failed in a way worth retrying (API unreachable, 5xx, forbidden)."""


class Kube(Protocol):
    def evict(self, ref: ContainerRef) -> EvictOutcome:
        """Evict the Pod through the Eviction API (UID precondition); raises ``KubeError``."""
        ...

    def event(self, ref: ContainerRef, kind: str, reason: str, message: str) -> None:
        """Record an Event on the Pod (``ref.container`` goes in ``fieldPath``); never raises."""
        ...

    def forget_events(self, pod_uid: str) -> None:
        """The Pod is gone: drop what was remembered to aggregate its Events."""
        ...

    def set_condition(self, ok: bool, reason: str, message: str) -> None:
        """Write the node condition; raises ``KubeError``."""
        ...

    def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The Pod as a plain dict; None if it does not exist; raises ``KubeError``."""
        ...

    def read_node(self) -> dict[str, Any] | None:
        """The agent's Node as a plain dict; None if it does not exist; raises ``KubeError``."""
        ...


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _status(exc: BaseException) -> int | None:
    return getattr(exc, "status", None)


def _short(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:300]


class KubeClient:
    """``Kube`` on a real API server, for the agent of ``node``."""

    def __init__(
        self, api_client: Any, node: str, log: Callable[[str], None], condition: str = CONDITION_TYPE
    ) -> None:
        self.core = CoreApi(api_client)
        self.node = node
        self._log = log
        self._events = EventRecorder(self.core, COMPONENT, log, host=node, background=True)
        self.condition_type = condition
        self._condition: tuple[bool, str, str] | None = None
        self._transition = _now()

    def evict(self, ref: ContainerRef) -> EvictOutcome:
        body = {
            "metadata": {"name": ref.pod, "namespace": ref.namespace},
            "deleteOptions": {"preconditions": {"uid": ref.pod_uid}},
        }
        try:
            self.core.create_namespaced_pod_eviction(
                ref.pod, ref.namespace, body, _preload_content=False, _request_timeout=15
            )
        except Exception as exc:  # noqa: BLE001 - sorted by status below
            status = _status(exc)
            if status in (404, 409):  # gone, or the name now belongs to another Pod (UID precondition)
                return "gone"
            if status == 429:  # a PodDisruptionBudget forbids it right now
                return "blocked"
            raise KubeError(f"evicting Pod {ref.namespace}/{ref.pod}: {_short(exc)}") from None
        return "evicted"

    def event(self, ref: ContainerRef, kind: str, reason: str, message: str) -> None:
        """Queued, never waited for: a slow API server must not hold up a CreateContainer answer."""
        pod = InvolvedPod(ref.namespace, ref.pod, ref.pod_uid)
        self._events.record(pod, kind, reason, message, ref.container)

    def forget_events(self, pod_uid: str) -> None:
        self._events.forget(pod_uid)

    def flush(self, timeout_s: float = 10.0) -> None:
        """Wait until the queued Events are written (or ``timeout_s`` passed)."""
        self._events.flush(timeout_s)

    def set_condition(self, ok: bool, reason: str, message: str) -> None:
        now = _now()
        state = (ok, reason, message)
        if self._condition is None or self._condition[0] != ok:
            self._transition = now
        condition = {
            "type": self.condition_type,
            "status": "True" if ok else "False",
            "reason": reason,
            "message": message[:1024],
            "lastHeartbeatTime": now,
            "lastTransitionTime": self._transition,
        }
        try:
            # A dict body is sent as a strategic merge patch: conditions merge by their type.
            self.core.patch_node_status(
                self.node,
                {"status": {"conditions": [condition]}},
                _preload_content=False,
                _request_timeout=15,
            )
        except Exception as exc:  # noqa: BLE001 - any failure is a KubeError the caller retries
            raise KubeError(f"patching Node {self.node} status: {_short(exc)}") from None
        self._condition = state

    def annotate_node(self, key: str, value: str) -> None:
        """Set one annotation on the agent's Node, through ``nodes/status`` (the one Node write its
        role grants; a status update may carry metadata). Raises ``KubeError``."""
        try:
            self.core.patch_node_status(
                self.node,
                {"metadata": {"annotations": {key: value}}},
                _preload_content=False,
                _request_timeout=15,
            )
        except Exception as exc:  # noqa: BLE001 - any failure is a KubeError the caller retries
            raise KubeError(f"annotating Node {self.node}: {_short(exc)}") from None

    def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        import json

        try:
            # Short: it is read while answering a Synchronize, which the runtime waits for.
            resp = self.core.read_namespaced_pod(name, namespace, _preload_content=False, _request_timeout=5)
        except Exception as exc:  # noqa: BLE001 - 404 is an answer; anything else a KubeError to retry
            if _status(exc) == 404:
                return None
            raise KubeError(f"reading Pod {namespace}/{name}: {_short(exc)}") from None
        return json.loads(resp.data)

    def read_node(self) -> dict[str, Any] | None:
        import json

        try:
            resp = self.core.read_node(self.node, _preload_content=False, _request_timeout=15)
        except Exception as exc:  # noqa: BLE001 - 404 is an answer; anything else a KubeError to retry
            if _status(exc) == 404:
                return None
            raise KubeError(f"reading Node {self.node}: {_short(exc)}") from None
        return json.loads(resp.data)


@dataclass
class RecordedEvent:
    ref: ContainerRef
    kind: str
    reason: str
    message: str


@dataclass
class RecordingKube:
    """``Kube`` in memory: for unit tests and ``gpuconf probe`` (no cluster).

    ``on_evict`` plays the kubelet: it is called with the evicted Pod's ref (the probe stops
    that Pod's local processes there). ``pods`` answers ``read_pod``.
    """

    on_evict: Callable[[ContainerRef], None] | None = None
    evict_outcome: EvictOutcome = "evicted"
    pods: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    events: list[RecordedEvent] = field(default_factory=list)
    evictions: list[tuple[ContainerRef, float]] = field(default_factory=list)
    conditions: list[tuple[bool, str, str]] = field(default_factory=list)
    forgotten: list[str] = field(default_factory=list)
    node: dict[str, Any] | None = None
    fail: bool = False

    def __post_init__(self) -> None:
        self._lock = threading.Lock()

    def evict(self, ref: ContainerRef) -> EvictOutcome:
        if self.fail:
            raise KubeError("API unreachable (test)")
        with self._lock:
            self.evictions.append((ref, time.monotonic()))
        if self.on_evict is not None and self.evict_outcome == "evicted":
            self.on_evict(ref)
        return self.evict_outcome

    def event(self, ref: ContainerRef, kind: str, reason: str, message: str) -> None:
        with self._lock:
            self.events.append(RecordedEvent(ref, kind, reason, message))

    def forget_events(self, pod_uid: str) -> None:
        with self._lock:
            self.forgotten.append(pod_uid)

    def set_condition(self, ok: bool, reason: str, message: str) -> None:
        if self.fail:
            raise KubeError("API unreachable (test)")
        with self._lock:
            self.conditions.append((ok, reason, message))

    def read_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.pods.get((namespace, name))

    def read_node(self) -> dict[str, Any] | None:
        return self.node

    def reasons(self) -> list[str]:
        with self._lock:
            return [e.reason for e in self.events]

    def events_for(self, reason: str) -> list[RecordedEvent]:
        with self._lock:
            return [e for e in self.events if e.reason == reason]


def pod_ref(pod: Mapping[str, Any], container: str = "") -> ContainerRef:
    meta = pod.get("metadata")
    if not isinstance(meta, Mapping):
        meta = {}
    return ContainerRef(
        str(meta.get("namespace") or ""), str(meta.get("name") or ""), str(meta.get("uid") or ""), container
    )

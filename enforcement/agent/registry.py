"""The containers the agent fences: who each backend client is, and what it was given.

The backend knows clients by name; Kubernetes knows Pods by namespace, name and UID. The registry
joins the two, so the evictor can evict the right Pod, the mode guard can name the other Pod,
the metrics can carry Pod labels and a StopContainer finds what to release. It is rebuilt from
the backend's attach labels after a restart (``LABEL_*``), which is why the labels carry all
four parts of a ``ContainerRef``.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from enforcement.contract import Fraction
from enforcement.hook import ContainerRef

LABEL_NAMESPACE: Final = "namespace"
LABEL_POD: Final = "pod"
LABEL_UID: Final = "uid"
LABEL_CONTAINER: Final = "container"
LABEL_AGENT: Final = "gpuconf.io/node-agent"
"""Value: the node name. Marks a client as attached by this node's agent (and so its to re-adopt)."""
LABEL_PORTION: Final = "gpuconf.io/portion"


def client_name(ref: ContainerRef) -> str:
    """The backend client of a container: unique on the node while the Pod exists."""
    return f"{ref.namespace}/{ref.pod}/{ref.container}"


def labels_for(ref: ContainerRef, node: str, fraction: Fraction) -> dict[str, str]:
    labels = {
        LABEL_NAMESPACE: ref.namespace,
        LABEL_POD: ref.pod,
        LABEL_UID: ref.pod_uid,
        LABEL_CONTAINER: ref.container,
        LABEL_AGENT: node,
    }
    if fraction.portion is not None:
        labels[LABEL_PORTION] = repr(fraction.portion)
    return labels


def ref_from_labels(labels: Mapping[str, str]) -> ContainerRef | None:
    """The container a client belongs to, from its attach labels; None when they do not say."""
    parts = [labels.get(k, "") for k in (LABEL_NAMESPACE, LABEL_POD, LABEL_UID, LABEL_CONTAINER)]
    if not all(parts):
        return None
    return ContainerRef(*parts)


@dataclass(frozen=True)
class Tracked:
    """One fenced container."""

    ref: ContainerRef
    client: str
    fraction: Fraction
    """What is enforced (after defaults; for an adopted client, read back from the backend)."""
    gpus: tuple[str, ...]
    """GPU UUIDs in container-visible order."""
    since: float
    """Monotonic time the agent took it on (attach or adoption)."""
    adopted: bool = False
    """Taken over from the backend after a restart rather than attached by this process."""
    fence_lost: bool = False
    """The backend lost the client while the container kept running (see ``handler``)."""

    @property
    def mode(self) -> str:
        return self.fraction.mode


class Registry:
    """Thread-safe map of client name -> ``Tracked``, with the lookups the agent needs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_client: dict[str, Tracked] = {}

    def put(self, tracked: Tracked) -> None:
        with self._lock:
            self._by_client[tracked.client] = tracked

    def get(self, client: str) -> Tracked | None:
        with self._lock:
            return self._by_client.get(client)

    def remove(self, client: str) -> Tracked | None:
        with self._lock:
            return self._by_client.pop(client, None)

    def by_ref(self, pod_uid: str, container: str) -> Tracked | None:
        with self._lock:
            return next(
                (
                    t
                    for t in self._by_client.values()
                    if t.ref.pod_uid == pod_uid and t.ref.container == container
                ),
                None,
            )

    def by_pod(self, pod_uid: str) -> list[Tracked]:
        with self._lock:
            return [t for t in self._by_client.values() if t.ref.pod_uid == pod_uid]

    def on_gpus(self, gpus: Iterable[str]) -> list[tuple[str, Tracked]]:
        """``(gpu, tracked)`` for every fenced container on any of ``gpus``."""
        wanted = set(gpus)
        with self._lock:
            return [(g, t) for t in self._by_client.values() for g in t.gpus if g in wanted]

    def all(self) -> list[Tracked]:
        with self._lock:
            return list(self._by_client.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_client)

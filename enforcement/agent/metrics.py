"""Prometheus metrics per fraction and for the agent itself, through ``prometheus_client``.

The Prometheus client library does what a hand-written exposition gets subtly wrong: label
escaping, the text format and OpenMetrics chosen by the scraper's ``Accept`` header, gzip, and a
registry of collectors; and its parser lets the tests read what the agent serves the way a
scraper does. Each agent keeps its own ``CollectorRegistry`` (never the library's global one),
so several agents in one process (tests, the probe) do not share series.

Per fraction (one series per container and assigned GPU; names and the labels ``namespace, pod,
pod_uuid, gpu_uuid, gpu`` as the GPU Fractioning Operator exports them (docs/contract.md,
"Node-side facts"), plus ``container`` so two fractional containers of one Pod never collapse
into one series):

- ``gpu_fractioning_gpu_memory_used_bytes``, ``..._limit_bytes`` (hard limit),
  ``..._request_bytes`` (guarantee);
- ``gpu_fractioning_gpu_sm_utilization_percent`` where the backend measures it (NVML on the MPS
  backend; the simulated device does not, so the series is absent there rather than a made-up 0).

Per GPU: ``gpu_fractioning_node_gpu_memory_{total,used,guaranteed}_bytes``. The agent:
``gpu_fractioning_agent_*`` counters and gauges (see ``FAMILIES``).

Two kinds of source, two collectors: ``Metrics`` holds what the agent counts as it works
(library ``Counter`` values, and gauges that exist once set: a reaction time is absent until
there was an eviction, not 0); ``UsageCollector`` reads the backend and the agent's registry
when scraped, its usage cached for ``cache_s`` so that several scrapers do not multiply the
load on the device.
"""

from __future__ import annotations

import threading
import time
import wsgiref.simple_server
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Final

from prometheus_client import CollectorRegistry, Counter, generate_latest, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer
from prometheus_client.metrics_core import GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from enforcement.agent.registry import Registry, ref_from_labels
from enforcement.backends import BackendError, Usage

FRACTION_LABELS: Final = ("namespace", "pod", "pod_uuid", "container", "gpu_uuid", "gpu")
GPU_LABELS: Final = ("gpu_uuid", "gpu")


@dataclass(frozen=True)
class Family:
    name: str
    kind: str  # counter | gauge
    help: str
    labels: tuple[str, ...] = ()


FAMILIES: Final[dict[str, Family]] = {
    f.name: f
    for f in (
        Family(
            "gpu_fractioning_gpu_memory_used_bytes",
            "gauge",
            "GPU memory the container's processes hold.",
            FRACTION_LABELS,
        ),
        Family(
            "gpu_fractioning_gpu_memory_limit_bytes",
            "gauge",
            "Hard limit per assigned GPU (annotation limit).",
            FRACTION_LABELS,
        ),
        Family(
            "gpu_fractioning_gpu_memory_request_bytes",
            "gauge",
            "Guarantee per assigned GPU (annotation request).",
            FRACTION_LABELS,
        ),
        Family(
            "gpu_fractioning_gpu_sm_utilization_percent",
            "gauge",
            "SM utilisation of the container's processes.",
            FRACTION_LABELS,
        ),
        Family("gpu_fractioning_node_gpu_memory_total_bytes", "gauge", "Memory of the GPU.", GPU_LABELS),
        Family(
            "gpu_fractioning_node_gpu_memory_used_bytes", "gauge", "Memory in use on the GPU.", GPU_LABELS
        ),
        Family(
            "gpu_fractioning_node_gpu_memory_guaranteed_bytes",
            "gauge",
            "Sum of the guarantees on the GPU.",
            GPU_LABELS,
        ),
        Family(
            "gpu_fractioning_agent_admitted_containers_total", "counter", "Containers fenced and started."
        ),
        Family(
            "gpu_fractioning_agent_rejected_containers_total",
            "counter",
            "Containers refused, by reason (malformed, mode-conflict, backend-unavailable, ...).",
            ("reason",),
        ),
        Family(
            "gpu_fractioning_agent_unfenced_containers_total",
            "counter",
            "Containers started unfenced (fail-open with a malformed contract).",
        ),
        Family(
            "gpu_fractioning_agent_evictions_total",
            "counter",
            "Pods evicted, by reason (pressure, hard-limit).",
            ("reason",),
        ),
        Family(
            "gpu_fractioning_agent_eviction_failures_total", "counter", "Evictions the API refused or failed."
        ),
        Family(
            "gpu_fractioning_agent_adopted_containers_total",
            "counter",
            "Containers re-adopted after a restart.",
        ),
        Family("gpu_fractioning_agent_fenced_containers", "gauge", "Containers the agent fences now."),
        Family(
            "gpu_fractioning_agent_fence_lost_containers",
            "gauge",
            "Running containers whose backend client was lost (device restarted).",
        ),
        Family("gpu_fractioning_agent_backend_up", "gauge", "1 while the GPU backend can enforce, else 0."),
        Family(
            "gpu_fractioning_agent_last_eviction_reaction_seconds",
            "gauge",
            "From pressure first seen (or the waiter's first refusal) to the last eviction.",
        ),
    )
}
SET_GAUGES: Final = (
    "gpu_fractioning_agent_backend_up",
    "gpu_fractioning_agent_last_eviction_reaction_seconds",
)
"""Gauges the agent sets as it works; the other gauges are read when scraped."""


def _gauge(name: str) -> GaugeMetricFamily:
    family = FAMILIES[name]
    return GaugeMetricFamily(name, family.help, labels=list(family.labels))


class Metrics:
    """What the agent counts as it works (thread-safe): a ``prometheus_client`` collector."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counters: dict[str, Counter] = {
            name: Counter(name, f.help, f.labels, registry=None)
            for name, f in FAMILIES.items()
            if f.kind == "counter"
        }
        self._gauges: dict[str, float] = {}
        # Counters start at an explicit 0 (unlabelled ones by themselves), so a rate() over the
        # first event is right.
        for reason in ("pressure", "hard-limit"):
            self._counters["gpu_fractioning_agent_evictions_total"].labels(reason=reason)

    def inc(self, name: str, amount: float = 1.0, **labels: str) -> None:
        counter = self._counters[name]
        (counter.labels(**labels) if labels else counter).inc(amount)

    def set(self, name: str, value: float) -> None:
        if name not in SET_GAUGES:
            raise KeyError(f"{name} is not a gauge the agent sets")
        with self._lock:
            self._gauges[name] = value

    def value(self, name: str, **labels: str) -> float:
        """The current value of a counter or set gauge (0 if it has none yet)."""
        if name in self._counters:
            for family in self._counters[name].collect():
                for sample in family.samples:
                    if sample.name == name and sample.labels == labels:
                        return float(sample.value)
            return 0.0
        with self._lock:
            return self._gauges.get(name, 0.0)

    def collect(self) -> Iterator[Metric]:
        for counter in self._counters.values():
            yield from counter.collect()
        with self._lock:
            gauges = dict(self._gauges)
        for name, value in gauges.items():
            family = _gauge(name)
            family.add_metric([], value)
            yield family

    def render(self, usage: Usage | None, registry: Registry) -> str:
        """The text exposition (format 0.0.4) with ``usage`` as the backend's answer."""
        return generate_latest(exposition_registry(self, UsageCollector(lambda: usage, registry))).decode()


class UsageCollector:
    """Per-fraction and per-GPU series from the backend, and the agent's fence counts, when scraped."""

    def __init__(self, usage: Callable[[], Usage | None], registry: Registry, cache_s: float = 0.0) -> None:
        self._usage = usage
        self._registry = registry
        self._cache_s = cache_s
        self._cached: tuple[float, Usage | None] = (-1e9, None)
        self._lock = threading.Lock()

    def usage(self) -> Usage | None:
        with self._lock:
            at, usage = self._cached
            if time.monotonic() - at > self._cache_s:
                try:
                    usage = self._usage()
                except BackendError:
                    usage = None  # the agent's own series still render; backend_up says why
                self._cached = (time.monotonic(), usage)
            return usage

    def collect(self) -> Iterator[Metric]:
        usage = self.usage()
        families = {name: _gauge(name) for name, f in FAMILIES.items() if f.kind == "gauge" and f.labels}
        if usage is not None:
            for gpu in usage.gpus:
                where = [gpu.uuid, str(gpu.index)]
                families["gpu_fractioning_node_gpu_memory_total_bytes"].add_metric(where, gpu.capacity_bytes)
                families["gpu_fractioning_node_gpu_memory_used_bytes"].add_metric(where, gpu.used_bytes)
                families["gpu_fractioning_node_gpu_memory_guaranteed_bytes"].add_metric(
                    where, gpu.guaranteed_bytes
                )
            for client in usage.clients:
                tracked = self._registry.get(client.name)
                ref = tracked.ref if tracked is not None else ref_from_labels(client.labels)
                who = (
                    [ref.namespace, ref.pod, ref.pod_uid, ref.container] if ref else ["", client.name, "", ""]
                )
                for g in client.gpus:
                    labels = [*who, g.uuid, str(g.index)]
                    families["gpu_fractioning_gpu_memory_used_bytes"].add_metric(labels, g.used_bytes)
                    families["gpu_fractioning_gpu_memory_limit_bytes"].add_metric(labels, g.hard_limit_bytes)
                    families["gpu_fractioning_gpu_memory_request_bytes"].add_metric(labels, g.guarantee_bytes)
                    if g.sm_percent is not None:
                        families["gpu_fractioning_gpu_sm_utilization_percent"].add_metric(
                            labels, g.sm_percent
                        )
        for name, family in families.items():
            if family.samples or not name.startswith("gpu_fractioning_gpu_"):
                yield family  # a per-fraction family nobody reports is left out, not shown empty
        tracked_all = self._registry.all()
        fenced = _gauge("gpu_fractioning_agent_fenced_containers")
        fenced.add_metric([], len(tracked_all))
        lost = _gauge("gpu_fractioning_agent_fence_lost_containers")
        lost.add_metric([], sum(1 for t in tracked_all if t.fence_lost))
        yield from (fenced, lost)


def exposition_registry(metrics: Metrics, usage: UsageCollector) -> CollectorRegistry:
    """A registry of one agent's series: what it counts and what it reads when scraped."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    registry.register(usage)
    return registry


def parse(text: str) -> list[Sample]:
    """The samples of an exposition, read by ``prometheus_client``'s parser (as a scraper reads it)."""
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def sample_value(samples: Iterable[Sample], name: str, **labels: str) -> float | None:
    """The value of the sample ``name`` with exactly ``labels``; None if there is none."""
    return next((float(s.value) for s in samples if s.name == name and s.labels == labels), None)


class _QuietHandler(wsgiref.simple_server.WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's name
        pass  # scrapes every few seconds would drown the agent's log


class MetricsServer:
    """``GET /metrics`` (text format 0.0.4, or OpenMetrics when the scraper asks for it) and
    ``GET /healthz`` on ``bind:port``, in a thread."""

    def __init__(
        self,
        port: int,
        metrics: Metrics,
        registry: Registry,
        usage: Callable[[], Usage],
        healthy: Callable[[], bool],
        bind: str = "0.0.0.0",
        cache_s: float = 0.5,
    ) -> None:
        self.registry = exposition_registry(metrics, UsageCollector(usage, registry, cache_s))
        scrape = make_wsgi_app(self.registry)

        def app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
            path = environ.get("PATH_INFO", "")
            if path == "/metrics":
                return scrape(environ, start_response)
            if path == "/healthz":
                ok = healthy()
                start_response(
                    "200 OK" if ok else "503 Service Unavailable", [("Content-Type", "text/plain")]
                )
                return [b"ok\n" if ok else b"backend unavailable\n"]
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found\n"]

        self._server = wsgiref.simple_server.make_server(
            bind, port, app, server_class=ThreadingWSGIServer, handler_class=_QuietHandler
        )
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics", daemon=True)

    def text(self) -> str:
        return generate_latest(self.registry).decode()

    def start(self) -> MetricsServer:
        self._thread.start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

"""Prometheus metrics per fraction and for the agent itself, in the text exposition format.

Written by hand rather than with a client library: the format is a few lines of text, and the
agent image stays at the standard library plus the Kubernetes client.

Per fraction (one series per container and assigned GPU; names and the labels ``namespace, pod,
pod_uuid, gpu_uuid, gpu`` as the GPU Fractioning Operator exports them, CONTRACT.md §5, plus
``container`` so two fractional containers of one Pod never collapse into one series):

- ``gpu_fractioning_gpu_memory_used_bytes``, ``..._limit_bytes`` (hard limit),
  ``..._request_bytes`` (guarantee);
- ``gpu_fractioning_gpu_sm_utilization_percent`` where the backend measures it (NVML on the MPS
  backend; the simulated device does not, so the series is absent there rather than a made-up 0).

Per GPU: ``gpu_fractioning_node_gpu_memory_{total,used,guaranteed}_bytes``. The agent:
``gpu_fractioning_agent_*`` counters and gauges (see ``FAMILIES``).

Usage is read from the backend when scraped, cached for ``cache_s`` so that several scrapers
do not multiply the load on the device.
"""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from enforcement.agent.registry import Registry, ref_from_labels
from enforcement.backends import BackendError, Usage

FRACTION_LABELS: Final = ("namespace", "pod", "pod_uuid", "container", "gpu_uuid", "gpu")


@dataclass(frozen=True)
class Family:
    name: str
    kind: str  # counter | gauge
    help: str


FAMILIES: Final[dict[str, Family]] = {
    f.name: f
    for f in (
        Family(
            "gpu_fractioning_gpu_memory_used_bytes", "gauge", "GPU memory the container's processes hold."
        ),
        Family(
            "gpu_fractioning_gpu_memory_limit_bytes",
            "gauge",
            "Hard limit per assigned GPU (annotation limit).",
        ),
        Family(
            "gpu_fractioning_gpu_memory_request_bytes",
            "gauge",
            "Guarantee per assigned GPU (annotation request).",
        ),
        Family(
            "gpu_fractioning_gpu_sm_utilization_percent",
            "gauge",
            "SM utilisation of the container's processes.",
        ),
        Family("gpu_fractioning_node_gpu_memory_total_bytes", "gauge", "Memory of the GPU."),
        Family("gpu_fractioning_node_gpu_memory_used_bytes", "gauge", "Memory in use on the GPU."),
        Family(
            "gpu_fractioning_node_gpu_memory_guaranteed_bytes", "gauge", "Sum of the guarantees on the GPU."
        ),
        Family(
            "gpu_fractioning_agent_admitted_containers_total", "counter", "Containers fenced and started."
        ),
        Family(
            "gpu_fractioning_agent_rejected_containers_total",
            "counter",
            "Containers refused, by reason (malformed, mode-conflict, backend-unavailable, ...).",
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

LabelSet = tuple[tuple[str, str], ...]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(labels: LabelSet) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in labels) + "}"


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else repr(float(value))


class Metrics:
    """The agent's own counters and gauges (thread-safe), and the whole text rendering."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, dict[LabelSet, float]] = {}
        # Counters start at an explicit 0, so a rate() over the first event is right.
        for name in (
            "gpu_fractioning_agent_admitted_containers_total",
            "gpu_fractioning_agent_unfenced_containers_total",
            "gpu_fractioning_agent_eviction_failures_total",
            "gpu_fractioning_agent_adopted_containers_total",
        ):
            self.inc(name, 0)
        for reason in ("pressure", "hard-limit"):
            self.inc("gpu_fractioning_agent_evictions_total", 0, reason=reason)

    def inc(self, name: str, amount: float = 1.0, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        with self._lock:
            series = self._values.setdefault(name, {})
            series[key] = series.get(key, 0.0) + amount

    def set(self, name: str, value: float, **labels: str) -> None:
        with self._lock:
            self._values.setdefault(name, {})[tuple(sorted(labels.items()))] = value

    def value(self, name: str, **labels: str) -> float:
        with self._lock:
            return self._values.get(name, {}).get(tuple(sorted(labels.items())), 0.0)

    def render(self, usage: Usage | None, registry: Registry) -> str:
        series: dict[str, list[tuple[LabelSet, float]]] = {name: [] for name in FAMILIES}
        if usage is not None:
            for gpu in usage.gpus:
                where = (("gpu_uuid", gpu.uuid), ("gpu", str(gpu.index)))
                series["gpu_fractioning_node_gpu_memory_total_bytes"].append((where, gpu.capacity_bytes))
                series["gpu_fractioning_node_gpu_memory_used_bytes"].append((where, gpu.used_bytes))
                series["gpu_fractioning_node_gpu_memory_guaranteed_bytes"].append(
                    (where, gpu.guaranteed_bytes)
                )
            for client in usage.clients:
                tracked = registry.get(client.name)
                ref = tracked.ref if tracked is not None else ref_from_labels(client.labels)
                who = (
                    (ref.namespace, ref.pod, ref.pod_uid, ref.container)
                    if ref is not None
                    else ("", client.name, "", "")
                )
                for g in client.gpus:
                    labels = tuple(zip(FRACTION_LABELS, (*who, g.uuid, str(g.index)), strict=True))
                    series["gpu_fractioning_gpu_memory_used_bytes"].append((labels, g.used_bytes))
                    series["gpu_fractioning_gpu_memory_limit_bytes"].append((labels, g.hard_limit_bytes))
                    series["gpu_fractioning_gpu_memory_request_bytes"].append((labels, g.guarantee_bytes))
                    if g.sm_percent is not None:
                        series["gpu_fractioning_gpu_sm_utilization_percent"].append((labels, g.sm_percent))
        tracked_all = registry.all()
        self.set("gpu_fractioning_agent_fenced_containers", len(tracked_all))
        self.set("gpu_fractioning_agent_fence_lost_containers", sum(1 for t in tracked_all if t.fence_lost))
        with self._lock:
            for name, values in self._values.items():
                series.setdefault(name, []).extend(sorted(values.items()))
        lines: list[str] = []
        for name, family in FAMILIES.items():
            points = series.get(name, [])
            if not points and family.kind == "gauge" and name.startswith("gpu_fractioning_gpu_"):
                continue  # a per-fraction family nobody reports is left out, not shown empty
            lines.append(f"# HELP {name} {family.help}")
            lines.append(f"# TYPE {name} {family.kind}")
            for labels, value in points:
                lines.append(f"{name}{_labels(labels)} {_number(value)}")
        return "\n".join(lines) + "\n"


class MetricsServer:
    """``GET /metrics`` (text format 0.0.4) and ``GET /healthz`` on ``bind:port``, in a thread."""

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
        self._metrics = metrics
        self._registry = registry
        self._usage = usage
        self._healthy = healthy
        self._cache_s = cache_s
        self._cached: tuple[float, Usage | None] = (-1e9, None)
        self._cache_lock = threading.Lock()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                path = self.path.split("?", 1)[0]
                if path == "/metrics":
                    body, status = outer.text().encode(), 200
                    ctype = "text/plain; version=0.0.4; charset=utf-8"
                elif path == "/healthz":
                    ok = outer._healthy()
                    body, status, ctype = (
                        (b"ok\n" if ok else b"backend unavailable\n"),
                        (200 if ok else 503),
                        "text/plain",
                    )
                else:
                    body, status, ctype = b"not found\n", 404, "text/plain"
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the stdlib's name
                pass  # scrapes every few seconds would drown the agent's log

        self._server = http.server.ThreadingHTTPServer((bind, port), Handler)
        self._server.daemon_threads = True
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics", daemon=True)

    def text(self) -> str:
        with self._cache_lock:
            at, usage = self._cached
            if time.monotonic() - at > self._cache_s:
                try:
                    usage = self._usage()
                except BackendError:
                    usage = None  # the agent's own series still render; backend_up says why
                self._cached = (time.monotonic(), usage)
        return self._metrics.render(usage, self._registry)

    def start(self) -> MetricsServer:
        self._thread.start()
        return self

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

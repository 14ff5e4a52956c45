"""Reference scheduler figures: 1000 fractional Pods on the `scale` topology (64 nodes x 8 GPUs).

Prints one JSON object. Measurements, not pass/fail (target: all bound within 60 s on 2 cores).

- ``all_bound_s``: from the first Pod created to the last one bound (creation included: the
  Pods arrive while the scheduler works, as they would from a Job controller);
- ``decision_ms``: p50/p99/max of the scheduler's own per-Pod decision time (its log's
  ``decision=`` field: placement only, no API calls, wall clock, so waits for the GIL count);
  ``decision_cpu_ms`` the same decisions in CPU time of the deciding thread (their own cost);
  ``bind_ms`` the patch + bind round trips, on the binder threads;
- ``scheduler_rss_mib``: the scheduler's resident memory once everything is bound;
- ``violations``: contract findings across the bound Pods and GPUs (expected: 0).

    .venv/bin/python tests/bench/bench_scheduler.py [--pods 1000] [--creators 4]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchlib import rss_mib  # noqa: E402
from kubernetes.client.rest import ApiException  # noqa: E402

from enforcement.contract import audit_gpus, audit_pod  # noqa: E402
from fixtures.sandbox.controlplane import Ports, Sandbox, SandboxConfig  # noqa: E402

NAME = "bench"
NAMESPACE = "bench"
DECISION = re.compile(r"scheduled bench/\S+ -> \S+ .*decision=([0-9.]+)ms cpu=([0-9.]+)ms bind=([0-9.]+)ms")


def request(i: int) -> dict[str, str]:
    """Four dialects and shapes in turn: portion, MiB, absolute sm-sharing, two devices."""
    kind = i % 4
    if kind == 0:
        return {"gpu-fraction": "0.25"}
    if kind == 1:
        return {"gpu-memory": "20000"}
    if kind == 2:
        return {
            "nvidia.com/container.main.gpu-memory.request": "16Gi",
            "nvidia.com/container.main.gpu-compute.mode": "sm-sharing",
        }
    return {"gpu-memory": "10000", "gpu-fraction-num-devices": "2"}


def manifest(i: int) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"p{i:04d}", "annotations": request(i)},
        "spec": {
            "schedulerName": NAME,
            "containers": [{"name": "main", "image": "gpuconf/workload:bench", "command": ["true"]}],
        },
    }


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(p * len(ordered)))], 3)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--creators", type=int, default=4, help="threads creating Pods")
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()
    quiet = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731

    figures: dict[str, Any] = {
        "bench": "scheduler",
        "cores": os.cpu_count(),
        "topology": "scale",
        "pods": args.pods,
    }
    with tempfile.TemporaryDirectory() as state:
        box = Sandbox(
            SandboxConfig(
                state_dir=Path(state) / "sandbox",
                ports=Ports.free(),
                topology="scale",
                schedulers=(f"reference/{NAME}",),
            )
        )
        try:
            t0 = time.monotonic()
            box.up(log=quiet)
            figures["sandbox_up_s"] = round(time.monotonic() - t0, 1)
            record = json.loads(box.state_file.read_text())["processes"][f"scheduler/{NAME}"]
            pid, log = record["pid"], Path(record["log"])
            figures["scheduler_rss_idle_mib"] = rss_mib(pid)

            core = box.core_v1()
            core.create_namespace({"metadata": {"name": NAMESPACE}})
            while True:  # Pods are refused until the namespace has its default ServiceAccount
                try:
                    core.read_namespaced_service_account("default", NAMESPACE)
                    break
                except ApiException:
                    time.sleep(0.1)

            created_at: list[float] = []

            def create(indices: range) -> None:
                mine = box.core_v1()
                for i in indices:
                    mine.create_namespaced_pod(NAMESPACE, manifest(i), _preload_content=False)

            share = -(-args.pods // args.creators)
            threads = [
                threading.Thread(target=create, args=(range(k * share, min(args.pods, (k + 1) * share)),))
                for k in range(args.creators)
            ]
            start = time.monotonic()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            created_at.append(time.monotonic() - start)

            bound = 0
            pods: list[dict[str, Any]] = []
            while time.monotonic() - start < args.timeout:
                pods = json.loads(core.list_namespaced_pod(NAMESPACE, _preload_content=False).data)["items"]
                bound = sum(1 for p in pods if p["spec"].get("nodeName"))
                if bound == args.pods:
                    break
                time.sleep(0.25)
            figures["all_bound_s"] = round(time.monotonic() - start, 1)
            figures["created_s"] = round(created_at[0], 1)
            figures["bound"] = bound
            figures["target_s"] = 60

            times = [tuple(map(float, m.groups())) for m in DECISION.finditer(log.read_text())]
            for key, column in (("decision_ms", 0), ("decision_cpu_ms", 1), ("bind_ms", 2)):
                values = [t[column] for t in times]
                if values:
                    figures[key] = {"p50": pct(values, 0.5), "p99": pct(values, 0.99), "max": max(values)}
            figures["scheduler_rss_mib"] = rss_mib(pid)

            nodes = json.loads(core.list_node(_preload_content=False).data)["items"]
            by_name = {n["metadata"]["name"]: n for n in nodes}
            findings = [v for p in pods for v in audit_pod(p, by_name.get(p["spec"].get("nodeName", "")))]
            findings += audit_gpus(pods, nodes)
            figures["violations"] = len(findings)
            figures["gpus_used"] = len({(p["spec"].get("nodeName"), d) for p in pods for d in _devices(p)})
        finally:
            box.down()
    print(json.dumps(figures))
    return 0


def _devices(pod: dict[str, Any]) -> list[str]:
    value = (pod["metadata"].get("annotations") or {}).get("nvidia.com/container.main.gpus.devices", "")
    return [d for d in value.split(",") if d]


if __name__ == "__main__":
    sys.exit(main())

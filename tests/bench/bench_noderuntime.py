"""Node runtime figures: time from a Pod bound to its container's process started, and the runtime's RSS.

Prints one JSON object. Measurements, not pass/fail.

A sandbox of its own (no node runtime), one ``python -m fixtures.sandbox.noderuntime`` for ``gpu-a-0``
with its RBAC-limited identity, and an allow-all hook served by this process (the agent's cost is
not what is measured). Each Pod is created with ``spec.nodeName`` set, so "bound" is the moment
its create request is sent; "started" is the wall clock its container reads first thing
(``date +%s.%N``, written to its termination message). Two runs:

- ``sequential``: one Pod at a time, each waited for: the latency of a quiet node;
- ``burst``: all Pods created back to back: the latency when the runtime is busy.

    .venv/bin/python tests/bench/bench_noderuntime.py [--pods 100]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchlib import rss_mib  # noqa: E402
from kubernetes import client  # noqa: E402

from enforcement.hook import Adjustment, ContainerRef, HookServer, RunningContainer  # noqa: E402
from fixtures.sandbox.controlplane import Ports, Sandbox, SandboxConfig  # noqa: E402
from fixtures.sandbox.noderuntime import rbac  # noqa: E402
from fixtures.sandbox.noderuntime.layout import ready_file  # noqa: E402
from fixtures.suite import manifests  # noqa: E402

NODE = "gpu-a-0"
STAMP = 'date +%s.%N > "$GPUCONF_TERMINATION_PATH"'


class AllowAll:
    def create_container(self, pod: Mapping[str, Any], container: str) -> Adjustment:
        return Adjustment(True)

    def stop_container(self, ref: ContainerRef, exit_code: int | None) -> None:
        pass

    def synchronize(self, running: list[RunningContainer]) -> None:
        pass


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


def summary(latencies: list[float]) -> dict[str, Any]:
    ms = [v * 1000 for v in latencies]
    return {
        "pods": len(ms),
        "p50_ms": round(percentile(ms, 50), 1),
        "p99_ms": round(percentile(ms, 99), 1),
        "max_ms": round(max(ms), 1),
        "mean_ms": round(sum(ms) / len(ms), 1),
    }


def pod(name: str) -> dict[str, Any]:
    main = manifests.container("main", image="bench:1", command=("sh", "-c", STAMP))
    return manifests.pod(name, [main], node_name=NODE)


def started_at(core: Any, namespace: str, name: str, timeout: float = 120.0) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        data = json.loads(core.read_namespaced_pod(name, namespace, _preload_content=False).data)
        for cs in data.get("status", {}).get("containerStatuses") or ():
            term = cs.get("state", {}).get("terminated")
            if term and term.get("message"):
                return float(term["message"])
        time.sleep(0.05)
    raise TimeoutError(f"{namespace}/{name} did not finish in {timeout:.0f} s")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pods", type=int, default=100)
    args = parser.parse_args()
    say = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    figures: dict[str, Any] = {"bench": "noderuntime", "cores": os.cpu_count(), "pods": args.pods}
    with tempfile.TemporaryDirectory(prefix="gnrb-", dir="/tmp") as tmp:
        box = Sandbox(SandboxConfig(state_dir=Path(tmp) / "sandbox", ports=Ports.free()))
        box.up(log=say)
        hook = HookServer(Path(tmp) / "hook.sock", AllowAll()).start()
        runtime: subprocess.Popen[bytes] | None = None
        try:
            rbac.ensure(client.RbacAuthorizationV1Api(box.api_client()))
            kubeconfig = box.issue_kubeconfig("runtime-bench", rbac.runtime_user(NODE), (rbac.RUNTIME_GROUP,))
            work = Path(tmp) / "work"
            argv = [
                sys.executable,
                "-m",
                "fixtures.sandbox.noderuntime",
                "--node",
                NODE,
                "--kubeconfig",
                str(kubeconfig),
                "--hook-socket",
                str(Path(tmp) / "hook.sock"),
                "--work-dir",
                str(work),
            ]
            t0 = time.monotonic()
            with open(Path(tmp) / "runtime.log", "wb") as log:
                runtime = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
            while not ready_file(work).exists():
                if runtime.poll() is not None or time.monotonic() - t0 > 120:
                    raise RuntimeError((Path(tmp) / "runtime.log").read_text())
                time.sleep(0.05)
            figures["runtime_ready_s"] = round(time.monotonic() - t0, 2)
            figures["rss_idle_mib"] = rss_mib(runtime.pid)
            core = box.core_v1()
            namespace = f"bench-{uuid.uuid4().hex[:6]}"
            core.create_namespace({"metadata": {"name": namespace}})
            while True:  # the first Pod of a namespace needs its default ServiceAccount
                try:
                    core.read_namespaced_service_account("default", namespace)
                    break
                except client.ApiException:
                    time.sleep(0.1)

            sequential = []
            for i in range(args.pods):
                name = f"seq-{i}"
                sent = time.time()
                core.create_namespaced_pod(namespace, pod(name))
                sequential.append(started_at(core, namespace, name) - sent)
            figures["sequential"] = summary(sequential)
            say(f"sequential: {figures['sequential']}")

            peak: list[float] = []
            stop = threading.Event()

            def sample() -> None:
                while not stop.is_set():
                    if (value := rss_mib(runtime.pid)) is not None:
                        peak.append(value)
                    stop.wait(0.1)

            sampler = threading.Thread(target=sample, daemon=True)
            sampler.start()
            sent_at: dict[str, float] = {}
            burst_start = time.time()
            for i in range(args.pods):
                name = f"burst-{i}"
                sent_at[name] = time.time()
                core.create_namespaced_pod(namespace, pod(name))
            starts = {name: started_at(core, namespace, name) for name in sent_at}
            stop.set()
            sampler.join()
            figures["burst"] = summary([starts[n] - sent_at[n] for n in sent_at])
            figures["burst"]["all_started_s"] = round(max(starts.values()) - burst_start, 2)
            figures["burst"]["pods_per_s"] = round(args.pods / (max(starts.values()) - burst_start), 1)
            figures["rss_peak_mib"] = max(peak) if peak else None
            figures["rss_after_mib"] = rss_mib(runtime.pid)
            core.delete_namespace(namespace)
        finally:
            if runtime is not None and runtime.poll() is None:
                runtime.send_signal(signal.SIGTERM)
                runtime.wait(30)
            hook.close()
            box.down()
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Reference node agent figures on a fresh sandbox: eviction reaction, CreateContainer latency, RSS.

Prints one JSON object. Measurements, not pass/fail; targets: eviction reaction <= 1 s after
pressure appears, eviction resumed <= 5 s after a killed agent's replacement starts.

- ``eviction``: a borrower holds 7/8 of a GPU, a guaranteed client asks for half; from the
  guaranteed client's first refusal to (a) its allocation succeeding (memory reclaimed) and
  (b) the borrower Pod carrying a deletionTimestamp (Eviction API), over ``--trials`` runs;
- ``create_container``: latency of the hook's CreateContainer (parse, mode guard, attach, env)
  for ``--pods`` bound, annotated Pods, then the agent's RSS and CPU with all of them fenced,
  the metrics scrape time, and the time a SIGKILLed agent's replacement needs to be ready
  (re-adopting all of them) and to answer Synchronize for all of them.

    .venv/bin/python tests/bench/bench_agent.py [--pods 1000] [--trials 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from enforcement.agent import rbac  # noqa: E402
from enforcement.agent.testing import AgentProcess  # noqa: E402
from enforcement.contract import node_gpu_uuids  # noqa: E402
from enforcement.hook import ContainerRef, HookClient, RunningContainer  # noqa: E402
from enforcement.sim import ADMIN_TOKEN_ENV  # noqa: E402
from enforcement.sim.process import ServerProcess  # noqa: E402
from fixtures.sandbox.controlplane import Ports, Sandbox, SandboxConfig  # noqa: E402
from fixtures.sandbox.processes import free_port  # noqa: E402
from fixtures.suite import manifests  # noqa: E402
from fixtures.suite.manifests import placement_annotations as placement  # noqa: E402
from workloads.simclient import DeviceClient  # noqa: E402
from workloads.simwire import SIM_SOCKET_ENV, SIM_TOKEN_ENV, SimPressure  # noqa: E402

NODE = "gpu-a-0"
MIB = 1 << 20


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def proc_figures(pid: int) -> dict[str, float]:
    status = Path(f"/proc/{pid}/status").read_text()
    rss = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return {"rss_mib": round(rss / 1024, 1), "cpu_s": (int(fields[11]) + int(fields[12])) / ticks}


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def bound_pod(name: str, annotations: dict[str, str]) -> dict[str, Any]:
    main = manifests.container("main", image="gpuconf-workload:bench")
    return manifests.pod(name, [main], annotations=annotations, node_name=NODE, restart_policy="Always")


def read(core: Any, namespace: str, name: str) -> dict[str, Any]:
    return json.loads(core.read_namespaced_pod(name, namespace, _preload_content=False).data)


def ref(pod: dict[str, Any]) -> ContainerRef:
    meta = pod["metadata"]
    return ContainerRef(meta["namespace"], meta["name"], meta["uid"], "main")


def eviction_trial(
    core: Any, hook: HookClient, namespace: str, cap: int, gpu: str, i: int
) -> dict[str, float]:
    g_name, b_name = f"g-{i}", f"b-{i}"
    core.create_namespaced_pod(namespace, bound_pod(g_name, placement("main", cap // 2, cap // 2, (gpu,))))
    core.create_namespaced_pod(namespace, bound_pod(b_name, placement("main", 1024, cap - 1024, (gpu,))))
    g_pod, b_pod = read(core, namespace, g_name), read(core, namespace, b_name)
    g_env, b_env = hook.create_container(g_pod, "main").env, hook.create_container(b_pod, "main").env
    borrower = DeviceClient(b_env[SIM_SOCKET_ENV], b_env[SIM_TOKEN_ENV], timeout=30)
    guaranteed = DeviceClient(g_env[SIM_SOCKET_ENV], g_env[SIM_TOKEN_ENV], timeout=30)
    borrower.alloc(0, (cap * 7 // 8) * MIB)
    t0 = time.monotonic()
    got = api = None
    while time.monotonic() - t0 < 30:
        try:
            guaranteed.alloc(0, (cap // 2) * MIB)
            got = time.monotonic() - t0
            break
        except SimPressure:
            time.sleep(0.005)
    while time.monotonic() - t0 < 30:
        if read(core, namespace, b_name)["metadata"].get("deletionTimestamp"):
            api = time.monotonic() - t0
            break
        time.sleep(0.02)
    for client in (borrower, guaranteed):
        client.close()
    hook.stop_container(ref(b_pod), 137)
    hook.stop_container(ref(g_pod), 0)
    for name in (g_name, b_name):
        core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    return {"memory_reclaimed_s": round(got or -1, 4), "deletion_timestamp_s": round(api or -1, 4)}


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--trials", type=int, default=5)
    args = parser.parse_args()
    from kubernetes import client

    figures: dict[str, Any] = {"bench": "agent", "cores": os.cpu_count(), "pods": args.pods}
    with tempfile.TemporaryDirectory(prefix="gbench-", dir="/tmp") as tmp:
        work = Path(tmp)
        box = Sandbox(SandboxConfig(state_dir=work / "sandbox", ports=Ports.free()))
        box.up(log=log)
        server = agent = None
        try:
            core = box.core_v1()
            raw = json.loads(core.read_node(NODE, _preload_content=False).data)
            uuids, cap = node_gpu_uuids(raw), int(raw["metadata"]["labels"]["nvidia.com/gpu.memory"])
            topology = work / "gpus.json"
            topology.write_text(
                json.dumps({"node": NODE, "gpus": [{"memory_mib": cap, "uuid": u} for u in uuids]})
            )
            token = uuid.uuid4().hex
            server = ServerProcess.start(work / "sim", topology=topology, admin_token=token)
            user = f"gpuconf:agent-bench:{NODE}"
            rbac.ensure_rbac(client.RbacAuthorizationV1Api(box.api_client()), user)
            kubeconfig = box.issue_kubeconfig("agent-bench", user)
            port = free_port()
            argv = [
                *("--node", NODE, "--kubeconfig", str(kubeconfig), "--backend", "sim"),
                *("--sim-dir", str(work / "sim"), "--hook-socket", str(work / "hook.sock")),
                *("--metrics-port", str(port), "--metrics-bind", "127.0.0.1"),
            ]
            agent = AgentProcess(argv, {**os.environ, ADMIN_TOKEN_ENV: token}, work / "agent.log").start()
            hook = HookClient(work / "hook.sock", timeout=60)
            hook.synchronize([])
            namespace = f"bench-{uuid.uuid4().hex[:6]}"
            core.create_namespace({"metadata": {"name": namespace}})

            log("eviction reaction ...")
            trials = [eviction_trial(core, hook, namespace, cap, str(i % 4), i) for i in range(args.trials)]
            reclaimed = [t["memory_reclaimed_s"] for t in trials]
            deleted = [t["deletion_timestamp_s"] for t in trials]
            figures["eviction"] = {
                "memory_reclaimed_s": {
                    "runs": reclaimed,
                    "max": max(reclaimed),
                    "p50": statistics.median(reclaimed),
                },
                "deletion_timestamp_s": {
                    "runs": deleted,
                    "max": max(deleted),
                    "p50": statistics.median(deleted),
                },
                "target_s": 1.0,
            }

            log(f"creating {args.pods} bound Pods ...")
            t0 = time.monotonic()
            names = [f"p-{i:04d}" for i in range(args.pods)]

            def create(i: int) -> dict[str, Any]:
                ann = placement("main", 100, 200, (str(i % 4),))
                core.create_namespaced_pod(namespace, bound_pod(names[i], ann))
                return read(core, namespace, names[i])

            with ThreadPoolExecutor(8) as pool:
                pods = list(pool.map(create, range(args.pods)))
            figures["pod_create_s"] = round(time.monotonic() - t0, 1)
            before = proc_figures(agent.pid)
            log("CreateContainer for each ...")
            latencies = []
            for pod in pods:
                t = time.perf_counter()
                adjustment = hook.create_container(pod, "main")
                latencies.append((time.perf_counter() - t) * 1000)
                assert adjustment.allowed, adjustment.message
            figures["create_container_ms"] = {
                "p50": round(percentile(latencies, 50), 2),
                "p99": round(percentile(latencies, 99), 2),
                "max": round(max(latencies), 2),
            }
            time.sleep(5)  # the watch has seen every Pod; the evictor polls a node of N clients
            t = time.perf_counter()
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as resp:
                text = resp.read().decode()
            figures["metrics_scrape_ms"] = round((time.perf_counter() - t) * 1000, 1)
            figures["metrics_series"] = sum(
                1 for line in text.splitlines() if line and not line.startswith("#")
            )
            mid = proc_figures(agent.pid)
            time.sleep(10)
            after = proc_figures(agent.pid)
            figures["agent"] = {
                "rss_mib_before_pods": before["rss_mib"],
                "rss_mib_with_pods": after["rss_mib"],
                "idle_cpu_percent_with_pods": round((after["cpu_s"] - mid["cpu_s"]) / 10 * 100, 1),
            }

            log("SIGKILL and restart ...")
            running = [RunningContainer(ref(p), os.getpid()) for p in pods]
            agent.kill()
            t0 = time.monotonic()
            agent = AgentProcess(argv, {**os.environ, ADMIN_TOKEN_ENV: token}, work / "agent.log").start()
            ready = time.monotonic() - t0
            hook.synchronize(running)
            synced = time.monotonic() - t0
            figures["restart"] = {
                "ready_s": round(ready, 2),
                "adopted": agent.ready["adopted"],
                "synchronized_s": round(synced, 2),
                "target_s": 5.0,
            }
            core.delete_namespace(namespace)
        finally:
            if agent is not None:
                agent.stop()
            if server is not None:
                server.stop()
            box.down()
    print(json.dumps(figures))
    return 0


if __name__ == "__main__":
    sys.exit(main())

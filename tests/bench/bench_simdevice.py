"""Benchmark of the simulated GPU device through its socket; prints one JSON object on stdout.

    .venv/bin/python tests/bench/bench_simdevice.py [--allocs N] [--clients K]

Measures, against a real ``python -m enforcement.sim.server`` process:

* ``single_client``: allocations per second of one client (alloc and free alternating on one
  connection; only the allocs are timed), with p50/p99/max latency of one allocation;
* ``concurrent_clients``: the same from K client processes at once, aggregated;
* ``alloc_until_oom_80gib``: the wall time of one client's ``alloc-until-oom`` over an 80 GiB hard
  limit at 1 MiB granularity, in process (the runner's search over the socket) and as the whole
  workload process (interpreter start included), with the number of allocation calls it took;
* ``kernel_cost_model``: two simulated-H200 clients computing at once, in real time, each one's
  work per second over its solo speed (large and small sm-sharing kernels, time-slicing).

Figures, not assertions: the tests assert behaviour, never timings, so that a loaded CI runner
cannot make them flaky. Run this by hand and compare.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from enforcement.sim.admin import client_spec  # noqa: E402
from enforcement.sim.process import ServerProcess  # noqa: E402
from enforcement.sim.testing import container_env, short_tempdir  # noqa: E402
from workloads.allocate import Runner  # noqa: E402
from workloads.backends import SimBackend  # noqa: E402
from workloads.plan import parse_plan  # noqa: E402
from workloads.process import run_workload  # noqa: E402
from workloads.simclient import DeviceClient  # noqa: E402

MiB = 1 << 20

# One client's loop, run in its own process for the concurrent figure.
CLIENT_LOOP = r"""
import json, sys, time
from workloads.simclient import DeviceClient
c = DeviceClient(sys.argv[1], sys.argv[2])
n = int(sys.argv[3])
sys.stdin.readline()  # start together
t0 = time.perf_counter()
for _ in range(n):
    c.free(c.alloc(0, 1 << 20).handle)
print(json.dumps({"seconds": time.perf_counter() - t0}), flush=True)
"""


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


def single_client(server: ServerProcess, allocs: int) -> dict[str, Any]:
    with server.admin() as admin:
        token = admin.attach(client_spec("bench/single", ["1"], 1024)).token
    client = DeviceClient(server.client_socket, token)
    for _ in range(200):  # warm up the server thread and the caches
        client.free(client.alloc(0, MiB).handle)
    latencies = []
    for _ in range(allocs):
        t0 = time.perf_counter()
        handle = client.alloc(0, MiB).handle
        latencies.append(time.perf_counter() - t0)
        client.free(handle)
    client.close()
    total = sum(latencies)
    return {
        "allocs": allocs,
        "allocs_per_s": round(allocs / total),
        "latency_us": {
            "p50": round(percentile(latencies, 50) * 1e6, 1),
            "p99": round(percentile(latencies, 99) * 1e6, 1),
            "max": round(max(latencies) * 1e6, 1),
            "mean": round(statistics.fmean(latencies) * 1e6, 1),
        },
    }


def concurrent_clients(server: ServerProcess, clients: int, allocs: int) -> dict[str, Any]:
    with server.admin() as admin:
        tokens = [admin.attach(client_spec(f"bench/c{i}", ["2"], 64)).token for i in range(clients)]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CLIENT_LOOP, server.client_socket, t, str(allocs)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for t in tokens
    ]
    time.sleep(1.0)  # a benchmark, not a test: let the interpreters finish starting
    t0 = time.perf_counter()
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    per_client = [json.loads(p.communicate()[0])["seconds"] for p in procs]
    wall = time.perf_counter() - t0
    return {
        "clients": clients,
        "allocs_each": allocs,
        "aggregate_allocs_per_s": round(clients * allocs / wall),
        "slowest_client_s": round(max(per_client), 3),
        "note": "each iteration is one alloc and one free round trip; the rate counts allocs only",
    }


def alloc_until_oom(server: ServerProcess, directory: Path) -> dict[str, Any]:
    with server.admin() as admin:
        token = admin.attach(client_spec("bench/probe", ["0"], 81920)).token
    backend = SimBackend(DeviceClient(server.client_socket, token))
    plan = parse_plan([{"op": "alloc-until-oom", "granularity": "1Mi"}])
    t0 = time.perf_counter()
    _code, result = Runner(plan, backend, io.StringIO(), install_signal_handlers=False).run()
    in_process = time.perf_counter() - t0
    step = result["steps"][0]
    backend.close()

    with server.admin() as admin:
        token = admin.attach(client_spec("bench/probe-process", ["0"], 81920)).token
    env = container_env(server.client_socket, token)
    t0 = time.perf_counter()
    run = run_workload([{"op": "alloc-until-oom", "granularity": "1Mi"}], env, directory / "term")
    process_wall = time.perf_counter() - t0
    proc_step = run.result["steps"][0]
    return {
        "hard_limit_mib": 81920,
        "granularity_mib": 1,
        "found_mib": step["max_bytes"] // MiB,
        "alloc_calls": step["allocs"] + step["failures"],
        "search_s_in_process": round(in_process, 4),
        "search_s_in_workload": round(proc_step["ms"] / 1000, 4),
        "workload_process_wall_s": round(process_wall, 3),
        "workload_exit_code": run.exit_code,
    }


def kernel_cost_model(seconds: float = 1.0) -> dict[str, Any]:
    """The h200 cost model in real time: two clients computing at once, each one's work per second
    over its solo speed (1.0). The unit tests assert the model in virtual time; this is what a loaded
    machine makes of it (model: about 0.5 for large sm-sharing kernels and for time-slicing, about 1
    for small sm-sharing ones)."""
    import threading

    from enforcement.sim.model import SimNode
    from enforcement.sim.topology import make_gpus
    from workloads.backends import sm_fraction

    def rates(mode: str, matrix: int) -> list[float]:
        node = SimNode("bench", make_gpus("bench", [10000]), fidelity="h200")
        ctxs = []
        for i in range(2):
            token = node.attach(client_spec(f"c{i}", ["0"], 1000, None, mode)).token
            ctxs.append(node.open_context(token)[0])
        out = [0.0, 0.0]

        def run(i: int) -> None:
            began, work = time.monotonic(), 0.0
            while time.monotonic() - began < seconds:
                work += node.kernel(ctxs[i], 0, 0.04, sm_fraction(matrix)).work_s
            out[i] = round(work / (time.monotonic() - began), 3)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return out

    return {
        "sm_sharing_large_kernels": rates("sm-sharing", 4096),
        "sm_sharing_small_kernels": rates("sm-sharing", 1024),
        "time_slicing": rates("time-slicing", 1024),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--allocs", type=int, default=20000)
    parser.add_argument("--clients", type=int, default=4)
    args = parser.parse_args()
    with short_tempdir("gsim-bench-") as directory:
        with ServerProcess.start(directory, node="bench-node", gpus="81920,1024,1024") as server:
            report = {
                "benchmark": "simulated GPU device (enforcement.sim) through its Unix socket",
                "simulated": True,
                "python": platform.python_version(),
                "cpus": os.cpu_count(),
                "load_avg_1m": round(os.getloadavg()[0], 2),
                "single_client": single_client(server, args.allocs),
                "concurrent_clients": concurrent_clients(server, args.clients, args.allocs // args.clients),
                "alloc_until_oom_80gib": alloc_until_oom(server, directory),
                "kernel_cost_model": kernel_cost_model(),
            }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The implementation under test, completed from what every run already records.

The plugin may fill ``RunRecord.environment`` itself (versions it read from the nodes, the agent's
name and backend); whatever it leaves empty is taken here from the run's options (the scheduler's
name), its preflight (the Kubernetes version, the GPU nodes and their labels) and its target (the
embedded sandbox runs the reference agent on simulated GPUs). Nothing is guessed beyond that: an
unknown stays empty and the reports say "unknown".
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from reports.model import Environment, RunRecord

REFERENCE_AGENT = "gpuconf reference agent"


def complete(record: RunRecord) -> Environment:
    env = record.environment
    pre = record.preflight or {}
    nodes: list[dict[str, Any]] = list(env.nodes) or [dict(n) for n in pre.get("gpuNodes") or []]
    first = nodes[0] if nodes else {}
    simulated = env.simulated
    if simulated is None and "simulatedGpus" in pre:
        simulated = bool(pre["simulatedGpus"])
    if simulated is None and nodes and all("simulated" in n for n in nodes):
        simulated = all(bool(n["simulated"]) for n in nodes)
    sandbox = record.target.get("kind") == "gpuconf-sandbox"
    return replace(
        env,
        scheduler_name=env.scheduler_name or str(record.options.get("schedulerName") or ""),
        node_agent=env.node_agent or (REFERENCE_AGENT if sandbox else ""),
        agent_backend=env.agent_backend or ("sim" if sandbox else ""),
        simulated=simulated,
        gpu_product=env.gpu_product or str(first.get("product") or ""),
        gpu_count=env.gpu_count or sum(int(n.get("gpus") or 0) for n in nodes),
        gpu_memory_mib=env.gpu_memory_mib or int(first.get("memoryMiB") or 0),
        driver_version=env.driver_version or str(first.get("driverVersion") or ""),
        cuda_version=env.cuda_version or str(first.get("cudaVersion") or ""),
        kubernetes_version=env.kubernetes_version or str(pre.get("kubernetesVersion") or ""),
        nodes=nodes,
    )


def describe(env: Environment) -> list[tuple[str, str]]:
    """(label, value) rows a person reads: every report shows the same ones, "unknown" when empty."""

    def val(value: object) -> str:
        return str(value) if value not in ("", None, 0) else "unknown"

    gpus = "unknown"
    if env.simulated is not None:
        gpus = "simulated" if env.simulated else "real"
    sched = env.scheduler_name + (f" {env.scheduler_version}" if env.scheduler_version else "")
    agent = env.node_agent + (f" ({env.agent_backend} backend)" if env.agent_backend else "")
    return [
        ("Scheduler", val(sched.strip())),
        ("Node agent", val(agent.strip())),
        ("GPUs", gpus),
        ("GPU product", val(env.gpu_product)),
        ("GPU count", val(env.gpu_count)),
        ("GPU memory (MiB)", val(env.gpu_memory_mib)),
        ("Driver", val(env.driver_version)),
        ("CUDA", val(env.cuda_version)),
        ("Kubernetes", val(env.kubernetes_version)),
    ]

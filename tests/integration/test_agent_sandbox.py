"""The reference node agent as a process, on the sandbox's real API server, with a real device server.

The session sandbox runs no agent and no node runtime, so this module plays the runtime itself: it
starts a simulated device server for node ``gpu-a-0`` (with the Node's own GPU UUIDs), starts the
agent as ``python -m enforcement.agent`` under its own RBAC-restricted identity, creates bound Pods
and calls the agent's hook exactly as the runtime does (``HookClient``), then runs
``python -m workloads.allocate`` with the environment the agent answered.

The tests share one agent and one device (starting them costs seconds on a loaded runner) and use
separate GPUs where their memory must not meet; the last two restart the agent and the device.
"""

from __future__ import annotations

import json
import os
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.samples import Sample

from enforcement.agent import rbac
from enforcement.agent.kube import CONDITION_TYPE, REASON_EVICTED, REASON_MODE_CONFLICT, REASON_REJECTED
from enforcement.agent.metrics import parse, sample_value
from enforcement.agent.testing import AgentProcess
from enforcement.contract import node_gpu_uuids
from enforcement.hook import REASON_CONFIG_ERROR, Adjustment, ContainerRef, HookClient, RunningContainer
from enforcement.sim import ADMIN_TOKEN_ENV, SMI_BIN_DIR
from enforcement.sim.process import ServerProcess
from enforcement.sim.testing import short_tempdir
from fixtures.sandbox.controlplane import Sandbox
from fixtures.sandbox.processes import free_port
from fixtures.suite import manifests
from fixtures.suite.manifests import placement_annotations as placement
from fixtures.suite.waiting import wait_until
from workloads.process import WorkloadProcess

pytestmark = pytest.mark.sandbox

NODE = "gpu-a-0"
MIB = 1 << 20
WAIT_S = 60.0  # generous: a loaded 2-core runner starts interpreters in seconds


@dataclass
class Node:
    """The device, the agent and the hook of ``gpu-a-0`` for this module."""

    sandbox: Sandbox
    dir: Path
    topology: Path
    token: str
    server: ServerProcess
    agent: AgentProcess
    hook: HookClient
    uuids: tuple[str, ...]
    memory_mib: int
    running: dict[tuple[str, str], RunningContainer]

    def start_server(self) -> None:
        self.server = ServerProcess.start(self.dir / "sim", topology=self.topology, admin_token=self.token)

    def restart_agent(self, kill: bool = True) -> AgentProcess:
        self.agent.kill() if kill else self.agent.stop()
        self.agent = AgentProcess(self.agent.argv, self.agent.env, self.agent.log_path).start()
        # NRI's rule, as the runtime follows it: Synchronize before anything else.
        self.hook.synchronize(list(self.running.values()))
        return self.agent

    def metrics(self) -> list[Sample]:
        """What the agent serves, read by prometheus_client's parser as a scraper reads it."""
        port = self.agent.ready["metrics_port"]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
            return parse(resp.read().decode())

    def fraction(self, name: str, **labels: str) -> list[Sample]:
        """The samples of family ``name`` whose labels include ``labels``."""
        return [s for s in self.metrics() if s.name == name and labels.items() <= s.labels.items()]

    def env(self, adjustment: Adjustment) -> dict[str, str]:
        env = dict(os.environ)
        env.update(adjustment.env)
        env["PATH"] = os.pathsep.join((str(SMI_BIN_DIR), env.get("PATH", "")))
        return env


@pytest.fixture(scope="module")
def node(sandbox: Sandbox) -> Iterator[Node]:
    from kubernetes import client

    core = sandbox.core_v1()
    raw = json.loads(core.read_node(NODE, _preload_content=False).data)
    uuids = node_gpu_uuids(raw)
    memory_mib = int(raw["metadata"]["labels"]["nvidia.com/gpu.memory"])
    user = f"gpuconf:agent-test:{NODE}"
    rbac.ensure_rbac(client.RbacAuthorizationV1Api(sandbox.api_client()), user)
    kubeconfig = sandbox.issue_kubeconfig(f"agent-test-{NODE}", user)
    with short_tempdir("gagent-") as directory:
        topology = directory / "gpus.json"
        topology.write_text(
            json.dumps({"node": NODE, "gpus": [{"memory_mib": memory_mib, "uuid": u} for u in uuids]})
        )
        token = uuid.uuid4().hex
        server = ServerProcess.start(directory / "sim", topology=topology, admin_token=token)
        hook_path = directory / "hook.sock"
        argv = [
            "--node",
            NODE,
            "--kubeconfig",
            str(kubeconfig),
            "--backend",
            "sim",
            "--sim-dir",
            str(directory / "sim"),
            "--hook-socket",
            str(hook_path),
            "--metrics-port",
            str(free_port()),
            "--metrics-bind",
            "127.0.0.1",
        ]
        env = {**os.environ, ADMIN_TOKEN_ENV: token}
        agent = AgentProcess(argv, env, directory / "agent.log").start()
        state = Node(
            sandbox,
            directory,
            topology,
            token,
            server,
            agent,
            HookClient(hook_path, 30),
            uuids,
            memory_mib,
            {},
        )
        try:
            state.hook.synchronize([])
            yield state
        finally:
            state.agent.stop()
            state.server.stop()
            log = (directory / "agent.log").read_text(errors="replace")
            print(f"--- agent log (tail) ---\n{log[-6000:]}")
            assert "Traceback" not in log, "the agent logged a traceback"


def create_pod(sandbox: Sandbox, namespace: str, name: str, annotations: dict[str, str]) -> dict[str, Any]:
    core = sandbox.core_v1()
    main = manifests.container("main", image="gpuconf-workload:test", command=("true",))
    body = manifests.pod(name, [main], annotations=annotations, node_name=NODE, restart_policy="Always")
    core.create_namespaced_pod(namespace, body)
    return json.loads(core.read_namespaced_pod(name, namespace, _preload_content=False).data)


def ref(pod: dict[str, Any]) -> ContainerRef:
    meta = pod["metadata"]
    return ContainerRef(meta["namespace"], meta["name"], meta["uid"], "main")


def start(node: Node, pod: dict[str, Any], plan: dict[str, Any]) -> tuple[Adjustment, WorkloadProcess]:
    adjustment = node.hook.create_container(pod, "main")
    assert adjustment.allowed, adjustment.message
    proc = WorkloadProcess(plan, node.env(adjustment), node.dir / f"term-{uuid.uuid4().hex[:6]}")
    node.running[(pod["metadata"]["uid"], "main")] = RunningContainer(ref(pod), proc.pid)
    return adjustment, proc


def stopped(node: Node, pod: dict[str, Any], code: int | None = 0) -> None:
    node.running.pop((pod["metadata"]["uid"], "main"), None)
    node.hook.stop_container(ref(pod), code)


def events(sandbox: Sandbox, pod: dict[str, Any], reason: str) -> list[dict[str, Any]]:
    core = sandbox.core_v1()
    meta = pod["metadata"]
    resp = core.list_namespaced_event(
        meta["namespace"], field_selector=f"involvedObject.uid={meta['uid']}", _preload_content=False
    )
    return [e for e in json.loads(resp.data)["items"] if e.get("reason") == reason]


def condition(sandbox: Sandbox) -> dict[str, Any]:
    raw = json.loads(sandbox.core_v1().read_node(NODE, _preload_content=False).data)
    return next(c for c in raw["status"]["conditions"] if c["type"] == CONDITION_TYPE)


def test_annotated_pod_gets_its_enforcement_env_and_a_device_token(node: Node, namespace: str) -> None:
    pod = create_pod(node.sandbox, namespace, "fenced", placement("main", 512, 1024, ("0",)))
    adjustment = node.hook.create_container(pod, "main")
    assert adjustment.allowed, adjustment.message
    env = adjustment.env
    assert env["NVIDIA_GPU_MEMORY_REQUEST"] == "512" and env["NVIDIA_GPU_MEMORY_LIMIT"] == "1024"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=1024M"
    assert env["NVIDIA_VISIBLE_DEVICES"] == node.uuids[0]
    assert env["GPUCONF_SIM_SOCKET"] == node.server.client_socket and env["GPUCONF_SIM_TOKEN"]
    stopped(node, pod)


def test_the_workload_allocates_to_its_limit_and_gets_oom_past_it(node: Node, namespace: str) -> None:
    pod = create_pod(node.sandbox, namespace, "limit", placement("main", 256, 768, ("0",)))
    plan = {"name": "limit", "steps": [{"op": "alloc-until-oom", "limit": "2Gi"}, {"op": "smi"}]}
    _adj, proc = start(node, pod, plan)
    run = proc.finish()
    stopped(node, pod, run.exit_code)
    step = run.result["steps"][0]
    assert step["stopped_by"] == "oom" and step["max_bytes"] == 768 * MIB, run.stdout
    assert step["oom"]["reason"] == "hard-limit"
    assert run.result["steps"][1]["gpus"][0]["total_mib"] == 768  # nvidia-smi shows the limit


def test_a_borrower_is_evicted_through_the_eviction_api_when_a_guaranteed_neighbour_needs_memory(
    node: Node, namespace: str
) -> None:
    cap = node.memory_mib
    guaranteed = create_pod(
        node.sandbox, namespace, "guaranteed", placement("main", cap // 2, cap // 2, ("1",))
    )
    borrower = create_pod(node.sandbox, namespace, "borrower", placement("main", 1024, cap - 1024, ("1",)))
    _b, b_proc = start(
        node,
        borrower,
        {
            "name": "borrower",
            "steps": [
                {"op": "alloc", "bytes": (cap * 7 // 8) * MIB, "chunk": (cap // 8) * MIB},
                {"op": "heartbeat", "interval": 0.2, "until_signal": "SIGTERM"},
            ],
        },
    )
    b_proc.wait_for("heartbeat 1")
    _g, g_proc = start(
        node,
        guaranteed,
        {
            "name": "guaranteed",
            "steps": [
                {
                    "op": "alloc",
                    "bytes": (cap // 2) * MIB,
                    "chunk": (cap // 8) * MIB,
                    "retry_on_pressure": 30,
                    "retry_interval": 0.05,
                }
            ],
        },
    )
    g_run = g_proc.finish()
    assert g_run.exit_code == 0, g_run.stdout
    core = node.sandbox.core_v1()
    evicted = core.read_namespaced_pod("borrower", namespace)
    assert evicted.metadata.deletion_timestamp is not None
    assert core.read_namespaced_pod("guaranteed", namespace).metadata.deletion_timestamp is None
    (event,) = wait_until(
        lambda: events(node.sandbox, borrower, REASON_EVICTED), "the eviction Event", timeout=WAIT_S
    )
    assert event["type"] == "Warning" and "above its guarantee" in event["message"]
    assert f"Pod {namespace}/guaranteed" in event["message"]
    b_run = b_proc.finish()
    assert b_run.result["status"] == "client-gone", b_run.stdout  # its device calls say it was evicted
    reaction = sample_value(node.metrics(), "gpu_fractioning_agent_last_eviction_reaction_seconds")
    assert reaction is not None and 0 <= reaction <= 1.0
    stopped(node, borrower, b_run.exit_code)
    stopped(node, guaranteed)
    core.delete_namespaced_pod("borrower", namespace, grace_period_seconds=0)  # no kubelet to confirm


def test_a_malformed_pod_is_refused_with_an_event_naming_key_and_rule(node: Node, namespace: str) -> None:
    annotations = placement("main", 64, 64, ("0",))
    key = "nvidia.com/container.main.gpu-memory.limit"
    annotations[key] = "lots"
    pod = create_pod(node.sandbox, namespace, "malformed", annotations)
    adjustment = node.hook.create_container(pod, "main")
    assert not adjustment.allowed and adjustment.reason == REASON_CONFIG_ERROR
    assert key in adjustment.message and "[memory-quantity]" in adjustment.message
    (event,) = wait_until(
        lambda: events(node.sandbox, pod, REASON_REJECTED), "the refusal Event", timeout=WAIT_S
    )
    assert key in event["message"] and "memory-quantity" in event["message"]
    assert event["source"]["component"] == "gpuconf-node-agent"


def test_a_mode_conflict_is_refused_with_an_event_naming_both_pods(node: Node, namespace: str) -> None:
    first = create_pod(node.sandbox, namespace, "ts", placement("main", 64, 64, ("2",)))
    second = create_pod(node.sandbox, namespace, "sm", placement("main", 64, 64, ("2",), "sm-sharing"))
    assert node.hook.create_container(first, "main").allowed
    adjustment = node.hook.create_container(second, "main")
    assert not adjustment.allowed
    (event,) = wait_until(
        lambda: events(node.sandbox, second, REASON_MODE_CONFLICT), "the mode Event", timeout=WAIT_S
    )
    for word in (f"{namespace}/ts", f"{namespace}/sm", "time-slicing", "sm-sharing"):
        assert word in event["message"]
    stopped(node, first)


def test_metrics_show_the_fraction(node: Node, namespace: str) -> None:
    pod = create_pod(node.sandbox, namespace, "metered", placement("main", 200, 400, ("3",)))
    _adj, proc = start(
        node,
        pod,
        {
            "name": "m",
            "steps": [{"op": "alloc", "bytes": "300Mi"}, {"op": "hold", "until_signal": "SIGTERM"}],
        },
    )
    proc.wait_for("holding")
    uid = pod["metadata"]["uid"]
    labels = dict(
        namespace=namespace, pod="metered", pod_uuid=uid, container="main", gpu_uuid=node.uuids[3], gpu="3"
    )
    # Usage is sampled from the backend on the evictor's cycle: the allocation shows up within one.
    wait_until(
        lambda: sample_value(node.metrics(), "gpu_fractioning_gpu_memory_used_bytes", **labels) == 300 * MIB,
        "the workload's usage in the metrics",
        timeout=WAIT_S,
    )
    samples = node.metrics()
    assert sample_value(samples, "gpu_fractioning_gpu_memory_limit_bytes", **labels) == 400 * MIB
    assert sample_value(samples, "gpu_fractioning_gpu_memory_request_bytes", **labels) == 200 * MIB
    proc.proc.terminate()
    stopped(node, pod, proc.finish().exit_code)
    wait_until(
        lambda: not [s for s in node.metrics() if s.labels.get("pod_uuid") == uid],
        "the fraction gone from the metrics",
        timeout=WAIT_S,
    )


def test_a_killed_agent_readopts_its_containers_and_resumes_eviction(node: Node, namespace: str) -> None:
    cap = node.memory_mib
    guaranteed = create_pod(node.sandbox, namespace, "g2", placement("main", cap // 2, cap // 2, ("3",)))
    borrower = create_pod(node.sandbox, namespace, "b2", placement("main", 1024, cap - 1024, ("3",)))
    _b, b_proc = start(
        node,
        borrower,
        {
            "name": "b2",
            "steps": [
                {"op": "alloc", "bytes": (cap * 7 // 8) * MIB, "chunk": (cap // 8) * MIB},
                {"op": "heartbeat", "interval": 0.2, "until_signal": "SIGTERM"},
            ],
        },
    )
    b_proc.wait_for("heartbeat 1")
    g_adj = node.hook.create_container(guaranteed, "main")
    assert g_adj.allowed
    node.agent.kill()  # SIGKILL: no goodbye, nothing flushed
    # The guaranteed workload starts while no agent runs: it waits under pressure.
    g_proc = WorkloadProcess(
        {
            "name": "g2",
            "steps": [
                {
                    "op": "alloc",
                    "bytes": (cap // 2) * MIB,
                    "chunk": (cap // 8) * MIB,
                    "retry_on_pressure": 60,
                    "retry_interval": 0.05,
                }
            ],
        },
        node.env(g_adj),
        node.dir / "term-g2",
    )
    node.running[(guaranteed["metadata"]["uid"], "main")] = RunningContainer(ref(guaranteed), g_proc.pid)
    g_proc.wait_for("step 1/1")
    time.sleep(0.5)  # let it be refused under pressure at least once
    node.restart_agent(kill=True)
    assert node.agent.ready["adopted"] >= 2
    g_run = g_proc.finish()
    assert g_run.exit_code == 0, g_run.stdout
    core = node.sandbox.core_v1()
    evicted_at = wait_until(
        lambda: core.read_namespaced_pod("b2", namespace).metadata.deletion_timestamp,
        "the borrower's eviction",
        timeout=WAIT_S,
    )
    assert core.read_namespaced_pod("g2", namespace).metadata.deletion_timestamp is None
    resumed_s = time.monotonic() - node.agent.started_at
    print(f"evicted {resumed_s:.2f} s after the new agent process started (deletionTimestamp {evicted_at})")
    assert resumed_s < 30.0  # the figure to report comes from the benchmark; this bounds a loaded runner
    # Nothing lost: the guaranteed Pod is still fenced and measured by the new process.
    assert node.fraction("gpu_fractioning_gpu_memory_request_bytes", pod="g2")
    b_run = b_proc.finish()
    stopped(node, borrower, b_run.exit_code)
    stopped(node, guaranteed)
    core.delete_namespaced_pod("b2", namespace, grace_period_seconds=0)


def test_the_node_condition_follows_the_device(node: Node, namespace: str) -> None:
    wait_until(lambda: condition(node.sandbox)["status"] == "True", "Ready=True", timeout=WAIT_S)
    held = create_pod(node.sandbox, namespace, "held", placement("main", 64, 64, ("0",)))
    assert node.hook.create_container(held, "main").allowed
    node.running[(held["metadata"]["uid"], "main")] = RunningContainer(ref(held), os.getpid())
    node.server.stop()
    try:
        down = wait_until(
            lambda: (c := condition(node.sandbox))["status"] == "False" and c, "Ready=False", timeout=WAIT_S
        )
        assert down["reason"] == "SimulatedDeviceUnavailable"
        plain = node.hook.create_container(create_pod(node.sandbox, namespace, "while-down", {}), "main")
        assert plain.allowed  # a container without a fraction needs no device
        fenced = node.hook.create_container(
            create_pod(node.sandbox, namespace, "fenced-while-down", placement("main", 64, 64, ("1",))),
            "main",
        )
        assert not fenced.allowed and fenced.reason == "CreateContainerError"  # never unfenced
    finally:
        # Later modules share gpu-a-0 and expect it Ready: bring the device back whatever happened.
        node.start_server()
    up = wait_until(
        lambda: (c := condition(node.sandbox))["status"] == "True" and c, "Ready=True again", timeout=WAIT_S
    )
    assert up["reason"] == "SimulatedDeviceReady"
    # The restarted device lost every client: the running fenced container is re-fenced and reported.
    wait_until(lambda: events(node.sandbox, held, "GPUFenceLost"), "the GPUFenceLost Event", timeout=WAIT_S)
    stopped(node, held)

"""Restart recovery, Synchronize, reconciliation after a backend outage, and the node condition."""

from __future__ import annotations

import threading

import pytest
from agent_pods import make_pod, placement

from enforcement.agent.agent import HealthLoop
from enforcement.agent.evictor import Evictor
from enforcement.agent.handler import AgentCore
from enforcement.agent.kube import REASON_FENCE_LOST, RecordingKube
from enforcement.agent.metrics import Metrics
from enforcement.agent.options import AgentOptions
from enforcement.agent.testing import SimAgent, sim_agent
from enforcement.backends import BackendUnavailable, Health
from enforcement.hook import ContainerRef, RunningContainer
from enforcement.sim.admin import client_spec
from workloads.simwire import SIM_TOKEN_ENV, SimPressure

MIB = 1 << 20


def restarted(agent: SimAgent, options: AgentOptions | None = None) -> AgentCore:
    """A fresh agent process on the same device: nothing in memory."""
    return AgentCore(
        agent.backend,
        agent.kube,
        options or AgentOptions(node="node-a"),
        metrics=Metrics(),
        log=lambda _m: None,
    )


def admit(agent: SimAgent, name: str, ann: dict, container: str = "main") -> tuple[dict, str]:
    pod = make_pod(name, ann)
    adj = agent.core.create_container(pod, container)
    assert adj.allowed, adj.message
    return pod, adj.env[SIM_TOKEN_ENV]


def ref(pod: dict, container: str = "main") -> ContainerRef:
    return ContainerRef("ns", pod["metadata"]["name"], pod["metadata"]["uid"], container)


def test_a_restarted_agent_readopts_every_container_with_its_fraction() -> None:
    agent = sim_agent()
    admit(agent, "a", placement("main", 100, 200, devices=("1",)))
    admit(agent, "b", placement("main", 50, 50, devices=("0",), mode="sm-sharing", portion=0.25))
    before = {t.client: t for t in agent.core.registry.all()}
    core = restarted(agent)
    assert core.adopt() == 2
    after = {t.client: t for t in core.registry.all()}
    assert after.keys() == before.keys()
    for name, t in after.items():
        old = before[name]
        assert t.adopted and t.ref == old.ref and t.gpus == old.gpus
        f, g = t.fraction, old.fraction
        assert (f.request_mib, f.limit_mib, f.mode, f.portion) == (
            g.request_mib,
            g.limit_mib,
            g.mode,
            g.portion,
        )
    assert core.metrics.value("gpu_fractioning_agent_adopted_containers_total") == 2
    # and it still guards modes on their GPUs
    adj = core.create_container(make_pod("c", placement("main", 16, 16, devices=("0",))), "main")
    assert not adj.allowed and "ns/b" in adj.message


def test_a_restarted_agent_resumes_eviction() -> None:
    agent = sim_agent((1024,))
    node = agent.node
    _b, token = admit(agent, "borrower", placement("main", 64, 900))
    ctx, _ = node.open_context(token)
    node.alloc(ctx, 0, 800 * MIB)
    _g, gtoken = admit(agent, "guaranteed", placement("main", 512, 512))
    core = restarted(agent)
    core.adopt()
    gctx, _ = node.open_context(gtoken)
    with pytest.raises(SimPressure):
        node.alloc(gctx, 0, 512 * MIB)
    assert [v.client for v in Evictor(core).run_once()] == ["ns/borrower/main"]
    node.alloc(gctx, 0, 512 * MIB)


def test_no_recovery_fault_adopts_nothing_so_nothing_is_evicted() -> None:
    agent = sim_agent((1024,))
    admit(agent, "a", placement("main", 64, 900))
    core = restarted(agent, AgentOptions(node="node-a", faults=frozenset({"no-recovery"})))
    assert core.adopt() == 0 and len(core.registry) == 0


def test_clients_attached_by_someone_else_are_not_adopted() -> None:
    agent = sim_agent()
    agent.node.attach(client_spec("outsider", ["0"], 16, 16, labels={"namespace": "x"}))
    other = sim_agent(sim_node=agent.node, options=AgentOptions(node="node-b"))
    admit(other, "theirs", placement("main", 16, 16, devices=("1",)))
    assert restarted(agent).adopt() == 0


def test_synchronize_releases_containers_that_stopped_while_the_agent_was_away() -> None:
    agent = sim_agent()
    a, _ = admit(agent, "a", placement("main", 16, 16))
    admit(agent, "b", placement("main", 16, 16))
    core = restarted(agent)
    core.adopt()
    core.synchronize([RunningContainer(ref(a), 4242)])
    assert [c.name for c in agent.node.snapshot().clients] == ["ns/a/main"]
    assert [t.client for t in core.registry.all()] == ["ns/a/main"]


def test_synchronize_adopts_running_containers_a_fresh_agent_never_saw() -> None:
    agent = sim_agent()
    a, _ = admit(agent, "a", placement("main", 16, 16))
    core = restarted(agent)  # no adopt(): Synchronize alone must be enough
    core.synchronize([RunningContainer(ref(a), 4242)])
    assert core.registry.get("ns/a/main") is not None


def test_a_running_container_the_backend_lost_is_refenced_and_reported() -> None:
    agent = sim_agent()
    a, _ = admit(agent, "a", placement("main", 100, 200))
    agent.node.detach("ns/a/main")  # as if the device had restarted
    agent.core.synchronize([RunningContainer(ref(a), 4242)])
    held = [c for c in agent.node.snapshot().clients if c.name == "ns/a/main"]
    assert held and held[0].gpus[0].hard_limit_bytes == 200 * MIB
    (event,) = agent.kube.events_for(REASON_FENCE_LOST)
    assert event.ref.pod == "a" and "restart the Pod" in event.message
    assert agent.core.registry.get("ns/a/main").fence_lost


def test_a_running_fractional_container_nobody_knows_is_refenced_from_its_pod() -> None:
    kube = RecordingKube()
    agent = sim_agent(kube=kube)
    pod = make_pod("a", placement("main", 100, 200))
    kube.pods[("ns", "a")] = pod
    agent.core.synchronize([RunningContainer(ref(pod), 4242)])
    assert [c.name for c in agent.node.snapshot().clients] == ["ns/a/main"]
    assert kube.reasons() == [REASON_FENCE_LOST]


def test_a_running_container_without_a_fraction_is_left_alone() -> None:
    kube = RecordingKube()
    agent = sim_agent(kube=kube)
    pod = make_pod("plain", {})
    kube.pods[("ns", "plain")] = pod
    agent.core.synchronize([RunningContainer(ref(pod), 4242)])
    assert agent.node.snapshot().clients == () and kube.events == []


def test_after_a_backend_outage_lost_clients_are_refenced_and_unreleased_ones_released() -> None:
    agent = sim_agent()
    a, _ = admit(agent, "a", placement("main", 16, 16))
    b, _ = admit(agent, "b", placement("main", 16, 16))
    real_detach = agent.backend.detach

    def down(*_a, **_k):
        raise BackendUnavailable("down")

    agent.backend.detach = down  # type: ignore[method-assign]
    agent.core.stop_container(ref(b), 0)  # cannot release now: remembered
    agent.backend.detach = real_detach  # type: ignore[method-assign]
    agent.node.detach("ns/a/main")  # lost while the backend was away
    agent.core.reconcile_backend()
    assert [c.name for c in agent.node.snapshot().clients] == ["ns/a/main"]
    assert agent.kube.reasons() == [REASON_FENCE_LOST]


def test_prune_releases_pods_gone_from_a_full_list_but_not_newer_admissions() -> None:
    now = [100.0]
    agent = sim_agent()
    agent.core.clock = lambda: now[0]
    old, _ = admit(agent, "old", placement("main", 16, 16))
    now[0] = 200.0
    admit(agent, "new", placement("main", 16, 16))
    agent.core.prune(live_uids=set(), listed_at=150.0)
    assert [c.name for c in agent.node.snapshot().clients] == ["ns/new/main"]
    uid = next(t.ref.pod_uid for t in agent.core.registry.all())
    agent.core.forget_pod(uid)
    assert agent.node.snapshot().clients == ()
    assert agent.kube.forgotten == [uid]  # and the Event recorder forgets the deleted Pod


def test_health_loop_flips_the_condition_and_reconciles_when_the_backend_returns() -> None:
    agent = sim_agent()
    state = {"ok": True}
    real = agent.backend.health

    def health() -> Health:
        return real() if state["ok"] else Health(False, "SimulatedDeviceUnavailable", "gone")

    agent.backend.health = health  # type: ignore[method-assign]
    recovered = []
    loop = HealthLoop(agent.core, lambda: recovered.append(1))
    loop.run_once()
    state["ok"] = False
    loop.run_once()
    loop.run_once()  # unchanged: not written again before the heartbeat
    state["ok"] = True
    loop.run_once()
    assert [(ok, reason) for ok, reason, _m in agent.kube.conditions] == [
        (True, "SimulatedDeviceReady"),
        (False, "SimulatedDeviceUnavailable"),
        (True, "SimulatedDeviceReady"),
    ]
    assert recovered == [1, 1]
    assert agent.core.metrics.value("gpu_fractioning_agent_backend_up") == 1


def test_health_loop_retries_a_condition_the_api_refused() -> None:
    kube = RecordingKube(fail=True)
    agent = sim_agent(kube=kube)
    loop = HealthLoop(agent.core, lambda: None)
    loop.run_once()
    kube.fail = False
    loop.run_once()
    assert [ok for ok, _r, _m in kube.conditions] == [True]


def test_concurrent_admissions_never_mix_modes_on_a_gpu() -> None:
    agent = sim_agent((1024,))
    results: dict[str, bool] = {}

    def go(i: int) -> None:
        mode = "sm-sharing" if i % 2 else "time-slicing"
        pod = make_pod(f"p{i}", placement("main", 8, 8, mode=mode))
        results[f"p{i}"] = agent.core.create_container(pod, "main").allowed

    threads = [threading.Thread(target=go, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    modes = {c.mode for c in agent.node.snapshot().clients}
    assert len(modes) == 1 and sum(results.values()) == 8

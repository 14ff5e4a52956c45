"""The mode guard both ways, and what a restarted agent still refuses; each seeded fault that breaks
one of these (``mode-guard-one-way``, ``forget-modes-after-restart``, ``lenient-after-restart``)
breaks that and nothing else."""

from __future__ import annotations

from agent_pods import make_pod, placement

from enforcement.agent.handler import AgentCore
from enforcement.agent.metrics import Metrics
from enforcement.agent.options import AgentOptions
from enforcement.agent.testing import SimAgent, internal_errors, sim_agent
from enforcement.contract import SUFFIX_MODE, SUFFIX_REQUEST, nvidia_key
from enforcement.hook import Adjustment


def agent(*faults: str) -> SimAgent:
    return sim_agent((1024, 1024), options=AgentOptions(node="node-a", faults=frozenset(faults)))


def restarted(a: SimAgent, *faults: str) -> AgentCore:
    """A fresh agent process on the same device (nothing in memory), with ``faults``."""
    options = AgentOptions(node="node-a", faults=frozenset(faults))
    return AgentCore(a.backend, a.kube, options, metrics=Metrics(), log=lambda _m: None)


def ask(core: AgentCore, name: str, gpu: str, mode: str | None) -> Adjustment:
    """A container of ``mode`` (None: no mode annotation, so time-slicing) on GPU ``gpu``."""
    ann = placement("main", 16, 16, devices=(gpu,), mode=mode or "time-slicing")
    if mode is None:
        del ann[nvidia_key("main", SUFFIX_MODE)]
    return core.create_container(make_pod(name, ann), "main")


def holders(core: AgentCore) -> None:
    """Time-slicing on GPU 0, sm-sharing on GPU 1."""
    assert ask(core, "sliced", "0", "time-slicing").allowed
    assert ask(core, "shared", "1", "sm-sharing").allowed


def malformed(core: AgentCore, name: str) -> Adjustment:
    ann = placement("main", 16, 16, devices=("0",))
    ann[nvidia_key("main", SUFFIX_REQUEST)] = "lots"
    return core.create_container(make_pod(name, ann), "main")


def test_the_guard_refuses_both_ways_and_a_container_without_a_mode_as_time_slicing() -> None:
    a = agent()
    holders(a.core)
    onto_sliced = ask(a.core, "x", "0", "sm-sharing")
    onto_shared = ask(a.core, "y", "1", "time-slicing")
    unset = ask(a.core, "z", "1", None)
    for adj, other in ((onto_sliced, "ns/sliced"), (onto_shared, "ns/shared"), (unset, "ns/shared")):
        assert not adj.allowed and other in adj.message
        assert "time-slicing" in adj.message and "sm-sharing" in adj.message
    assert internal_errors(a.core) == 0


def test_mode_guard_one_way_starts_time_slicing_beside_sm_sharing_and_still_refuses_the_other_way() -> None:
    a = agent("mode-guard-one-way")
    holders(a.core)
    assert not ask(a.core, "x", "0", "sm-sharing").allowed
    assert ask(a.core, "y", "1", "time-slicing").allowed
    assert ask(a.core, "z", "1", None).allowed
    # Same modes still share, and other GPUs are untouched.
    assert ask(a.core, "w", "0", "time-slicing").allowed


def test_a_restarted_agent_still_guards_the_modes_it_adopted_both_ways() -> None:
    a = agent()
    holders(a.core)
    core = restarted(a)
    assert core.adopt() == 2
    assert not ask(core, "x", "0", "sm-sharing").allowed
    assert not ask(core, "y", "1", None).allowed
    assert not malformed(core, "m").allowed


def test_forget_modes_after_restart_starts_conflicts_beside_adopted_containers_only() -> None:
    a = agent("forget-modes-after-restart")
    holders(a.core)
    # Before any restart the guard holds (nothing was adopted).
    assert not ask(a.core, "before", "0", "sm-sharing").allowed
    core = restarted(a, "forget-modes-after-restart")
    assert core.adopt() == 2
    assert ask(core, "x", "0", "sm-sharing").allowed
    assert ask(core, "y", "1", None).allowed
    # Malformed placements are still refused: only the modes were forgotten.
    assert not malformed(core, "m").allowed


def test_forget_modes_after_restart_guards_what_the_restarted_agent_attached_itself() -> None:
    a = agent("forget-modes-after-restart")
    core = restarted(a, "forget-modes-after-restart")
    assert core.adopt() == 0
    assert ask(core, "sliced", "0", "time-slicing").allowed
    assert not ask(core, "x", "0", "sm-sharing").allowed


def test_lenient_after_restart_starts_malformed_contracts_only_after_re_adopting() -> None:
    a = agent("lenient-after-restart")
    assert not malformed(a.core, "m0").allowed
    holders(a.core)
    assert not malformed(a.core, "m1").allowed, "the first process never re-adopted anything"
    empty = restarted(agent("lenient-after-restart"), "lenient-after-restart")
    assert empty.adopt() == 0 and not malformed(empty, "m2").allowed
    core = restarted(a, "lenient-after-restart")
    assert core.adopt() == 2
    adj = malformed(core, "m3")
    assert adj.allowed and dict(adj.env) == {}
    # The mode guard still holds after the restart: only the refusal of malformed contracts went.
    assert not ask(core, "x", "0", "sm-sharing").allowed

"""Judgements the checks share, named as what must hold.

Each helper reads what the cluster shows (a Pod at the moment of binding, the loads on a node's
GPUs), decides with the contract module (``enforcement.contract``: no second parser here) and
raises ``CheckFailed`` with a message that names the Pod, the key and the rule. Each also leaves
what it judged in the check's evidence.
"""

from __future__ import annotations

from typing import Any

from enforcement.contract import (
    SUFFIX_DEVICES,
    SUFFIX_LIMIT,
    SUFFIX_MODE,
    SUFFIX_REQUEST,
    Fraction,
    Violation,
    audit_pod,
    nvidia_key,
    read_placement,
    resolve_device,
)
from fixtures.suite.frame import Suite, fail
from fixtures.suite.podwatch import Snapshot


def pod_at(snapshot: Snapshot) -> dict[str, Any]:
    return dict(snapshot.pod)


def errors_at_bind(suite: Suite, name: str, snapshot: Snapshot) -> list[Violation]:
    """Every contract error on the Pod as it was when bound, judged with its node's record."""
    node = suite.cluster.read_node(snapshot.node)
    return [v for v in audit_pod(pod_at(snapshot), node) if v.is_error]


def placement_must_be_complete(
    suite: Suite, name: str, snapshot: Snapshot, container: str = "main"
) -> Fraction:
    """At binding, ``container`` carries a request and devices, every key names a real container,
    and every value obeys the contract. Returns the placement as the node agent would read it."""
    request_key = nvidia_key(container, SUFFIX_REQUEST)
    devices_key = nvidia_key(container, SUFFIX_DEVICES)
    problems = [str(v) for v in errors_at_bind(suite, name, snapshot)]
    for key in (request_key, devices_key):
        if key not in snapshot.annotations:
            later = suite.watch.first_with(name, key)
            when = (
                f"; it appeared {later.seen - snapshot.seen:.2f} s after the binding"
                if later is not None
                else "; it never appeared"
            )
            problems.insert(0, f"{key} was missing when {name} was bound to {snapshot.node}{when}")
    suite.evidence.pod(name, problemsAtBind=problems)
    if problems:
        raise fail(f"{name}: " + " | ".join(problems))
    fractions, _ = read_placement(pod_at(snapshot))
    if container not in fractions:
        raise fail(f"{name}: at binding, the node agent would not fence container {container!r}")
    return fractions[container]


def gpus_at_bind(suite: Suite, name: str, snapshot: Snapshot, container: str = "main") -> list[str]:
    """The GPUs the scheduler gave ``container`` (one identity per physical GPU); a failure if none."""
    value = snapshot.annotations.get(nvidia_key(container, SUFFIX_DEVICES), "")
    if not value:
        raise fail(
            f"{name} was bound to {snapshot.node} with no {nvidia_key(container, SUFFIX_DEVICES)}: "
            "the GPU it runs "
            "on is unknown to the node agent, so it runs unfenced"
        )
    node = suite.cluster.read_node(snapshot.node)
    gpus = [resolve_device(d, node) for d in value.split(",") if d]
    suite.evidence.pod(name, gpus=gpus)
    return gpus


def limit_and_mode_present(snapshot: Snapshot, container: str = "main") -> list[str]:
    """The SHOULD keys missing at binding."""
    return [
        k
        for k in (nvidia_key(container, SUFFIX_LIMIT), nvidia_key(container, SUFFIX_MODE))
        if k not in snapshot.annotations
    ]

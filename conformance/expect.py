"""Judgements the checks share, named as what must hold.

Each helper reads what the cluster shows (a Pod at the moment of binding, the loads on a node's
GPUs), decides with the contract module (``enforcement.contract``: no second parser here) and
raises ``CheckFailed`` with a message that names the Pod, the key and the rule. Each also leaves
what it judged in the check's evidence.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, Final

from enforcement.contract import (
    SUFFIX_DEVICES,
    SUFFIX_LIMIT,
    SUFFIX_MODE,
    SUFFIX_REQUEST,
    Fraction,
    Violation,
    audit_pod,
    node_gpu_count,
    node_gpu_memory_mib,
    node_gpu_uuids,
    nvidia_key,
    read_placement,
    read_request,
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
    snapshot = suite.watch.binding_seen(name, snapshot)  # a relisted state proves nothing of the moment
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
            "the GPU it runs on is unknown to the node agent, so it runs unfenced [devices-missing]"
        )
    node = suite.cluster.read_node(snapshot.node)
    gpus = [resolve_device(d, node) for d in value.split(",") if d]
    suite.evidence.pod(name, gpus=gpus)
    return gpus


def limit_and_mode_present(suite: Suite, name: str, snapshot: Snapshot, container: str = "main") -> list[str]:
    """The SHOULD keys missing at binding (``WatchGap``, an error, when the watch did not see it)."""
    snapshot = suite.watch.binding_seen(name, snapshot)
    return [
        k
        for k in (nvidia_key(container, SUFFIX_LIMIT), nvidia_key(container, SUFFIX_MODE))
        if k not in snapshot.annotations
    ]


PORTION_RESERVE_MAX: Final = 0.05
"""How far below portion x GPU memory a converted request may lie: the usable memory a scheduler
converts against may hold back a reserve (for the driver and the CUDA context), up to this share."""


def portion_range(memory_mib: int, portion: float) -> tuple[int, int]:
    """The MiB a portion of a ``memory_mib`` GPU may become: within the documented reserve, never more."""
    return math.floor(memory_mib * (1 - PORTION_RESERVE_MAX) * portion), math.floor(memory_mib * portion)


def asked_request(asked: Mapping[str, str], container: str = "main") -> Any:
    """What the author asked for (``FractionRequest``), read by the contract module from the annotations
    the check wrote, as any scheduler reads them."""
    pod = {"metadata": {"annotations": dict(asked)}, "spec": {"containers": [{"name": container}]}}
    request, _ = read_request(pod)
    if request is None:
        raise RuntimeError(f"the suite wrote no request for container {container!r}: {dict(asked)}")
    return request


def values_must_be_as_asked(
    suite: Suite, name: str, snapshot: Snapshot, asked: Mapping[str, str], container: str = "main"
) -> Fraction:
    """At binding, what the scheduler wrote is what the author asked, converted: the request (the
    author's MiB, or the portion of the bound GPU's memory within the reserve), the limit (the
    author's, or the request when the author gave none: never smaller, never larger), the mode (the
    author's; time-slicing when none) and the devices (the count asked, distinct, on that node)."""
    placed = placement_must_be_complete(suite, name, snapshot, container)
    request = asked_request(asked, container)
    node = suite.cluster.read_node(snapshot.node) or {}
    memory = node_gpu_memory_mib(node) or suite.node.memory_mib
    problems: list[str] = []

    def expect_range(what: str, got: int, allowed: tuple[int, int], why: str) -> None:
        if not allowed[0] <= got <= allowed[1]:
            span = f"{allowed[0]} MiB" if allowed[0] == allowed[1] else f"{allowed[0]}..{allowed[1]} MiB"
            problems.append(f"{what} is {got} MiB, but {why}: {span}")

    if request.portion is not None:
        want_request = portion_range(memory, request.portion)
        expect_range("the request", placed.request_mib, want_request, f"{request.portion} of {memory} MiB")
    else:
        want_request = (request.request_mib, request.request_mib)
        expect_range("the request", placed.request_mib, want_request, "the author asked for")
    if request.limit_mib is not None:
        want_limit = (request.limit_mib, request.limit_mib)
        expect_range("the limit", placed.limit_mib, want_limit, "the author asked for")
    elif request.portion_limit is not None:
        want_limit = portion_range(memory, request.portion_limit)
        expect_range("the limit", placed.limit_mib, want_limit, f"{request.portion_limit} of {memory} MiB")
    else:
        want_limit = (placed.request_mib, placed.request_mib)
        expect_range("the limit", placed.limit_mib, want_limit, "the author gave none, so it is the request")
    if placed.mode != request.mode:
        asked_mode = request.mode if nvidia_key(container, SUFFIX_MODE) in asked else f"none ({request.mode})"
        problems.append(f"the mode is {placed.mode}, but the author asked for {asked_mode}")
    suite.evidence.pod(
        name,
        asked={
            "requestMiB": request.request_mib,
            "portion": request.portion,
            "limitMiB": request.limit_mib,
            "portionLimit": request.portion_limit,
            "mode": request.mode,
            "devices": request.num_devices,
        },
        written={
            "requestMiB": placed.request_mib,
            "limitMiB": placed.limit_mib,
            "mode": placed.mode,
            "devices": list(placed.devices),
        },
        gpuMiB=memory,
    )
    if problems:
        raise fail(f"{name} (bound to {snapshot.node}): " + "; ".join(problems))
    devices_must_be_on_the_node(suite, name, snapshot, request.num_devices, container)
    return placed


def devices_must_be_on_the_node(
    suite: Suite, name: str, snapshot: Snapshot, expected: int, container: str = "main"
) -> None:
    """The container got ``expected`` distinct GPUs, each one of the bound node's."""
    written = snapshot.annotations.get(nvidia_key(container, SUFFIX_DEVICES), "")
    gpus = gpus_at_bind(suite, name, snapshot, container)
    node = suite.cluster.read_node(snapshot.node) or {}
    count, uuids = node_gpu_count(node), node_gpu_uuids(node)
    problems = []
    if len(gpus) != expected or len(set(gpus)) != len(gpus):
        problems.append(
            f"got {len(gpus)} GPU(s) ({len(set(gpus))} distinct: {written}) but asked for {expected} "
            "[devices-count]"
        )
    for gpu in gpus:
        is_index = gpu.isdigit()
        if (is_index and count is not None and int(gpu) >= count) or (
            not is_index and uuids and gpu not in uuids
        ):
            problems.append(f"GPU {gpu} is not one of node {snapshot.node}'s {count} GPUs [devices-unknown]")
    if not uuids and any(not g.isdigit() for g in gpus):
        # A UUID can be matched only against the node's list, which it neither publishes nor gave
        # a discovery Pod: say so rather than pass it.
        suite.not_judged(
            f"{name}: devices by UUID exist on {snapshot.node}",
            "the node publishes no GPU UUIDs and no device-discovery Pod learned them",
        )
    suite.evidence.pod(name, devicesWritten=written, nodeGpus=list(uuids) or count)
    if problems:
        raise fail(f"{name}: " + "; ".join(problems))


def device_form(entry: str) -> str:
    """The form of one gpus.devices entry: ``cdi`` (a CDI device name, whatever its device part),
    ``index`` or ``uuid``. The contract module has already judged whether it is well formed."""
    if "=" in entry and "/" in entry.split("=", 1)[0]:
        return "cdi"
    return "index" if entry.isdigit() else "uuid"


def device_forms(values: Iterable[str]) -> set[str]:
    """Every form the entries of ``values`` (gpus.devices values) are written in."""
    return {device_form(e) for value in values for e in value.split(",") if e}


def devices_off_form(value: str, declared: str) -> list[str]:
    """The entries of ``value`` not in the ``declared`` form. ``uuid``: a GPU's UUID, bare or as the
    device part of a CDI name (KAI writes CDI names where the device plugin uses CDI, docs/contract.md
    §9.3); ``index``: an index; ``cdi``: a CDI device name."""
    off = []
    for entry in (e for e in value.split(",") if e):
        form = device_form(entry)
        inner = resolve_device(entry)
        if declared == "uuid":
            ok = form == "uuid" or (form == "cdi" and not inner.isdigit())
        elif declared == "index":
            ok = form == "index" or (form == "cdi" and inner.isdigit())
        else:
            ok = form == declared
        if not ok:
            off.append(entry)
    return off

"""Devices: which GPUs a fractional container gets is the scheduler's choice, and only the scheduler's.

``gpu-fraction-num-devices: N`` asks for N distinct GPUs of one node with the request on each;
every GPU named must exist on the node the Pod was bound to. A Pod that names its own GPUs in
``gpus.devices`` must not get them just for asking: it names a GPU no correct scheduler would
choose for it (one running the other mode, where it would fit by memory), and an admission that
refuses it must say that the devices key is why.

A scheduler may keep the author's value only where it could have chosen those GPUs itself (they fit
by memory and by mode): the GPU it then writes is one it might have picked, so the GPU alone cannot
tell "chosen" from "kept". The form can: Pods whose authors each name a different GPU that fits, in
a form this scheduler was not seen writing for its own choices in the same check (indices where it
wrote UUIDs or CDI names, UUIDs where it wrote indices). A value that comes back verbatim in that
form was kept, not written; the evidence lists, per Pod, the GPU its author named, the value the
scheduler wrote and whether it is that GPU.
"""

from __future__ import annotations

import json

import pytest
from kubernetes.client.rest import ApiException

from conformance.expect import (
    device_forms,
    devices_must_be_on_the_node,
    devices_off_form,
    gpus_at_bind,
    placement_must_be_complete,
)
from enforcement.contract import SM_SHARING, SUFFIX_DEVICES, TIME_SLICING, node_gpu_uuids, nvidia_key
from fixtures.suite.admission import REFUSED_STATUSES
from fixtures.suite.checks import Needs, check
from fixtures.suite.frame import Suite, fail


@check(
    id="multi-device",
    level="MUST",
    statement="A Pod with gpu-fraction-num-devices: N MUST get N distinct GPUs of the node it is "
    "bound to, with "
    "the request on each, and every GPU it names MUST exist on that node.",
    profiles=("scheduler",),
    features=("multi-device",),
    seed="003/4",
    needs=Needs(nodes=1, gpus=2, idle=True),
)
def test_multi_device(suite: Suite) -> None:
    pairs = suite.scheduled_pod("pair", suite.request(share=0.2, num_devices=2))
    single = suite.scheduled_pod("single", suite.request(share=0.2, num_devices=1))
    for name, expected in ((pairs, 2), (single, 1)):
        snap = suite.must_be_bound(
            name, f"it asks for 0.2 of {expected} GPU(s) on a node with {suite.node.gpu_count} idle"
        )
        devices_must_be_on_the_node(suite, name, snap, expected)
        placement_must_be_complete(suite, name, snap)


@check(
    id="devices-scheduler-owned",
    level="MUST",
    statement="A Pod that writes its own gpus.devices MUST NOT get those GPUs unless the "
    "scheduler chose them: "
    "the scheduler overwrites the value (or admission refuses the Pod, naming the key).",
    profiles=("scheduler",),
    seed="003/4",
    needs=Needs(nodes=1, gpus=2, idle=True),
)
def test_devices_scheduler_owned(suite: Suite) -> None:
    # The Pod names a GPU that no correct scheduler would choose for it, whatever its packing policy,
    # yet one where its request fits by memory: a GPU running sm-sharing, for a time-slicing Pod.
    # So a scheduler that keeps the author's devices only when they fit is caught too.
    modes = suite.options.claims("sm-sharing")
    if modes:
        holder = suite.scheduled_pod("holder", suite.request(share=0.2, mode=SM_SHARING))
        why = f"{holder} runs sm-sharing on it and the Pod asks for time-slicing"
        asked = suite.request(share=0.3, mode=TIME_SLICING)
    else:
        holder = suite.scheduled_pod("holder", suite.request(share=0.8))
        why = f"{holder} already holds 0.8 of it"
        asked = suite.request(share=0.5)
        suite.not_judged(
            "author devices on a GPU where the request would fit",
            "without sm-sharing the only GPU no correct scheduler chooses is one too full for the Pod",
        )
    taken = gpus_at_bind(suite, holder, suite.must_be_bound(holder, "it asks for a share of an idle GPU"))
    written = suite.watch.first_bound(holder)
    if written is None:
        raise RuntimeError(f"{holder} was judged bound but the watch never saw it bound")
    self_assigned = written.annotations[nvidia_key("main", SUFFIX_DEVICES)]
    key = nvidia_key("main", SUFFIX_DEVICES)
    name = _submit(suite, "self-assigned", {**asked, key: self_assigned})
    if name is None:
        return
    snap = suite.must_be_bound(name, f"{suite.node.gpu_count - 1} GPU(s) of the node are idle")
    gpus = gpus_at_bind(suite, name, snap)
    suite.evidence.fact("selfAssigned", {"written": self_assigned, "got": gpus, "notChosenBecause": taken})
    if set(gpus) & set(taken):
        raise fail(
            f"{name} named GPU {self_assigned} itself and got it, though no correct scheduler chooses it "
            f"({why}): the scheduler kept a device assignment it did not make [devices-set-by-author]"
        )
    own = {self_assigned, snap.annotations.get(key, "")}
    _named_where_they_fit(suite, own, set(taken) if modes else set())


NAMED_SHARE = 0.1
"""What each Pod naming a GPU that fits asks for (time-slicing): room on every GPU not sm-sharing."""


def _named_where_they_fit(suite: Suite, own: set[str], sm_gpus: set[str]) -> None:
    """Pods whose authors each name another GPU where they fit by memory and by mode, in a form the
    scheduler did not write for its own choices: one that comes back verbatim was kept."""
    key = nvidia_key("main", SUFFIX_DEVICES)
    written_forms = device_forms(v for v in own if v)
    node = suite.cluster.read_node(suite.node.name) or {}
    order = list(node_gpu_uuids(node))
    if "index" not in written_forms:
        form, names = "index", [str(i) for i in range(suite.node.gpu_count)]
    elif order and "uuid" not in written_forms:
        form, names = "uuid", list(order)
    else:
        suite.not_judged(
            "an author's devices where they fit by memory and by mode",
            f"the scheduler writes {', '.join(sorted(written_forms))}, and no other form of the node's GPUs "
            "is known to name them in (its UUIDs are not published)",
        )
        return
    # The GPUs a time-slicing Pod fits on (not the sm-sharing holder's), each named by one Pod, last
    # index first (an order a scheduler that spreads by index would not follow by itself).
    identity = {n: (order[int(n)] if n.isdigit() and int(n) < len(order) else n) for n in names}
    named = [n for n in reversed(names) if identity[n] not in sm_gpus]
    asked = suite.request(share=NAMED_SHARE, mode=TIME_SLICING)
    pods: dict[str, str] = {}
    for i, value in enumerate(named):
        made = _submit(suite, f"named-{i}", {**asked, key: value})
        if made is None:
            return
        pods[made] = value
    seen: dict[str, dict[str, object]] = {}
    kept: list[str] = []
    for made, value in pods.items():
        snap = suite.must_be_bound(made, f"the GPU its author named has room for {NAMED_SHARE} of it")
        got = snap.annotations.get(key, "")
        gpus = gpus_at_bind(suite, made, snap)
        same = gpus == [identity[value]]
        seen[made] = {"authorNamed": value, "schedulerWrote": got, "gpus": gpus, "theGpuNamed": same}
        if got == value:
            kept.append(f"{made} ({value})")
    suite.evidence.fact(
        "namedWhereTheyFit",
        {"authorsForm": form, "schedulerWritesForOwnChoices": sorted(written_forms), "pods": seen},
    )
    if not kept and len(pods) > 1 and all(v["theGpuNamed"] for v in seen.values()):
        # Each got the GPU its author named, each in the scheduler's own form: a scheduler that keeps
        # the author's GPUs but writes them its own way would look so, and so might one choosing alone.
        suite.not_judged(
            "whether the author's GPUs were kept and rewritten in the scheduler's own form",
            f"each of the {len(pods)} Pods got the GPU its author named ({', '.join(pods.values())}), "
            "which a scheduler choosing alone may also do; only a value kept verbatim is a finding",
        )
    if kept:
        raise fail(
            f"{', '.join(kept)}: each named a GPU itself, in the {form} form, and was bound with that very "
            f"value, though the scheduler writes its own choices as {', '.join(sorted(written_forms))} "
            "(the holder's and the self-assigned Pod's devices): it kept a device assignment it did not "
            "make [devices-set-by-author]"
        )


def _submit(suite: Suite, name: str, annotations: dict[str, str]) -> str | None:
    """The Pod created, or None when an admission refused it naming the devices key (the rule kept);
    any other refusal is not judged (raised)."""
    key = nvidia_key("main", SUFFIX_DEVICES)
    try:
        return suite.scheduled_pod(name, annotations)
    except ApiException as exc:
        message = _refusal(exc)
        # Only a refusal that names the key is admission keeping the rule; any other is not judged.
        if exc.status in REFUSED_STATUSES and (key in message or SUFFIX_DEVICES in message):
            suite.evidence.fact("admission", f"refused {name}: {exc.status} {message}")
            return None
        raise


@check(
    id="devices-form",
    level="MUST",
    statement="Where the scheduler's implementation description declares the form it writes "
    "gpus.devices in (devicesForm: uuid, index or cdi), every gpus.devices it writes MUST be in that "
    "form (uuid: a GPU UUID, bare or as a CDI name's device); judged only where a form is declared.",
    profiles=("scheduler",),
    seed="000/4",
    needs=Needs(nodes=1, gpus=2, idle=True),
)
def test_devices_form(suite: Suite) -> None:
    # A mechanism (docs/contract.md §9): the node reads the value verbatim (the released operator
    # passes it to NVIDIA_VISIBLE_DEVICES), so the form matters where it is declared; a scheduler
    # that declares none is judged by the contract alone (annotations-at-bind: any valid form).
    part = suite.options.scheduler_part()
    declared = part.devices_form
    suite.evidence.fact("declared", {"implementation": part.implementation, "devicesForm": declared})
    if declared == "any":
        pytest.skip(
            f"not judged: the scheduler's implementation ({part.implementation}) declares no form for "
            "gpus.devices (devicesForm: any); any form the contract allows is valid for it"
        )
    asks = {"single": suite.request(share=0.2)}
    if suite.options.claims("multi-device"):
        asks["pair"] = suite.request(share=0.2, num_devices=2)
    else:
        suite.not_judged("the form on a multi-device Pod", "the implementation does not claim multi-device")
    key = nvidia_key("main", SUFFIX_DEVICES)
    names = {what: suite.scheduled_pod(what, asked) for what, asked in asks.items()}
    problems = []
    for name in names.values():
        snap = suite.must_be_bound(name, f"the node has {suite.node.gpu_count} idle GPUs for 2 small Pods")
        value = snap.annotations.get(key, "")
        if not value:
            suite.not_judged(f"{name}'s devices form", f"{key} was missing at binding (annotations-at-bind)")
            continue
        off = devices_off_form(value, declared)
        suite.evidence.pod(name, devicesWritten=value, forms=sorted(device_forms([value])), offForm=off)
        if off:
            problems.append(f"{name} got {key}={value!r}: {', '.join(off)} not {declared}")
    if problems:
        raise fail(
            "; ".join(problems) + f", but {part.implementation} declares devicesForm: {declared} "
            "(the node passes the value on verbatim) [declared-devices-form]"
        )


def _refusal(exc: ApiException) -> str:
    """The admission's message in a refusal (its Status), else the reason."""
    try:
        status = json.loads(exc.body or "{}")
    except ValueError:
        return str(exc.reason or "")
    return (
        str(status.get("message") or exc.reason or "") if isinstance(status, dict) else str(exc.reason or "")
    )

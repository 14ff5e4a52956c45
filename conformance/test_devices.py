"""Devices: which GPUs a fractional container gets is the scheduler's choice, and only the scheduler's.

``gpu-fraction-num-devices: N`` asks for N distinct GPUs of one node with the request on each;
every GPU named must exist on the node the Pod was bound to. A Pod that names its own GPUs in
``gpus.devices`` must not get them just for asking: it names a GPU no correct scheduler would
choose for it (one running the other mode, where it would fit by memory), and an admission that
refuses it must say that the devices key is why.
"""

from __future__ import annotations

import json

from kubernetes.client.rest import ApiException

from conformance.expect import devices_must_be_on_the_node, gpus_at_bind, placement_must_be_complete
from enforcement.contract import SM_SHARING, SUFFIX_DEVICES, TIME_SLICING, nvidia_key
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
    try:
        name = suite.scheduled_pod("self-assigned", {**asked, key: self_assigned})
    except ApiException as exc:
        message = _refusal(exc)
        # Only a refusal that names the key is admission keeping the rule; any other is not judged.
        if exc.status in REFUSED_STATUSES and (key in message or SUFFIX_DEVICES in message):
            suite.evidence.fact("admission", f"refused the Pod: {exc.status} {message}")
            return
        raise
    snap = suite.must_be_bound(name, f"{suite.node.gpu_count - 1} GPU(s) of the node are idle")
    gpus = gpus_at_bind(suite, name, snap)
    suite.evidence.fact("selfAssigned", {"written": self_assigned, "got": gpus, "notChosenBecause": taken})
    if set(gpus) & set(taken):
        raise fail(
            f"{name} named GPU {self_assigned} itself and got it, though no correct scheduler chooses it "
            f"({why}): the scheduler kept a device assignment it did not make [devices-set-by-author]"
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

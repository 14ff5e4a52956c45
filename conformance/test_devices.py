"""Devices: which GPUs a fractional container gets is the scheduler's choice, and only the scheduler's.

``gpu-fraction-num-devices: N`` asks for N distinct GPUs of one node with the request on each;
every GPU named must exist on the node the Pod was bound to. A Pod that names its own GPUs in
``gpus.devices`` must not get them just for asking.
"""

from __future__ import annotations

from kubernetes.client.rest import ApiException

from conformance.expect import devices_must_be_on_the_node, gpus_at_bind, placement_must_be_complete
from enforcement.contract import SUFFIX_DEVICES, nvidia_key
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
    "the scheduler overwrites the value (or admission refuses the Pod).",
    profiles=("scheduler",),
    seed="003/4",
    needs=Needs(nodes=1, gpus=2, idle=True),
)
def test_devices_scheduler_owned(suite: Suite) -> None:
    # The GPU the Pod names for itself is nearly full, so no correct scheduler would choose it for 0.5.
    filler = suite.scheduled_pod("filler", suite.request(share=0.8))
    taken = gpus_at_bind(suite, filler, suite.must_be_bound(filler, "it asks for 0.8 of an idle GPU"))
    written = suite.watch.first_bound(filler)
    assert written is not None
    self_assigned = written.annotations[nvidia_key("main", SUFFIX_DEVICES)]
    request = {**suite.request(share=0.5), nvidia_key("main", SUFFIX_DEVICES): self_assigned}
    try:
        name = suite.scheduled_pod("self-assigned", request)
    except ApiException as exc:
        if exc.status in (400, 403, 422):
            suite.evidence.fact("admission", f"refused the Pod: {exc.status} {exc.reason}")
            return
        raise
    snap = suite.must_be_bound(
        name, f"it asks for 0.5 of a GPU and {suite.node.gpu_count - 1} GPU(s) are idle"
    )
    gpus = gpus_at_bind(suite, name, snap)
    suite.evidence.fact("selfAssigned", {"written": self_assigned, "got": gpus, "nearlyFull": taken})
    if set(gpus) & set(taken):
        raise fail(
            f"{name} named GPU {self_assigned} itself and got it, though {filler} already holds 0.8 of it: "
            "the scheduler kept a device assignment it did not make [devices-set-by-author]"
        )

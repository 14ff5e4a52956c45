"""Each seeded fault really happens on the real API server: the wrong annotation, the wrong GPU.

The mutation run trusts that ``--fault NAME`` breaks its rule; these tests are that trust's
evidence. One scheduler per fault runs for the module (started together, so the module pays
one start-up), each with its own name; every test sends its Pods to one of them and judges the
bound Pod with the contract module, as the suite will. ``leak-completed`` is the exception: its
ledger would keep every Pod the other tests delete, so its test starts a fresh one.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import watch
from scheduler_helpers import (
    PLACE_TIMEOUT_S,
    Pods,
    SchedulerProcess,
    bound_fraction_pods,
    node_condition,
    nv,
    pods_on_empty_gpus,
    running_schedulers,
    unique,
    uuids_by_node,
)

from enforcement.contract import audit_gpus, audit_pod
from fixtures.sandbox.controlplane import Sandbox
from fixtures.sandbox.scheduler.faults import FAULTS
from fixtures.sandbox.scheduler.loop import LATE_PLACEMENT_S
from fixtures.suite.waiting import wait_until

pytestmark = pytest.mark.sandbox

RUN = unique("it-fault")
OWN_SCHEDULER = ("leak-completed",)
"""Faults whose test starts its own scheduler rather than share the module's."""
EXTRA_ARGS = {"place-on-retry": ("--retry-seconds", "0.5")}
"""Settings a fault's scheduler runs with besides its fault (the sandbox's retry period, for the fault
whose test times a retry)."""


def selected_faults(session: pytest.Session) -> list[str]:
    """The faults whose tests this run selected: each test is named after its fault (or carries it
    in its parameters), so a run narrowed with ``-k`` starts only the schedulers it uses. Thirty
    schedulers starting at once take over a minute on a small machine."""
    here = Path(__file__).name
    names = [item.name for item in session.items if item.nodeid.split("::")[0].endswith(here)]
    return [
        f for f in FAULTS if f not in OWN_SCHEDULER and any(f in n or f.replace("-", "_") in n for n in names)
    ]


@pytest.fixture(scope="module")
def schedulers(
    sandbox: Sandbox, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[dict[str, SchedulerProcess]]:
    specs = {
        f"{RUN}-{fault}": ("--fault", fault, *EXTRA_ARGS.get(fault, ()))
        for fault in selected_faults(request.session)
    }
    with running_schedulers(sandbox, tmp_path_factory.mktemp("faults"), specs) as procs:
        yield {name.removeprefix(f"{RUN}-"): proc for name, proc in procs.items()}


@pytest.fixture
def cluster(sandbox: Sandbox, namespace: str, schedulers: dict[str, SchedulerProcess]) -> Iterator[Pods]:
    with pods_on_empty_gpus(sandbox.core_v1(), namespace, "unset") as made:
        yield made


@pytest.fixture(scope="module")
def gpu(sandbox: Sandbox) -> dict[str, list[str]]:
    return uuids_by_node(sandbox.core_v1())


def under(cluster: Pods, fault: str) -> Pods:
    cluster.scheduler = f"{RUN}-{fault}"
    return cluster


def node_of(sandbox: Sandbox, name: str) -> dict[str, Any]:
    return json.loads(sandbox.core_v1().read_node(name, _preload_content=False).data)


def rules(sandbox: Sandbox, pod: dict[str, Any]) -> list[str]:
    return [v.rule for v in audit_pod(pod, node_of(sandbox, pod["spec"]["nodeName"]))]


def gpu_rules(sandbox: Sandbox, pods: list[dict[str, Any]]) -> list[str]:
    nodes = [node_of(sandbox, n) for n in ("gpu-a-0", "gpu-a-1")]
    return [v.rule for v in audit_gpus(pods, nodes)]


def devices(pod: dict[str, Any]) -> str:
    return pod["metadata"]["annotations"][nv("main", "gpus.devices")]


def test_overcommit(cluster: Pods, sandbox: Sandbox) -> None:
    pods = under(cluster, "overcommit")
    pods.create("a", {"gpu-memory": "100000"})
    a = pods.bound("a")
    pods.create("b", {"gpu-memory": "100000"})
    b = pods.bound("b")
    assert (b["spec"]["nodeName"], devices(b)) == (a["spec"]["nodeName"], devices(a))
    assert gpu_rules(sandbox, [a, b]) == ["gpu-overcommit"]


def test_mix_modes(cluster: Pods, sandbox: Sandbox) -> None:
    pods = under(cluster, "mix-modes")
    pods.create("ts", {"gpu-memory": "1000"})
    ts = pods.bound("ts")
    pods.create("sm", {"gpu-memory": "1000", nv("main", "gpu-compute.mode"): "sm-sharing"})
    sm = pods.bound("sm")
    assert devices(sm) == devices(ts)
    assert gpu_rules(sandbox, [ts, sm]) == ["mode-mixing"]


@pytest.mark.parametrize(
    ("fault", "missing", "found"),
    [
        ("omit-limit", "gpu-memory.limit", ["limit-missing"]),
        ("omit-devices", "gpus.devices", ["devices-missing"]),
        ("omit-request", "gpu-memory.request", []),  # a limit alone stands for the request
    ],
)
def test_omitted_annotation(
    cluster: Pods, sandbox: Sandbox, fault: str, missing: str, found: list[str]
) -> None:
    pods = under(cluster, fault)
    pods.create("p", {"gpu-memory": "4096", "gpu-memory.limit": "8Gi"})
    pod = pods.bound("p")
    written = pod["metadata"]["annotations"]
    assert nv("main", missing) not in written
    others = {"gpu-memory.request", "gpu-memory.limit", "gpu-compute.mode", "gpus.devices"} - {missing}
    assert all(nv("main", s) in written for s in others)
    assert rules(sandbox, pod) == found


@pytest.mark.parametrize(("asked", "got"), [(1, 2), (3, 2)])
def test_wrong_device_count(cluster: Pods, sandbox: Sandbox, asked: int, got: int) -> None:
    pods = under(cluster, "wrong-device-count")
    pods.create("p", {"gpu-memory": "1000", "gpu-fraction-num-devices": str(asked)})
    pod = pods.bound("p")
    assert len(devices(pod).split(",")) == got
    assert rules(sandbox, pod) == ["devices-count"]


def test_request_gt_limit(cluster: Pods, sandbox: Sandbox) -> None:
    pods = under(cluster, "request-gt-limit")
    pods.create("p", {"gpu-memory": "4096"})
    pod = pods.bound("p")
    written = pod["metadata"]["annotations"]
    assert (written[nv("main", "gpu-memory.request")], written[nv("main", "gpu-memory.limit")]) == (
        "4096Mi",
        "2048Mi",
    )
    assert "request-exceeds-limit" in rules(sandbox, pod)


def test_wrong_container_name(cluster: Pods, sandbox: Sandbox) -> None:
    pods = under(cluster, "wrong-container-name")
    pods.create("p", {"gpu-fraction": "0.25"})
    pod = pods.bound("p")
    written = pod["metadata"]["annotations"]
    assert not any(k.startswith("nvidia.com/container.main.") for k in written)
    assert written[nv("main-x", "gpu-memory.request")] == "35942Mi"
    assert "unknown-container" in rules(sandbox, pod)


def test_trust_pod_devices(cluster: Pods, gpu: dict[str, list[str]]) -> None:
    pods = under(cluster, "trust-pod-devices")
    own = gpu["gpu-a-1"][3]
    pods.create("p", {"gpu-memory": "1000", nv("main", "gpus.devices"): own})
    pod = pods.bound("p")
    assert (pod["spec"]["nodeName"], devices(pod)) == ("gpu-a-1", own)
    assert pods.events("p", "UntrustedDevices") == []


def test_trust_fitting_pod_devices(cluster: Pods, sandbox: Sandbox) -> None:
    pods = under(cluster, "trust-fitting-pod-devices")
    pods.create("sm", {"gpu-memory": "1000", **SM})
    sm = pods.bound("sm")
    pods.create("big", {"gpu-memory": "143000"})
    big = pods.bound("big")
    pods.create("q", {"gpu-memory": "1000", nv("main", "gpus.devices"): devices(big)})  # no room there
    assert devices(pods.bound("q")) != devices(big)  # not kept, and said so
    assert pods.event("q", "UntrustedDevices")
    pods.create("p", {"gpu-memory": "1000", nv("main", "gpus.devices"): devices(sm)})  # room, the other mode
    p = pods.bound("p")
    assert (p["spec"]["nodeName"], devices(p)) == (sm["spec"]["nodeName"], devices(sm))
    assert pods.events("p", "UntrustedDevices") == []
    assert gpu_rules(sandbox, [sm, p]) == ["mode-mixing"]


def test_ignore_node_ready(cluster: Pods, sandbox: Sandbox) -> None:
    pods = under(cluster, "ignore-node-ready")
    with node_condition(sandbox.core_v1(), "gpu-a-1", "gpu-fractioning.nvidia.com/Ready", "False"):
        # Pinned to the not-ready node: the Pod is bound there while its condition is False, whenever
        # the scheduler's watch delivers the change. Unpinned, the fault's preference for not-ready
        # nodes raced that delivery: a scheduler still seeing True bound it to gpu-a-0 by name (CI,
        # with 34 fault schedulers watching the same Nodes).
        pods.create(
            "p", {"gpu-fraction": "0.5"}, spec={"nodeSelector": {"kubernetes.io/hostname": "gpu-a-1"}}
        )
        assert pods.bound("p")["spec"]["nodeName"] == "gpu-a-1"


def test_devices_not_on_node(cluster: Pods, sandbox: Sandbox, gpu: dict[str, list[str]]) -> None:
    pods = under(cluster, "devices-not-on-node")
    pods.create("p", {"gpu-memory": "1000"})
    pod = pods.bound("p")
    assert pod["spec"]["nodeName"] == "gpu-a-0"
    assert devices(pod) == gpu["gpu-a-1"][0]
    assert rules(sandbox, pod) == ["devices-unknown"]


def retries(scheduler: SchedulerProcess, count: int = 2) -> None:
    """Wait until the scheduler has tried its waiting Pods ``count`` more times."""
    before = len(scheduler.lines("retry:"))
    wait_until(
        lambda: len(scheduler.lines("retry:")) >= before + count,
        f"{count} more retries by {scheduler.name}",
        timeout=PLACE_TIMEOUT_S,
    )


def test_annotate_after_bind(cluster: Pods, sandbox: Sandbox) -> None:
    pods = under(cluster, "annotate-after-bind")
    core = sandbox.core_v1()
    since = json.loads(core.list_namespaced_pod(pods.namespace, _preload_content=False).data)["metadata"][
        "resourceVersion"
    ]
    pods.create("p", {"gpu-memory": "1000"})
    versions: list[dict[str, Any]] = []  # every version of the Pod the API server served, in order
    stream = watch.Watch()
    for event in stream.stream(
        core.list_namespaced_pod,
        pods.namespace,
        field_selector="metadata.name=p",
        resource_version=since,
        timeout_seconds=30,
    ):
        versions.append(event["raw_object"])
        if nv("main", "gpus.devices") in (versions[-1]["metadata"].get("annotations") or {}):
            stream.stop()
    bound = [v for v in versions if v["spec"].get("nodeName")]
    assert bound, "the Pod was never bound"
    first = bound[0]["metadata"].get("annotations") or {}
    assert not [k for k in first if k.startswith("nvidia.com/")], "bound with its annotations already there"
    last = bound[-1]
    written = last["metadata"]["annotations"]
    assert (written[nv("main", "gpu-memory.request")], written[nv("main", "gpu-memory.limit")]) == (
        "1000Mi",
        "1000Mi",
    )
    assert rules(sandbox, last) == []  # the annotations themselves are right, only late


def test_leak_completed(sandbox: Sandbox, namespace: str, tmp_path: Path) -> None:
    core = sandbox.core_v1()
    name = f"{RUN}-leak-completed"
    with (
        running_schedulers(sandbox, tmp_path, {name: ("--fault", "leak-completed")}) as procs,
        pods_on_empty_gpus(core, namespace, name) as pods,
    ):
        scheduler = procs[name]
        for n in ("fill-0", "fill-1"):  # 100000 MiB on each of the eight GPUs
            pods.create(n, {"gpu-memory": "100000", "gpu-fraction-num-devices": "4"})
            pods.bound(n)
        pods.create("waits", {"gpu-memory": "100000"})
        pods.unschedulable("waits", "no GPU with 100000 MiB free")
        pods.finish("fill-1")  # Succeeded: a known-good scheduler places "waits" on gpu-a-1 now
        retries(scheduler)
        pods.delete("fill-0")  # deleted: and on gpu-a-0
        retries(scheduler)
        assert bound_fraction_pods(core) == {}, "every GPU is empty in truth"
        message = pods.unschedulable("waits", "no GPU with 100000 MiB free")
        assert "the largest free is 43771 MiB" in message
        # the rest of its duties stand: what fits beside the phantom guarantees is still placed
        pods.create("small", {"gpu-memory": "1000"})
        assert pods.bound("small")["spec"]["nodeName"] == "gpu-a-0"


def test_silent_unschedulable(cluster: Pods, schedulers: dict[str, SchedulerProcess]) -> None:
    pods = under(cluster, "silent-unschedulable")
    scheduler = schedulers["silent-unschedulable"]
    pods.create("p", {"gpu-memory": "200000"})  # more than any GPU has
    line = f"unschedulable {pods.namespace}/p: no GPU with 200000 MiB free"
    wait_until(lambda: scheduler.lines(line), f"the scheduler to decide {line!r}", timeout=PLACE_TIMEOUT_S)
    retries(scheduler)
    pod = pods.read("p")
    assert not pod["spec"].get("nodeName")
    assert [c for c in pod["status"].get("conditions") or () if c["type"] == "PodScheduled"] == []
    assert pods.events("p", "FailedScheduling") == []


def test_portion_of_wrong_size(cluster: Pods, sandbox: Sandbox) -> None:
    pods = under(cluster, "portion-of-wrong-size")
    pods.create("p", {"gpu-fraction": "0.5", "gpu-fraction.limit": "0.75"})
    pod = pods.bound("p")
    node = node_of(sandbox, pod["spec"]["nodeName"])
    assert node["metadata"]["labels"]["nvidia.com/gpu.memory"] == "143771"  # 0.5 of it: 71885 MiB
    written = pod["metadata"]["annotations"]
    assert (written[nv("main", "gpu-memory.request")], written[nv("main", "gpu-memory.limit")]) == (
        "40960Mi",  # 0.5 of 81920
        "61440Mi",  # 0.75 of 81920
    )
    assert written[nv("main", "gpu-compute.portion")] == "0.5"
    assert rules(sandbox, pod) == []  # well-formed: only the size is wrong


def test_inflate_request(cluster: Pods, sandbox: Sandbox) -> None:
    pods = under(cluster, "inflate-request")
    pods.create("p", {"gpu-memory": "4096", "gpu-memory.limit": "8Gi"})
    written = pods.bound("p")["metadata"]["annotations"]
    assert (written[nv("main", "gpu-memory.request")], written[nv("main", "gpu-memory.limit")]) == (
        "4506Mi",  # 10 % more than the 4096 MiB asked
        "9012Mi",
    )


def test_limit_to_gpu(cluster: Pods) -> None:
    pods = under(cluster, "limit-to-gpu")
    pods.create("p", {"gpu-memory": "1000"})  # no limit asked: it must be the request
    assert pods.bound("p")["metadata"]["annotations"][nv("main", "gpu-memory.limit")] == "143771Mi"


def test_default_sm_sharing(cluster: Pods) -> None:
    pods = under(cluster, "default-sm-sharing")
    pods.create("p", {"gpu-memory": "1000"})  # no mode asked: time-slicing
    assert pods.bound("p")["metadata"]["annotations"][nv("main", "gpu-compute.mode")] == "sm-sharing"


def test_overcommit_slightly(cluster: Pods, sandbox: Sandbox) -> None:
    pods = under(cluster, "overcommit-slightly")
    pods.create("a", {"gpu-memory": "142000"})
    a = pods.bound("a")
    pods.create("b", {"gpu-memory": "2000"})  # 229 MiB (0.16 %) past the GPU's 143771 MiB
    b = pods.bound("b")
    assert (b["spec"]["nodeName"], devices(b)) == (a["spec"]["nodeName"], devices(a))
    assert gpu_rules(sandbox, [a, b]) == ["gpu-overcommit"]


def test_leak_failed(cluster: Pods, schedulers: dict[str, SchedulerProcess]) -> None:
    pods = under(cluster, "leak-failed")
    scheduler = schedulers["leak-failed"]
    for n in ("fill-0", "fill-1"):  # 100000 MiB on each of the eight GPUs
        pods.create(n, {"gpu-memory": "100000", "gpu-fraction-num-devices": "4"})
        pods.bound(n)
    pods.create("waits", {"gpu-memory": "100000"})
    pods.unschedulable("waits", "no GPU with 100000 MiB free")
    pods.finish("fill-1", "Failed")  # a known-good scheduler places "waits" on that node now
    retries(scheduler)
    assert not pods.read("waits")["spec"].get("nodeName"), "placed: the Failed Pod's memory was released"
    pods.finish("fill-0")  # Succeeded: released, so "waits" goes there
    assert pods.bound("waits")["spec"]["nodeName"] == pods.read("fill-0")["spec"]["nodeName"]


def test_vague_unschedulable(cluster: Pods) -> None:
    pods = under(cluster, "vague-unschedulable")
    pods.create("p", {"gpu-memory": "200000"})  # more than any GPU has
    message = pods.unschedulable("p", "no GPU can take this Pod right now")
    assert "MiB" not in message and "memory" not in message


SM = {nv("main", "gpu-compute.mode"): "sm-sharing"}
TS = {nv("main", "gpu-compute.mode"): "time-slicing"}


def test_mode_check_sm_only(cluster: Pods, sandbox: Sandbox) -> None:
    pods = under(cluster, "mode-check-sm-only")
    pods.create("ts0", {"gpu-memory": "500", **TS})
    ts0 = pods.bound("ts0")
    pods.create("sm", {"gpu-memory": "2000", **SM})
    sm = pods.bound("sm")
    assert devices(sm) != devices(ts0)  # sm-sharing is still kept off a time-slicing GPU
    pods.create("ts", {"gpu-memory": "1000", **TS})
    ts = pods.bound("ts")
    assert devices(ts) == devices(sm)  # but time-slicing joins the fuller sm-sharing GPU
    assert gpu_rules(sandbox, [ts0, sm, ts]) == ["mode-mixing"]


def test_absent_mode_fits_any(cluster: Pods, sandbox: Sandbox) -> None:
    pods = under(cluster, "absent-mode-fits-any")
    pods.create("sm", {"gpu-memory": "2000", **SM})
    sm = pods.bound("sm")
    pods.create("plain", {"gpu-memory": "1000"})  # no mode: time-slicing
    plain = pods.bound("plain")
    assert devices(plain) == devices(sm)
    assert plain["metadata"]["annotations"][nv("main", "gpu-compute.mode")] == "time-slicing"
    assert gpu_rules(sandbox, [sm, plain]) == ["mode-mixing"]
    pods.create("ts", {"gpu-memory": "1000", **TS})  # time-slicing asked for: kept apart
    assert devices(pods.bound("ts")) != devices(sm)


def test_mode_check_first_device(cluster: Pods, sandbox: Sandbox) -> None:
    pods = under(cluster, "mode-check-first-device")
    pods.create("sm", {"gpu-memory": "2000", "gpu-fraction-num-devices": "3", **SM})
    sm = pods.bound("sm")
    pods.create("pair", {"gpu-memory": "1000", "gpu-fraction-num-devices": "2", **TS})
    pair = pods.bound("pair")  # a correct scheduler takes the other node's empty GPUs
    assert pair["spec"]["nodeName"] == sm["spec"]["nodeName"]
    first, second = devices(pair).split(",")
    assert first not in devices(sm).split(",") and second in devices(sm).split(",")
    assert gpu_rules(sandbox, [sm, pair]) == ["mode-mixing"]
    pods.create("one", {"gpu-memory": "1000", **TS})  # one device: its mode is checked
    assert devices(pods.bound("one")) not in devices(sm).split(",")


def test_charge_first_device_only(cluster: Pods, sandbox: Sandbox) -> None:
    pods = under(cluster, "charge-first-device-only")
    pods.create("four", {"gpu-memory": "140000", "gpu-fraction-num-devices": "4"})
    four = pods.bound("four")
    pods.create("p", {"gpu-memory": "10000"})  # fits only on the other node's empty GPUs
    p = pods.bound("p")
    assert p["spec"]["nodeName"] == four["spec"]["nodeName"]
    assert devices(p) in devices(four).split(",")[1:]  # one of the GPUs charged nothing
    assert gpu_rules(sandbox, [four, p]) == ["gpu-overcommit"]


def test_ignore_foreign_pods(cluster: Pods, sandbox: Sandbox, gpu: dict[str, list[str]]) -> None:
    pods = under(cluster, "ignore-foreign-pods")
    first = gpu["gpu-a-0"][0]
    # bound directly, as another scheduler would have left it: 143000 of the GPU's 143771 MiB
    placed = {nv("main", "gpu-memory.request"): "143000Mi", nv("main", "gpus.devices"): first}
    pods.create("other", placed, scheduler="default-scheduler", spec={"nodeName": "gpu-a-0"})
    other = pods.read("other")
    pods.create("p", {"gpu-memory": "1000"})
    p = pods.bound("p")
    assert (p["spec"]["nodeName"], devices(p)) == ("gpu-a-0", first)
    assert gpu_rules(sandbox, [other, p]) == ["gpu-overcommit"]


def test_own_namespace_only(cluster: Pods, sandbox: Sandbox) -> None:
    pods = under(cluster, "own-namespace-only")
    core = sandbox.core_v1()
    elsewhere = f"{pods.namespace}-o"
    core.create_namespace({"metadata": {"name": elsewhere}})
    others = Pods(core, elsewhere, pods.scheduler)
    try:
        others.create("other", {"gpu-memory": "143000"})  # another namespace: 143000 of 143771 MiB
        other = others.bound("other")
        pods.create("p", {"gpu-memory": "1000"})
        p = pods.bound("p")
        assert (p["spec"]["nodeName"], devices(p)) == (other["spec"]["nodeName"], devices(other))
        assert gpu_rules(sandbox, [other, p]) == ["gpu-overcommit"]
    finally:
        others.delete_all()
        core.delete_namespace(elsewhere)


def test_place_on_retry(cluster: Pods, sandbox: Sandbox) -> None:
    pods = under(cluster, "place-on-retry")
    for n in ("fill-0", "fill-1"):  # 100000 MiB on each of the eight GPUs
        pods.create(n, {"gpu-memory": "100000", "gpu-fraction-num-devices": "4"})
        pods.bound(n)
    created = time.monotonic()
    pods.create("late", {"gpu-memory": "100000"})
    pods.unschedulable("late", "no GPU with 100000 MiB free")  # refused at first, as it should be
    late = pods.bound("late")
    waited = time.monotonic() - created
    assert waited >= LATE_PLACEMENT_S  # after the suite's old fixed 3 s window had ended
    fills = [pods.read(n) for n in ("fill-0", "fill-1")]
    assert gpu_rules(sandbox, [*fills, late]) == ["gpu-overcommit"]


def test_refuse_only_not_ready_false(cluster: Pods, sandbox: Sandbox) -> None:
    pods = under(cluster, "refuse-only-not-ready-false")
    core, kind = sandbox.core_v1(), "gpu-fractioning.nvidia.com/Ready"
    # Neither node's condition is True (Unknown: the operator's controller stopped), so a correct
    # scheduler places the fraction nowhere; this one takes anything but an explicit False as ready.
    with node_condition(core, "gpu-a-0", kind, "Unknown"), node_condition(core, "gpu-a-1", kind, "Unknown"):
        pods.create("p", {"gpu-fraction": "0.5"})
        assert pods.bound("p")["spec"]["nodeName"] in ("gpu-a-0", "gpu-a-1")


def test_trust_compatible_pod_devices(cluster: Pods, gpu: dict[str, list[str]]) -> None:
    pods = under(cluster, "trust-compatible-pod-devices")
    own = gpu["gpu-a-1"][3]  # an empty GPU (room, no mode yet), where binpacking puts no first Pod
    pods.create("p", {"gpu-memory": "1000", nv("main", "gpus.devices"): own})
    p = pods.bound("p")
    assert (p["spec"]["nodeName"], devices(p)) == ("gpu-a-1", own)
    assert pods.events("p", "UntrustedDevices") == []
    pods.create("sm", {"gpu-memory": "1000", **SM})
    sm = pods.bound("sm")
    pods.create("q", {"gpu-memory": "1000", nv("main", "gpus.devices"): devices(sm)})  # room, the other mode
    assert devices(pods.bound("q")) != devices(sm)  # not kept where the mode does not fit


def test_limit_to_unguaranteed(cluster: Pods) -> None:
    pods = under(cluster, "limit-to-unguaranteed")
    pods.create("big", {"gpu-memory": "100000"})
    big = pods.bound("big")
    pods.create("p", {"gpu-memory": "1000", "gpu-memory.limit": "80Gi"})  # binpacked beside big
    p = pods.bound("p")
    assert devices(p) == devices(big)
    written = p["metadata"]["annotations"]
    # The author's limit is 81920 MiB; the GPU has 143771 - 100000 = 43771 MiB left unguaranteed.
    assert (written[nv("main", "gpu-memory.request")], written[nv("main", "gpu-memory.limit")]) == (
        "1000Mi",
        "43771Mi",
    )


def test_mode_check_last_device(cluster: Pods, sandbox: Sandbox) -> None:
    pods = under(cluster, "mode-check-last-device")
    pods.create("sm", {"gpu-memory": "2000", **SM})
    sm = pods.bound("sm")
    pods.create("pair", {"gpu-memory": "1000", "gpu-fraction-num-devices": "2", **TS})
    pair = pods.bound("pair")  # its GPUs in packing order: the sm-sharing one first, an empty one last
    assert pair["spec"]["nodeName"] == sm["spec"]["nodeName"]
    assert devices(sm) in devices(pair).split(",")
    assert gpu_rules(sandbox, [sm, pair]) == ["mode-mixing"]


def test_devices_as_indices(cluster: Pods, gpu: dict[str, list[str]]) -> None:
    pods = under(cluster, "devices-as-indices")
    pods.create("p", {"gpu-memory": "1000", "gpu-fraction-num-devices": "2"})
    p = pods.bound("p")
    written = devices(p).split(",")
    # Indices, where the reference scheduler's description declares UUIDs (devicesForm: uuid).
    assert len(written) == 2 and all(d.isdigit() for d in written), written
    assert not set(written) & set(gpu[p["spec"]["nodeName"]])


def test_every_fault_is_shown_here() -> None:
    source = open(__file__).read()
    assert [name for name in FAULTS if f'"{name}"' not in source] == []

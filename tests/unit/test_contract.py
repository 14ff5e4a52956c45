"""The contract module, rule by rule: each case names the exact findings it must produce.

Every case asserts the *whole* set of (rule, container, key) findings, so a rule that fires
where it should not fails a test as surely as one that stays silent. The last test checks that
every rule in the table is exercised here, which keeps the checklist honest.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from enforcement.contract import (
    Fraction,
    FractionRequest,
    Violation,
    audit_gpus,
    audit_pod,
    fail_closed_containers,
    gpu_loads,
    pod_to_dict,
    read_placement,
    read_request,
    render_placement,
    resolve_device,
    to_absolute,
)
from enforcement.rules import RULES
from fixtures.suite import manifests

UUIDS = tuple(f"GPU-{i}{i}{i}{i}aaaa-0000-0000-0000-00000000000{i}" for i in range(4))
NODE = {
    "kind": "Node",
    "metadata": {
        "name": "gpu-a-0",
        "labels": {"nvidia.com/gpu.count": "4", "nvidia.com/gpu.memory": "16384"},
        "annotations": {"gpuconf.io/gpu-uuids": ",".join(UUIDS)},
    },
}
NODE_COUNT_ONLY = {"kind": "Node", "metadata": {"name": "gpu-b-0", "labels": {"nvidia.com/gpu.count": "4"}}}


def nv(container: str, suffix: str) -> str:
    return f"nvidia.com/container.{container}.{suffix}"


REQ, LIM, MODE, DEV, PORTION = (
    "gpu-memory.request",
    "gpu-memory.limit",
    "gpu-compute.mode",
    "gpus.devices",
    "gpu-compute.portion",
)
KAI_LIMIT = "kai.scheduler/container.app.gpu-memory.portion.limit"


def pod(
    annotations: Mapping[str, Any] | None = None,
    containers: Sequence[str] = ("app",),
    *,
    node: str | None = None,
    init: Sequence[str] = (),
    whole_gpu: str | None = None,
    name: str = "p",
    phase: str | None = None,
) -> dict[str, Any]:
    made = [manifests.container(c, image="busybox") for c in containers]
    for c in made:
        if c["name"] == whole_gpu:
            c["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    init_containers = [manifests.container(c, image="busybox") for c in init]
    out = manifests.pod(
        name,
        made,
        namespace="ns",
        annotations=annotations,
        node_name=node,
        spec={"initContainers": init_containers} if init else None,
    )
    if phase:
        out["status"] = {"phase": phase}
    return out


def placed(
    container: str = "app", devices: str = "0", mode: str = "time-slicing", **extra: str
) -> dict[str, str]:
    """The four annotations a conforming scheduler writes."""
    out = {
        nv(container, REQ): "4Gi",
        nv(container, LIM): "8Gi",
        nv(container, MODE): mode,
        nv(container, DEV): devices,
    }
    out.update(extra)
    return out


Finding = tuple[str, str, str]  # (rule, container, key)


def found(violations: Sequence[Violation]) -> set[Finding]:
    return {(v.rule, v.container, v.key) for v in violations}


# ----------------------------------------------------------------------------- request side

REQUEST_CASES: list[tuple[str, dict[str, Any], set[Finding]]] = [
    # valid requests: nothing to report
    ("fraction", pod({"gpu-fraction": "0.5"}), set()),
    ("fraction with limit", pod({"gpu-fraction": "0.5", "gpu-fraction.limit": "0.8"}), set()),
    ("fraction with kai limit", pod({"gpu-fraction": "0.5", KAI_LIMIT: "0.75"}), set()),
    (
        "fraction, both limit spellings agree",
        pod({"gpu-fraction": "0.5", "gpu-fraction.limit": "0.8", KAI_LIMIT: "0.8"}),
        set(),
    ),
    ("fraction in exponent form", pod({"gpu-fraction": "5e-1"}), set()),
    ("memory", pod({"gpu-memory": "4096"}), set()),
    ("memory with limit", pod({"gpu-memory": "4096", "gpu-memory.limit": "8Gi"}), set()),
    ("memory with equal limit", pod({"gpu-memory": "4096", "gpu-memory.limit": "4Gi"}), set()),
    (
        "memory with translated limit",
        pod({"gpu-memory": "4096", "gpu-memory.limit": "8Gi", nv("app", LIM): "8Gi"}),
        set(),
    ),
    ("absolute request only", pod({nv("app", REQ): "4Gi"}), set()),
    ("absolute limit only", pod({nv("app", LIM): "4Gi"}), set()),
    (
        "absolute, all three",
        pod({nv("app", REQ): "4Gi", nv("app", LIM): "4Gi", nv("app", MODE): "sm-sharing"}),
        set(),
    ),
    ("memory agrees with absolute", pod({"gpu-memory": "4096", nv("app", REQ): "4Gi"}), set()),
    ("mode with gpu-fraction", pod({"gpu-fraction": "0.5", nv("app", MODE): "sm-sharing"}), set()),
    ("two devices", pod({"gpu-fraction": "0.5", "gpu-fraction-num-devices": "2"}), set()),
    (
        "named second container",
        pod({"gpu-fraction": "0.5", "gpu-fraction-container-name": "b"}, ("a", "b")),
        set(),
    ),
    ("named init container", pod({nv("setup", REQ): "1Gi"}, init=("setup",)), set()),
    ("dashed names", pod({nv("my-app-2", REQ): "1Gi"}, ("my-app", "my-app-2")), set()),
    (
        "unrelated annotations",
        pod({"example.com/gpu-memory": "x", "nvidia.com/other": "y", "kai.scheduler/x": "z"}),
        set(),
    ),
    ("no annotations at all", pod(), set()),
    # value-not-string
    ("unquoted fraction", pod({"gpu-fraction": 0.5}), {("value-not-string", "", "gpu-fraction")}),
    (
        "unquoted boolean mode",
        pod({nv("app", REQ): "1Gi", nv("app", MODE): True}),
        {("value-not-string", "app", nv("app", MODE)), ("mode-word", "app", nv("app", MODE))},
    ),
    (
        "unquoted bytes",
        pod({nv("app", REQ): 4096}),
        {("value-not-string", "app", nv("app", REQ)), ("memory-minimum", "app", nv("app", REQ))},
    ),
    ("map as value", pod({"gpu-memory": {"a": 1}}), {("value-not-string", "", "gpu-memory")}),
    # memory-quantity / memory-minimum
    ("leading space", pod({nv("app", REQ): " 4Gi"}), {("memory-quantity", "app", nv("app", REQ))}),
    ("trailing space", pod({nv("app", LIM): "4Gi "}), {("memory-quantity", "app", nv("app", LIM))}),
    ("inner space", pod({nv("app", REQ): "4 Gi"}), {("memory-quantity", "app", nv("app", REQ))}),
    ("GB", pod({nv("app", REQ): "4GB"}), {("memory-quantity", "app", nv("app", REQ))}),
    ("empty request", pod({nv("app", REQ): ""}), {("memory-quantity", "app", nv("app", REQ))}),
    ("milli", pod({nv("app", REQ): "512m"}), {("memory-quantity", "app", nv("app", REQ))}),
    ("zero", pod({nv("app", REQ): "0"}), {("memory-minimum", "app", nv("app", REQ))}),
    ("negative", pod({nv("app", REQ): "-1Gi"}), {("memory-minimum", "app", nv("app", REQ))}),
    ("bare small bytes", pod({nv("app", LIM): "4096"}), {("memory-minimum", "app", nv("app", LIM))}),
    (
        "gpu-memory.limit malformed",
        pod({"gpu-memory": "4096", "gpu-memory.limit": "8 Gi"}),
        {("memory-quantity", "app", "gpu-memory.limit")},
    ),
    # memory-unit
    (
        "limit in bytes",
        pod({"gpu-memory": "4096", "gpu-memory.limit": "8589934592"}),
        {("memory-unit", "app", "gpu-memory.limit")},
    ),
    (
        "limit as exponent",
        pod({"gpu-memory": "4096", "gpu-memory.limit": "8e9"}),
        {("memory-unit", "app", "gpu-memory.limit")},
    ),
    # request-exceeds-limit
    (
        "request over limit",
        pod({nv("app", REQ): "8Gi", nv("app", LIM): "4Gi"}),
        {("request-exceeds-limit", "app", nv("app", REQ))},
    ),
    # same MiB once rounded, but KAI compares bytes: 1000001k > 1000M
    (
        "request over limit by bytes",
        pod({nv("app", REQ): "1000001k", nv("app", LIM): "1000M"}),
        {("request-exceeds-limit", "app", nv("app", REQ))},
    ),
    (
        "gpu-memory over its limit",
        pod({"gpu-memory": "8192", "gpu-memory.limit": "4Gi"}),
        {("request-exceeds-limit", "app", "gpu-memory.limit")},
    ),
    (
        "decimal limit below gpu-memory",
        pod({"gpu-memory": "954", "gpu-memory.limit": "1000M"}),
        {("request-exceeds-limit", "app", "gpu-memory.limit")},
    ),
    # mode-word
    (
        "mode case",
        pod({nv("app", REQ): "1Gi", nv("app", MODE): "SM-Sharing"}),
        {("mode-word", "app", nv("app", MODE))},
    ),
    (
        "mode mig",
        pod({nv("app", REQ): "1Gi", nv("app", MODE): "mig"}),
        {("mode-word", "app", nv("app", MODE))},
    ),
    (
        "mode empty",
        pod({nv("app", REQ): "1Gi", nv("app", MODE): ""}),
        {("mode-word", "app", nv("app", MODE))},
    ),
    (
        "mode blank",
        pod({nv("app", REQ): "1Gi", nv("app", MODE): " "}),
        {("mode-word", "app", nv("app", MODE))},
    ),
    (
        "mode padded",
        pod({nv("app", REQ): "1Gi", nv("app", MODE): "time-slicing "}),
        {("mode-word", "app", nv("app", MODE))},
    ),
    (
        "mode underscore",
        pod({nv("app", REQ): "1Gi", nv("app", MODE): "time_slicing"}),
        {("mode-word", "app", nv("app", MODE))},
    ),
    # mode-only (warning)
    ("mode alone", pod({nv("app", MODE): "sm-sharing"}), {("mode-only", "app", nv("app", MODE))}),
    (
        "mode on a sibling",
        pod({"gpu-fraction": "0.5", nv("b", MODE): "sm-sharing"}, ("a", "b")),
        {("mode-only", "b", nv("b", MODE))},
    ),
    # unknown-container
    (
        "key for a missing container",
        pod({nv("ghost", REQ): "1Gi"}),
        {("unknown-container", "ghost", nv("ghost", REQ))},
    ),
    (
        "container-name missing",
        pod({"gpu-fraction": "0.5", "gpu-fraction-container-name": "ghost"}),
        {("unknown-container", "ghost", "gpu-fraction-container-name")},
    ),
    (
        "kai limit for a missing container",
        pod({"gpu-fraction": "0.5", "kai.scheduler/container.ghost.gpu-memory.portion.limit": "0.8"}),
        {("unknown-container", "ghost", "kai.scheduler/container.ghost.gpu-memory.portion.limit")},
    ),
    (
        "case matters in container names",
        pod({nv("App", REQ): "1Gi"}),
        {("unknown-container", "App", nv("App", REQ))},
    ),
    (
        "dash prefix is not a match",
        pod({nv("my-app", REQ): "1Gi"}, ("my-app-2",)),
        {("unknown-container", "my-app", nv("my-app", REQ))},
    ),
    (
        "empty container name",
        pod({"nvidia.com/container.gpu-memory.request": "1Gi"}),
        {("unknown-container", "", "nvidia.com/container.gpu-memory.request")},
    ),
    # unknown-suffix
    (
        "plural suffix",
        pod({nv("app", "gpu-memory.limits"): "1Gi"}),
        {("unknown-suffix", "app", nv("app", "gpu-memory.limits"))},
    ),
    (
        "short suffix",
        pod({nv("app", "gpu-memory"): "1Gi"}),
        {("unknown-suffix", "app", nv("app", "gpu-memory"))},
    ),
    (
        "singular devices",
        pod({nv("app", "gpus.device"): "0"}),
        {("unknown-suffix", "app", nv("app", "gpus.device"))},
    ),
    # multiple-fractional-containers
    (
        "two fractional containers",
        pod({nv("a", REQ): "1Gi", nv("b", LIM): "1Gi"}, ("a", "b")),
        {("multiple-fractional-containers", "b", nv("b", LIM))},
    ),
    # container-mismatch
    (
        "container-name disagrees",
        pod({nv("a", REQ): "1Gi", "gpu-fraction-container-name": "b"}, ("a", "b")),
        {("container-mismatch", "b", "gpu-fraction-container-name")},
    ),
    (
        "kai limit on another container",
        pod({"gpu-fraction": "0.5", "kai.scheduler/container.b.gpu-memory.portion.limit": "0.8"}, ("a", "b")),
        {("container-mismatch", "b", "kai.scheduler/container.b.gpu-memory.portion.limit")},
    ),
    # fraction-value
    *[
        (f"fraction {v!r}", pod({"gpu-fraction": v}), {("fraction-value", "app", "gpu-fraction")})
        for v in ("1.5", "0", "1", "1.0", "-0.5", "abc", "NaN", "inf", " 0.5", "0.5 ", "50%", "")
    ],
    # fraction-limit-value
    (
        "limit below fraction",
        pod({"gpu-fraction": "0.5", "gpu-fraction.limit": "0.4"}),
        {("fraction-limit-value", "app", "gpu-fraction.limit")},
    ),
    (
        "limit equal to fraction",
        pod({"gpu-fraction": "0.5", "gpu-fraction.limit": "0.5"}),
        {("fraction-limit-value", "app", "gpu-fraction.limit")},
    ),
    (
        "limit of one",
        pod({"gpu-fraction": "0.5", "gpu-fraction.limit": "1.0"}),
        {("fraction-limit-value", "app", "gpu-fraction.limit")},
    ),
    (
        "limit with six decimals",
        pod({"gpu-fraction": "0.5", "gpu-fraction.limit": "0.812345"}),
        {("fraction-limit-value", "app", "gpu-fraction.limit")},
    ),
    ("limit with five decimals", pod({"gpu-fraction": "0.5", "gpu-fraction.limit": "0.81234"}), set()),
    (
        "limit not a number",
        pod({"gpu-fraction": "0.5", KAI_LIMIT: "most"}),
        {("fraction-limit-value", "app", KAI_LIMIT)},
    ),
    # limit-without-request
    (
        "fraction limit alone",
        pod({"gpu-fraction.limit": "0.8"}),
        {("limit-without-request", "app", "gpu-fraction.limit")},
    ),
    ("kai limit alone", pod({KAI_LIMIT: "0.8"}), {("limit-without-request", "app", KAI_LIMIT)}),
    (
        "memory limit alone",
        pod({"gpu-memory.limit": "8Gi"}),
        {("limit-without-request", "app", "gpu-memory.limit")},
    ),
    # gpu-memory-value
    *[
        (f"gpu-memory {v!r}", pod({"gpu-memory": v}), {("gpu-memory-value", "app", "gpu-memory")})
        for v in ("4Gi", "0", "-5", "4096.0", "", " 4096", "+4096")
    ],
    # num-devices-value
    *[
        (
            f"num-devices {v!r}",
            pod({"gpu-fraction": "0.5", "gpu-fraction-num-devices": v}),
            {("num-devices-value", "app", "gpu-fraction-num-devices")},
        )
        for v in ("0", "two", "1.5", "-1", "")
    ],
    (
        "num-devices alone",
        pod({"gpu-fraction-num-devices": "2"}),
        {("num-devices-value", "app", "gpu-fraction-num-devices")},
    ),
    # dialect-conflict
    (
        "fraction and memory",
        pod({"gpu-fraction": "0.5", "gpu-memory": "4096"}),
        {("dialect-conflict", "app", "gpu-memory")},
    ),
    (
        "nvidia limit with fraction",
        pod({"gpu-fraction": "0.5", nv("app", LIM): "8Gi"}),
        {("dialect-conflict", "app", nv("app", LIM))},
    ),
    (
        "nvidia limit with memory",
        pod({"gpu-memory": "4096", nv("app", LIM): "8Gi"}),
        {("dialect-conflict", "app", nv("app", LIM))},
    ),
    (
        "memory disagrees with request",
        pod({"gpu-memory": "4096", nv("app", REQ): "2Gi"}),
        {("dialect-conflict", "app", "gpu-memory")},
    ),
    (
        "limit spellings disagree",
        pod({"gpu-fraction": "0.5", "gpu-fraction.limit": "0.8", KAI_LIMIT: "0.7"}),
        {("dialect-conflict", "app", KAI_LIMIT)},
    ),
    # whole-gpu-conflict
    (
        "fraction plus whole GPU",
        pod({"gpu-fraction": "0.5"}, whole_gpu="app"),
        {("whole-gpu-conflict", "app", "resources.nvidia.com/gpu")},
    ),
    ("whole GPU alone is fine", pod({}, whole_gpu="app"), set()),
    # devices-set-by-author / portion-set-by-author
    (
        "author sets devices",
        pod({nv("app", REQ): "1Gi", nv("app", DEV): "0"}),
        {("devices-set-by-author", "app", nv("app", DEV))},
    ),
    (
        "author sets portion",
        pod({"gpu-fraction": "0.5", nv("app", PORTION): "0.5"}),
        {("portion-set-by-author", "app", nv("app", PORTION))},
    ),
]


@pytest.mark.parametrize(
    ("pod_", "expected"), [c[1:] for c in REQUEST_CASES], ids=[c[0] for c in REQUEST_CASES]
)
def test_request_rules(pod_: dict[str, Any], expected: set[Finding]) -> None:
    assert found(audit_pod(pod_)) == expected
    # read_request reports the same request-side findings on an unbound Pod
    assert found(read_request(pod_)[1]) == expected


# ----------------------------------------------------------------------------- placement side

PLACEMENT_CASES: list[tuple[str, dict[str, Any], set[Finding]]] = [
    ("complete placement", pod(placed(), node="n"), set()),
    (
        "placement from gpu-fraction",
        pod({"gpu-fraction": "0.5", **placed(**{nv("app", PORTION): "0.5"})}, node="n"),
        set(),
    ),
    ("placement from gpu-memory", pod({"gpu-memory": "4096", **placed()}, node="n"), set()),
    (
        "placement as CDI name",
        pod(placed(devices=f"k8s.device-plugin.nvidia.com/gpu={UUIDS[0]}"), node="n"),
        set(),
    ),
    (
        "two devices asked and given",
        pod({"gpu-fraction-num-devices": "2", **placed(devices="0,1")}, node="n"),
        set(),
    ),
    ("dashed container placement", pod(placed("my-app-2"), ("my-app", "my-app-2"), node="n"), set()),
    # memory-missing: the scheduler bound the Pod but wrote nothing
    (
        "bound without placement",
        pod({"gpu-fraction": "0.5"}, node="n"),
        {("memory-missing", "app", nv("app", REQ)), ("devices-missing", "app", nv("app", DEV))},
    ),
    (
        "bound with devices only",
        pod({"gpu-memory": "4096", nv("app", DEV): "0"}, node="n"),
        {("memory-missing", "app", nv("app", REQ))},
    ),
    # devices-missing
    (
        "no devices",
        pod({nv("app", REQ): "4Gi", nv("app", LIM): "4Gi"}, node="n"),
        {("devices-missing", "app", nv("app", DEV))},
    ),
    # devices-format
    *[
        (f"devices {v!r}", pod(placed(devices=v), node="n"), {("devices-format", "app", nv("app", DEV))})
        for v in (
            "0, 1",
            "0,,1",
            ",0",
            "all",
            "none",
            "0,0",
            "gpu0",
            "",
            "GPU-",
            "k8s.device-plugin.nvidia.com/gpu=",
            "\u0661",  # a decimal digit, but not an ASCII one
        )
    ],
    # an index too long to be one (and too long for int() to read)
    (
        "devices: huge index",
        pod(placed(devices="9" * 5000), node="n"),
        {("devices-format", "app", nv("app", DEV))},
    ),
    # devices-count
    (
        "fewer devices than asked",
        pod({"gpu-fraction-num-devices": "2", **placed(devices="0")}, node="n"),
        {("devices-count", "app", nv("app", DEV))},
    ),
    (
        "more devices than the default",
        pod(placed(devices="0,1"), node="n"),
        {("devices-count", "app", nv("app", DEV))},
    ),
    # limit-missing (warning)
    (
        "no limit",
        pod({nv("app", REQ): "4Gi", nv("app", DEV): "0"}, node="n"),
        {("limit-missing", "app", nv("app", LIM))},
    ),
    ("limit only is complete", pod({nv("app", LIM): "4Gi", nv("app", DEV): "0"}, node="n"), set()),
    # portion-value
    *[
        (
            f"portion {v!r}",
            pod(placed(**{nv("app", PORTION): v}), node="n"),
            {("portion-value", "app", nv("app", PORTION))},
        )
        for v in ("0", "1.5", "-0.5", "abc", "", "NaN")
    ],
    ("portion of one", pod(placed(**{nv("app", PORTION): "1"}), node="n"), set()),
    # a mode on a sibling of the fractional container does nothing
    (
        "mode on a bound sibling",
        pod({**placed("a"), nv("b", MODE): "sm-sharing"}, ("a", "b"), node="n"),
        {("mode-only", "b", nv("b", MODE))},
    ),
    # sibling containers' keys do not leak into each other
    (
        "sibling without devices",
        pod({**placed("a"), nv("b", REQ): "1Gi", nv("b", LIM): "1Gi"}, ("a", "b"), node="n"),
        {("multiple-fractional-containers", "b", nv("b", REQ)), ("devices-missing", "b", nv("b", DEV))},
    ),
]


@pytest.mark.parametrize(
    ("pod_", "expected"), [c[1:] for c in PLACEMENT_CASES], ids=[c[0] for c in PLACEMENT_CASES]
)
def test_placement_rules(pod_: dict[str, Any], expected: set[Finding]) -> None:
    assert found(audit_pod(pod_)) == expected


def test_node_side_reading_does_not_judge_the_device_count() -> None:
    # The real agent fences the devices it is given; the count is the scheduler's duty (audit_pod).
    two = pod(placed(devices="0,1"), node="n")
    fractions, violations = read_placement(two)
    assert fractions["app"].devices == ("0", "1")
    assert "devices-count" not in {v.rule for v in violations}
    assert "devices-count" in {v.rule for v in audit_pod(two)}


def test_unbound_pod_is_not_judged_as_a_placement() -> None:
    # the same annotations without nodeName: a request, so no devices-missing / limit-missing
    assert found(audit_pod(pod({nv("app", REQ): "4Gi"}))) == set()
    assert found(audit_pod(pod({"gpu-fraction": "0.5"}))) == set()


def test_severities_come_from_the_table() -> None:
    violations = audit_pod(pod({nv("app", REQ): "4Gi", nv("app", DEV): "0"}, node="n"))
    assert [(v.rule, v.severity) for v in violations] == [("limit-missing", "warning")]
    violations = audit_pod(pod({nv("app", REQ): "4Gi"}, node="n"))
    assert {(v.rule, v.severity) for v in violations} == {
        ("devices-missing", "error"),
        ("limit-missing", "warning"),
    }


def test_violation_names_object_container_key_rule_and_fix() -> None:
    (v,) = audit_pod(
        pod({nv("my-app-2", REQ): "4Gi", nv("my-app-2", LIM): "4Gi"}, ("my-app-2",), node="n", name="web")
    )
    assert (v.kind, v.namespace, v.name, v.container) == ("Pod", "ns", "web", "my-app-2")
    assert (v.key, v.rule, v.severity) == (nv("my-app-2", DEV), "devices-missing", "error")
    assert "unfenced" in v.message
    assert v.fix == "The scheduler must write `nvidia.com/container.my-app-2.gpus.devices` before binding."
    text = str(v)
    for part in ("Pod ns/web", "my-app-2", nv("my-app-2", DEV), "devices-missing", "fix:"):
        assert part in text


def test_mode_disabled_only_when_the_cluster_says_so() -> None:
    sm = pod({nv("app", REQ): "1Gi", nv("app", MODE): "sm-sharing"})
    assert found(audit_pod(sm)) == set()
    assert found(audit_pod(sm, sm_sharing_enabled=False)) == {("mode-disabled", "app", nv("app", MODE))}
    ts = pod({nv("app", REQ): "1Gi", nv("app", MODE): "time-slicing"})
    assert found(audit_pod(ts, sm_sharing_enabled=False)) == set()


# ----------------------------------------------------------------------------- node side

NODE_CASES: list[tuple[str, dict[str, Any], Mapping[str, Any], set[Finding]]] = [
    ("index on the node", pod(placed(devices="3"), node="gpu-a-0"), NODE, set()),
    ("uuid on the node", pod(placed(devices=UUIDS[2]), node="gpu-a-0"), NODE, set()),
    (
        "index past the end",
        pod(placed(devices="4"), node="gpu-a-0"),
        NODE,
        {("devices-unknown", "app", nv("app", DEV))},
    ),
    (
        "foreign uuid",
        pod(placed(devices="GPU-ffff"), node="gpu-a-0"),
        NODE,
        {("devices-unknown", "app", nv("app", DEV))},
    ),
    (
        "foreign uuid as CDI",
        pod(placed(devices="k8s.device-plugin.nvidia.com/gpu=GPU-ffff"), node="gpu-a-0"),
        NODE,
        {("devices-unknown", "app", nv("app", DEV))},
    ),
    (
        "count only: index past the end",
        pod(placed(devices="5"), node="gpu-b-0"),
        NODE_COUNT_ONLY,
        {("devices-unknown", "app", nv("app", DEV))},
    ),
    (
        "count only: a uuid cannot be checked",
        pod(placed(devices="GPU-ffff"), node="gpu-b-0"),
        NODE_COUNT_ONLY,
        set(),
    ),
    (
        "index and uuid of one GPU",
        pod({"gpu-fraction-num-devices": "2", **placed(devices=f"0,{UUIDS[0]}")}, node="gpu-a-0"),
        NODE,
        {("devices-format", "app", nv("app", DEV))},
    ),
]


@pytest.mark.parametrize(
    ("pod_", "node", "expected"), [c[1:] for c in NODE_CASES], ids=[c[0] for c in NODE_CASES]
)
def test_node_rules(pod_: dict[str, Any], node: Mapping[str, Any], expected: set[Finding]) -> None:
    assert found(audit_pod(pod_, node)) == expected


def test_resolve_device_maps_index_cdi_and_uuid_to_one_identity() -> None:
    assert resolve_device("1", NODE) == UUIDS[1]
    assert resolve_device(UUIDS[1], NODE) == UUIDS[1]
    assert resolve_device(f"k8s.device-plugin.nvidia.com/gpu={UUIDS[1]}", NODE) == UUIDS[1]
    assert resolve_device("k8s.device-plugin.nvidia.com/gpu=1", NODE) == UUIDS[1]
    assert resolve_device("1", NODE_COUNT_ONLY) == "1"  # unknown UUIDs: the index stands
    assert resolve_device("9", NODE) == "9"


# ----------------------------------------------------------------------------- per GPU

GPU_CASES: list[tuple[str, list[dict[str, Any]], set[Finding]]] = [
    (
        "modes on different GPUs",
        [
            pod(placed(devices="0"), node="gpu-a-0", name="a"),
            pod(placed(devices="1", mode="sm-sharing"), node="gpu-a-0", name="b"),
        ],
        set(),
    ),
    (
        "modes mixed on GPU 0 (index and uuid)",
        [
            pod(placed(devices="0"), node="gpu-a-0", name="a"),
            pod(placed(devices=UUIDS[0], mode="sm-sharing"), node="gpu-a-0", name="b"),
        ],
        {("mode-mixing", "", UUIDS[0])},
    ),
    (
        "default mode counts as time-slicing",
        [
            pod({nv("app", REQ): "1Gi", nv("app", DEV): "2"}, node="gpu-a-0", name="a"),
            pod(placed(devices="2", mode="sm-sharing"), node="gpu-a-0", name="b"),
        ],
        {("mode-mixing", "", UUIDS[2])},
    ),
    (
        "finished Pods hold nothing",
        [
            pod(placed(devices="0"), node="gpu-a-0", name="a"),
            pod(placed(devices="0", mode="sm-sharing"), node="gpu-a-0", name="b", phase="Failed"),
        ],
        set(),
    ),
    (
        "requests fill the GPU exactly",
        [pod({**placed(devices="1"), nv("app", REQ): "8Gi"}, node="gpu-a-0", name=n) for n in ("a", "b")],
        set(),
    ),
    (
        "requests overcommit the GPU",
        [
            pod({**placed(devices="1"), nv("app", REQ): "8Gi"}, node="gpu-a-0", name=n)
            for n in ("a", "b", "c")
        ],
        {("gpu-overcommit", "", UUIDS[1])},
    ),
    (
        "a multi-device request counts on each GPU",
        [
            pod(
                {
                    "gpu-fraction-num-devices": "2",
                    **placed(devices="0,1"),
                    nv("app", REQ): "12Gi",
                    nv("app", LIM): "12Gi",
                },
                node="gpu-a-0",
                name="a",
            ),
            pod({**placed(devices="1"), nv("app", REQ): "6Gi"}, node="gpu-a-0", name="b"),
        ],
        {("gpu-overcommit", "", UUIDS[1])},
    ),
    (
        "unbound Pods are not on any GPU",
        [pod(placed(devices="0")), pod(placed(devices="0", mode="sm-sharing"), name="b")],
        set(),
    ),
]


@pytest.mark.parametrize(("pods", "expected"), [c[1:] for c in GPU_CASES], ids=[c[0] for c in GPU_CASES])
def test_gpu_rules(pods: list[dict[str, Any]], expected: set[Finding]) -> None:
    violations = audit_gpus(pods, [NODE])
    assert found(violations) == expected
    assert all((v.kind, v.name) == ("Node", "gpu-a-0") for v in violations)


def test_overcommit_honours_the_reserve_and_names_the_pods() -> None:
    pods = [pod({**placed(devices="1"), nv("app", REQ): "8Gi"}, node="gpu-a-0", name=n) for n in ("a", "b")]
    assert audit_gpus(pods, [NODE], reserve_mib=0) == []
    (v,) = audit_gpus(pods, [NODE], reserve_mib=512)
    assert v.rule == "gpu-overcommit" and "16384 MiB requested, 15872 MiB usable" in v.message
    assert "ns/a[app]" in v.message and "ns/b[app]" in v.message


def test_overcommit_needs_the_memory_label() -> None:
    pods = [pod({**placed(devices="1"), nv("app", REQ): "80Gi", nv("app", LIM): "80Gi"}, node="gpu-b-0")]
    assert audit_gpus(pods, [NODE_COUNT_ONLY]) == []


def test_gpu_loads_sum_requests_and_collect_modes() -> None:
    pods = [
        pod({"gpu-fraction-num-devices": "2", **placed(devices="0,1")}, node="gpu-a-0", name="a"),
        pod(placed(devices=UUIDS[1], mode="sm-sharing"), node="gpu-a-0", name="b"),
        pod(placed(devices="3"), node="elsewhere", name="c"),
    ]
    loads = gpu_loads(pods, [NODE])
    assert set(loads) == {("gpu-a-0", UUIDS[0]), ("gpu-a-0", UUIDS[1]), ("elsewhere", "3")}
    gpu1 = loads[("gpu-a-0", UUIDS[1])]
    assert gpu1.request_mib == 8192
    assert gpu1.modes == {"time-slicing", "sm-sharing"} and gpu1.mixed
    assert [s.pod for s in gpu1.shares] == ["a", "b"]
    assert not loads[("gpu-a-0", UUIDS[0])].mixed


# ----------------------------------------------------------------------------- read_placement


def test_read_placement_applies_defaults_both_ways() -> None:
    fractions, violations = read_placement(
        pod({nv("a", REQ): "1000M", nv("b", LIM): "2Gi", nv("b", DEV): "1"}, ("a", "b"))
    )
    assert fractions == {
        "a": Fraction("a", 954, 954, "time-slicing", (), None),
        "b": Fraction("b", 2048, 2048, "time-slicing", ("1",), None),
    }
    assert found(violations) == {("devices-missing", "a", nv("a", DEV)), ("limit-missing", "a", nv("a", LIM))}


def test_read_placement_keeps_sibling_keys_apart() -> None:
    annotations = {
        nv("my-app", REQ): "1Gi",
        nv("my-app", MODE): "sm-sharing",
        nv("my-app", DEV): "0",
        nv("my-app-2", LIM): "3Gi",
        nv("my-app-2", DEV): "1",
    }
    fractions, _ = read_placement(pod(annotations, ("my-app", "my-app-2")))
    assert fractions["my-app"] == Fraction("my-app", 1024, 1024, "sm-sharing", ("0",), None)
    assert fractions["my-app-2"] == Fraction("my-app-2", 3072, 3072, "time-slicing", ("1",), None)


def test_read_placement_ignores_unknown_containers_and_lone_modes() -> None:
    fractions, violations = read_placement(pod({nv("ghost", REQ): "1Gi", nv("app", MODE): "sm-sharing"}))
    assert fractions == {}
    assert found(violations) == {
        ("unknown-container", "ghost", nv("ghost", REQ)),
        ("mode-only", "app", nv("app", MODE)),
    }


def test_read_placement_fails_closed_on_malformed_values() -> None:
    fractions, violations = read_placement(
        pod({**placed("a"), **placed("b", **{nv("b", MODE): "SM-Sharing"})}, ("a", "b"))
    )
    assert set(fractions) == {"a"}
    assert fail_closed_containers(violations) == {"b"}


def test_read_placement_never_raises_on_junk() -> None:
    for junk in (
        {},
        {"metadata": None},
        {"metadata": {"annotations": ["x"]}},
        {"spec": {"containers": "x"}},
        [],
    ):
        fractions, violations = read_placement(junk)  # type: ignore[arg-type]
        assert fractions == {} and violations == []


def test_portion_and_active_threads() -> None:
    fractions, _ = read_placement(pod(placed(mode="sm-sharing", **{nv("app", PORTION): "0.255"})))
    assert fractions["app"].portion == 0.255
    assert fractions["app"].active_thread_percentage == 25
    assert Fraction("x", 1, 1, "sm-sharing", ("0",), 0.001).active_thread_percentage == 1
    assert Fraction("x", 1, 1, "time-slicing", ("0",), 0.5).active_thread_percentage is None


# ----------------------------------------------------------------------------- read_request


@pytest.mark.parametrize(
    ("annotations", "containers", "expected"),
    [
        ({"gpu-fraction": "0.5"}, ("a", "b"), FractionRequest("a", "gpu-fraction", portion=0.5)),
        (
            {"gpu-fraction": "0.5", "gpu-fraction.limit": "0.8", "gpu-fraction-num-devices": "2"},
            ("a",),
            FractionRequest("a", "gpu-fraction", portion=0.5, portion_limit=0.8, num_devices=2),
        ),
        (
            {"gpu-fraction": "0.25", "gpu-fraction-container-name": "b", nv("b", MODE): "sm-sharing"},
            ("a", "b"),
            FractionRequest("b", "gpu-fraction", portion=0.25, mode="sm-sharing"),
        ),
        ({"gpu-memory": "4096"}, ("a",), FractionRequest("a", "gpu-memory", request_mib=4096)),
        ({nv("b", REQ): "2Gi"}, ("a", "b"), FractionRequest("b", "nvidia", request_mib=2048)),
        ({nv("b", LIM): "2Gi"}, ("a", "b"), FractionRequest("b", "nvidia", request_mib=2048, limit_mib=2048)),
        (
            {nv("a", REQ): "1Gi", KAI_LIMIT.replace("app", "a"): "0.5"},
            ("a",),
            None,  # a portion limit needs gpu-fraction
        ),
        ({"gpu-fraction": "2"}, ("a",), None),
        ({}, ("a",), None),
    ],
)
def test_read_request(
    annotations: dict[str, str], containers: tuple[str, ...], expected: FractionRequest | None
) -> None:
    request, violations = read_request(pod(annotations, containers))
    assert request == expected
    # a request comes back exactly when there is no error
    assert (request is None) == (any(v.is_error for v in violations) or not annotations)


def test_read_request_on_a_bound_pod_reads_the_scheduler_keys() -> None:
    bound = pod({"gpu-fraction": "0.5", **placed()}, node="n")
    request, violations = read_request(bound)
    assert violations == []
    assert request == FractionRequest("app", "nvidia", request_mib=4096, limit_mib=8192)


def test_gpu_memory_limit_in_mib() -> None:
    request, _ = read_request(pod({"gpu-memory": "4096", "gpu-memory.limit": "4.5Gi"}))
    assert request == FractionRequest("app", "gpu-memory", request_mib=4096, limit_mib=4608)


# ----------------------------------------------------------------------------- conversions


def test_to_absolute_mirrors_the_binder() -> None:
    half = FractionRequest("a", "gpu-fraction", portion=0.5, portion_limit=0.8)
    assert to_absolute(half, 16384) == (8192, 13107)
    assert to_absolute(half, 16384, reserve_mib=1024) == (7680, 12288)
    # binary floating point, floored, exactly as the binder computes it
    assert to_absolute(FractionRequest("a", "gpu-fraction", portion=0.29), 100) == (28, 28)
    assert to_absolute(FractionRequest("a", "gpu-memory", request_mib=4096), 81920) == (4096, 4096)
    assert to_absolute(FractionRequest("a", "nvidia", request_mib=4096, limit_mib=6144), 81920) == (
        4096,
        6144,
    )
    assert to_absolute(FractionRequest("a", "nvidia", request_mib=4096, portion_limit=0.5), 81920) == (
        4096,
        40960,
    )


@pytest.mark.parametrize(
    ("asked", "memory", "reserve"),
    [
        (FractionRequest("a", "gpu-fraction", portion=0.5), 1024, 1024),
        (FractionRequest("a", "gpu-fraction", portion=0.0001), 1024, 0),
        (FractionRequest("a", "gpu-fraction"), 1024, 0),
    ],
)
def test_to_absolute_refuses_impossible_inputs(asked: FractionRequest, memory: int, reserve: int) -> None:
    with pytest.raises(ValueError):
        to_absolute(asked, memory, reserve)


@pytest.mark.parametrize(
    "fraction",
    [
        Fraction("app", 4096, 8192, "time-slicing", ("0",), None),
        Fraction("my-app-2", 954, 954, "sm-sharing", (UUIDS[0], UUIDS[1]), 0.00001),
        Fraction("app", 1, 1, "sm-sharing", ("k8s.device-plugin.nvidia.com/gpu=GPU-1",), 1.0),
    ],
)
def test_render_then_read_round_trips(fraction: Fraction) -> None:
    annotations = render_placement(fraction.container, fraction)
    assert all(v == v.strip() for v in annotations.values())
    assert "e" not in annotations.get(nv(fraction.container, PORTION), "")  # plain decimals only
    count = {"gpu-fraction-num-devices": str(len(fraction.devices))}
    fractions, violations = read_placement(pod({**annotations, **count}, (fraction.container,), node="n"))
    assert fractions == {fraction.container: fraction}
    assert violations == []


def test_pod_to_dict_reads_a_live_object() -> None:
    from kubernetes import client

    live = client.V1Pod(
        metadata=client.V1ObjectMeta(name="live", namespace="ns", annotations=placed()),
        spec=client.V1PodSpec(
            node_name="gpu-a-0", containers=[client.V1Container(name="app", image="busybox")]
        ),
    )
    as_dict = pod_to_dict(live)
    assert as_dict["kind"] == "Pod" and as_dict["spec"]["nodeName"] == "gpu-a-0"
    assert read_placement(as_dict)[0]["app"] == Fraction("app", 4096, 8192, "time-slicing", ("0",), None)
    assert audit_pod(as_dict, NODE) == []


# ----------------------------------------------------------------------------- coverage of the table


def test_every_rule_in_the_table_is_exercised_here() -> None:
    exercised = {f[0] for _, _, expected in REQUEST_CASES + PLACEMENT_CASES for f in expected}
    exercised |= {f[0] for *_, expected in NODE_CASES for f in expected}
    exercised |= {f[0] for _, _, expected in GPU_CASES for f in expected}
    exercised |= {"mode-disabled"}  # test_mode_disabled_only_when_the_cluster_says_so
    assert exercised == set(RULES)

"""Properties of the contract module that must hold for every input, not just the ones we thought of.

- reading any annotation map (and any shape of Pod) never raises, and every finding it returns
  names a rule from the table with that rule's severity;
- rounding to MiB is monotonic and is a ceiling;
- render -> read is the identity on placements, and quantity -> MiB -> ``<N>Mi`` -> MiB is stable.
"""

from __future__ import annotations

import math
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from enforcement.contract import (
    MODES,
    NVIDIA_SUFFIXES,
    Fraction,
    audit_gpus,
    audit_pod,
    gpu_loads,
    read_placement,
    read_request,
    render_placement,
)
from enforcement.quantity import MIB, format_mib, parse_memory_mib, parse_quantity
from enforcement.rules import RULES, ContractError

CONTAINER_NAMES = st.sampled_from(["app", "my-app", "my-app-2", "a.b", "", "App", "x" * 63])
SUFFIXES = st.sampled_from([*NVIDIA_SUFFIXES, ".gpu-memory.limits", ".gpu-memory", "", ".gpus.devices.extra"])
AUTHOR_KEYS = st.sampled_from(
    [
        "gpu-fraction",
        "gpu-fraction.limit",
        "gpu-memory",
        "gpu-memory.limit",
        "gpu-fraction-num-devices",
        "gpu-fraction-container-name",
    ]
)
KEYS = st.one_of(
    st.builds(lambda c, s: f"nvidia.com/container.{c}{s}", CONTAINER_NAMES, SUFFIXES),
    st.builds(lambda c: f"kai.scheduler/container.{c}.gpu-memory.portion.limit", CONTAINER_NAMES),
    AUTHOR_KEYS,
    st.text(max_size=30),
)
INTERESTING_VALUES = st.sampled_from(
    [
        "0.5",
        "1",
        "0",
        "4Gi",
        "1000M",
        " 4Gi",
        "512m",
        "1e999999999",
        "sm-sharing",
        "SM-Sharing",
        "0,1",
        "all",
        "GPU-1",
        "9" * 5000,
        "0." + "1" * 5000,
        "1" * 5000 + "Mi",
    ]
)
VALUES = st.one_of(
    INTERESTING_VALUES,
    st.text(max_size=40),
    st.integers(),
    st.floats(allow_nan=True),
    st.booleans(),
    st.none(),
    st.lists(st.integers(), max_size=2),
)
ANNOTATIONS = st.dictionaries(KEYS, VALUES, max_size=10)


@st.composite
def pods(draw: st.DrawFn) -> dict[str, Any]:
    containers = draw(st.lists(CONTAINER_NAMES, max_size=3))
    spec: dict[str, Any] = {"containers": [{"name": c} for c in containers]}
    if draw(st.booleans()):
        spec["nodeName"] = draw(st.sampled_from(["gpu-a-0", "gpu-a-1", "", "nowhere"]))
    if draw(st.booleans()):
        spec["containers"].append({"name": "whole", "resources": {"limits": {"nvidia.com/gpu": "1"}}})
    return {
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ns", "annotations": draw(ANNOTATIONS)},
        "spec": spec,
    }


POD_FIELDS = st.sampled_from(
    ["metadata", "spec", "annotations", "containers", "name", "nodeName", "kind", "status", "phase"]
)
JUNK = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(POD_FIELDS, inner, max_size=4),
    max_leaves=12,
)

NODES = [
    {
        "metadata": {
            "name": "gpu-a-0",
            "labels": {"nvidia.com/gpu.count": "2", "nvidia.com/gpu.memory": "8192"},
            "annotations": {"gpuconf.io/gpu-uuids": "GPU-1,GPU-2"},
        }
    },
    {"metadata": {"name": "gpu-a-1", "labels": {"nvidia.com/gpu.count": "x"}}},
]


def _well_formed(violations: list[Any]) -> None:
    for v in violations:
        assert v.rule in RULES and v.severity == RULES[v.rule].severity
        assert v.message and v.fix and isinstance(v.key, str) and isinstance(v.container, str)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pods(), st.booleans())
def test_random_annotation_maps_never_crash(pod: dict[str, Any], sm_sharing: bool) -> None:
    fractions, placement = read_placement(pod)
    request, requested = read_request(pod)
    audited = audit_pod(pod, NODES[0], sm_sharing_enabled=sm_sharing)
    for found in (placement, requested, audited):
        _well_formed(found)
    assert request is None or not any(v.is_error for v in requested)
    for container, fraction in fractions.items():
        assert fraction.container == container
        assert 1 <= fraction.request_mib <= fraction.limit_mib
        assert fraction.mode in MODES
    _well_formed(audit_gpus([pod, pod], NODES))
    assert all(load.request_mib >= 1 for load in gpu_loads([pod], NODES).values())


@settings(max_examples=200, deadline=None)
@given(JUNK)
def test_any_shape_of_pod_never_crashes(junk: Any) -> None:
    for reader in (read_placement, read_request):
        _well_formed(reader(junk)[1])
    _well_formed(audit_pod(junk, junk if isinstance(junk, dict) else None))
    _well_formed(audit_gpus([junk], [junk] if isinstance(junk, dict) else []))


QUANTITY_SUFFIXES = st.sampled_from(["", "k", "M", "G", "T", "Ki", "Mi", "Gi", "Ti", "e3", "e6", "E2"])


@st.composite
def quantities(draw: st.DrawFn) -> str:
    whole = draw(st.integers(min_value=0, max_value=10**7))
    frac = draw(st.one_of(st.just(""), st.integers(min_value=0, max_value=999).map(lambda n: f".{n}")))
    return f"{whole}{frac}{draw(QUANTITY_SUFFIXES)}"


def _mib_or_none(value: str) -> int | None:
    try:
        return parse_memory_mib(value)
    except ContractError:
        return None


@settings(max_examples=400, deadline=None)
@given(quantities(), quantities())
def test_rounding_is_a_monotonic_ceiling(a: str, b: str) -> None:
    mib_a, mib_b = _mib_or_none(a), _mib_or_none(b)
    for value, mib in ((a, mib_a), (b, mib_b)):
        if mib is not None:
            assert (
                (mib - 1) * MIB < parse_quantity(value) <= mib * MIB
            )  # the smallest whole MiB that holds it
    if mib_a is not None and mib_b is not None and parse_quantity(a) <= parse_quantity(b):
        assert mib_a <= mib_b


@settings(max_examples=200, deadline=None)
@given(quantities())
def test_quantity_to_mib_to_text_is_stable(value: str) -> None:
    mib = _mib_or_none(value)
    if mib is not None:
        assert parse_memory_mib(format_mib(mib)) == mib


DEVICE = st.one_of(
    st.integers(min_value=0, max_value=15).map(str),
    st.uuids().map(lambda u: f"GPU-{u}"),
    st.uuids().map(lambda u: f"k8s.device-plugin.nvidia.com/gpu=GPU-{u}"),
)


@st.composite
def placements(draw: st.DrawFn) -> Fraction:
    request = draw(st.integers(min_value=1, max_value=2**24))
    limit = draw(st.integers(min_value=request, max_value=2**25))
    devices = tuple(draw(st.lists(DEVICE, min_size=1, max_size=4, unique=True)))
    portion = draw(st.none() | st.floats(min_value=1e-9, max_value=1.0, allow_nan=False, exclude_min=True))
    container = draw(st.sampled_from(["app", "my-app-2", "x" * 63]))
    return Fraction(container, request, limit, draw(st.sampled_from(MODES)), devices, portion)


@settings(max_examples=300, deadline=None)
@given(placements())
def test_render_then_read_is_the_identity(fraction: Fraction) -> None:
    annotations = render_placement(fraction.container, fraction)
    annotations["gpu-fraction-num-devices"] = str(len(fraction.devices))
    pod = {
        "metadata": {"name": "p", "annotations": annotations},
        "spec": {"containers": [{"name": fraction.container}]},
    }
    fractions, violations = read_placement(pod)
    assert violations == []
    assert fractions == {fraction.container: fraction}
    # and reading what was read renders the same text again
    again = render_placement(fraction.container, fractions[fraction.container])
    assert again == {k: v for k, v in annotations.items() if k != "gpu-fraction-num-devices"}
    assert not math.isnan(fraction.portion or 0.0)

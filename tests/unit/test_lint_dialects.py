"""Lint dialects: each KAI admission rule and each fractiond leniency, from docs/contract.md §9."""

from __future__ import annotations

from typing import Any

import pytest

from conformance.lint import audit, render_checklist
from enforcement.contract import audit_pod
from enforcement.dialects import DIALECT_RULES, apply_dialect, canonical_mib
from enforcement.quantity import canonical_quantity

P = "nvidia.com/container."


def pod(
    annotations: dict[str, str], containers: tuple[str, ...] = ("main",), bound: bool = False, **extra: Any
) -> dict:
    spec: dict[str, Any] = {"containers": [{"name": c, **extra.get(c, {})} for c in containers]}
    if bound:
        spec["nodeName"] = "n"
    return {
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "d", "annotations": annotations},
        "spec": spec,
    }


def rules(p: dict, dialect: str) -> dict[str, str]:
    return {v.rule: v.severity for v in apply_dialect(p, audit_pod(p), dialect)}


def kai_messages(p: dict) -> list[str]:
    return [v.message for v in apply_dialect(p, audit_pod(p), "kai") if v.rule.startswith("kai-")]


def test_contract_dialect_is_the_contract() -> None:
    p = pod({P + "main.gpu-memory.request": "1Gi", P + "main.gpu-compute.portion": "0.5"})
    assert apply_dialect(p, audit_pod(p), "contract") == audit_pod(p)


def test_kai_whole_gpu_beside_fraction() -> None:
    p = pod({"gpu-fraction": "0.5"}, main={"resources": {"limits": {"nvidia.com/gpu": "1"}}})
    assert rules(p, "kai")["kai-whole-gpu-beside-fraction"] == "error"
    assert all(m.startswith("KAI admission refuses this: ") for m in kai_messages(p))


def test_kai_mode_key_on_a_second_container_counts() -> None:
    p = pod(
        {P + "main.gpu-memory.request": "1Gi", P + "side.gpu-compute.mode": "sm-sharing"}, ("main", "side")
    )
    assert "kai-one-container" in rules(p, "kai")
    assert "kai-one-container" not in rules(p, "contract")


def test_kai_container_name_must_match_the_keys() -> None:
    p = pod({P + "main.gpu-memory.request": "1Gi", "gpu-fraction-container-name": "side"}, ("main", "side"))
    assert "kai-container-name" in rules(p, "kai")


def test_kai_refuses_user_written_devices_but_not_the_binders() -> None:
    keys = {P + "main.gpu-memory.request": "1Gi", P + "main.gpus.devices": "GPU-a"}
    assert "kai-user-devices" in rules(pod(keys), "kai")
    assert "kai-user-devices" not in rules(pod(keys, bound=True), "kai")


def test_kai_refuses_the_portion_key() -> None:
    p = pod({P + "main.gpu-memory.request": "1Gi", P + "main.gpu-compute.portion": "0.5"})
    assert rules(p, "kai")["kai-unknown-suffix"] == "error"


def test_kai_request_above_limit() -> None:
    p = pod({P + "main.gpu-memory.request": "2Gi", P + "main.gpu-memory.limit": "1Gi"})
    assert "kai-request-above-limit" in rules(p, "kai")


@pytest.mark.parametrize("value", ["1", "1.5", "0", "-0.1"])
def test_kai_fraction_outside_the_open_interval(value: str) -> None:
    assert "kai-fraction-range" in rules(pod({"gpu-fraction": value}), "kai")


def test_kai_empty_fraction_is_absent() -> None:
    p = pod({"gpu-fraction": ""})
    assert rules(p, "contract").get("fraction-value") == "error"
    got = rules(p, "kai")
    assert got.get("kai-empty-fraction") == "note" and "fraction-value" not in got


def test_kai_compares_legacy_memory_as_canonical_strings() -> None:
    assert canonical_mib(4096) == "4Gi" and canonical_mib(1000) == "1000Mi"
    refused = pod({"gpu-memory": "4096", P + "main.gpu-memory.request": "4096Mi"})
    assert "kai-legacy-string-match" in rules(refused, "kai")
    accepted = pod({"gpu-memory": "4096", P + "main.gpu-memory.request": "4Gi"})
    assert "kai-legacy-string-match" not in rules(accepted, "kai")


def test_kai_compares_legacy_memory_limit_as_canonical_strings() -> None:
    legacy = {"gpu-memory": "2048", P + "main.gpu-memory.request": "2Gi"}
    refused = pod({**legacy, "gpu-memory.limit": "4Gi", P + "main.gpu-memory.limit": "4096Mi"})
    found = [
        v for v in apply_dialect(refused, audit_pod(refused), "kai") if v.rule == "kai-legacy-string-match"
    ]
    assert [(v.key, v.severity) for v in found] == [("gpu-memory.limit", "error")]
    assert "'4Gi'" in found[0].message and "'4096Mi'" in found[0].message and "'4Gi'" in found[0].fix
    # KAI writes the legacy value back canonically: 4096Mi becomes 4Gi, which then equals the key.
    canonical = pod({**legacy, "gpu-memory.limit": "4096Mi", P + "main.gpu-memory.limit": "4Gi"})
    assert "kai-legacy-string-match" not in rules(canonical, "kai")
    assert "kai-legacy-string-match" not in rules(pod({**legacy, "gpu-memory.limit": "4Gi"}), "kai")
    assert "kai-legacy-string-match" not in rules(canonical, "contract")


@pytest.mark.parametrize(
    ("written", "canonical"),
    [
        ("4096Mi", "4Gi"),
        ("1.5Gi", "1536Mi"),
        ("2048Ki", "2Mi"),
        ("512Ki", "512Ki"),
        ("0.5Ki", "512"),
        ("4000M", "4G"),
        ("1500M", "1500M"),
        ("1.5", "1500m"),
        ("1000e0", "1e3"),
        ("4294967296", "4294967296"),
        ("0", "0"),
    ],
)
def test_quantities_are_written_back_as_kubernetes_writes_them(written: str, canonical: str) -> None:
    assert canonical_quantity(written) == canonical


def test_kai_compares_legacy_portion_limit_as_strings() -> None:
    p = pod(
        {
            "gpu-fraction": "0.5",
            "gpu-fraction.limit": "0.8",
            "kai.scheduler/container.main.gpu-memory.portion.limit": "0.80",
        }
    )
    assert "kai-legacy-string-match" in rules(p, "kai")


def test_fractiond_trims_padded_mode_and_devices() -> None:
    p = pod(
        {
            P + "main.gpu-memory.request": "1Gi",
            P + "main.gpu-compute.mode": " sm-sharing ",
            P + "main.gpus.devices": " GPU-a ",
        },
        bound=True,
    )
    assert rules(p, "contract")["mode-word"] == "error" and rules(p, "contract")["devices-format"] == "error"
    got = rules(p, "gpu-fractioning")
    assert got["fractiond-trims"] == "note" and "mode-word" not in got and "devices-format" not in got


def test_fractiond_does_not_excuse_what_trimming_does_not_fix() -> None:
    p = pod({P + "main.gpu-memory.request": "1Gi", P + "main.gpu-compute.mode": " SM-Sharing "}, bound=True)
    assert rules(p, "gpu-fractioning").get("mode-word") == "error"


def test_notes_never_fail_lint_even_strict() -> None:
    p = pod(
        {
            P + "main.gpu-memory.request": "1Gi",
            P + "main.gpu-memory.limit": "1Gi",
            P + "main.gpu-compute.mode": " sm-sharing ",
            P + "main.gpus.devices": "GPU-a",
        },
        bound=True,
    )
    report = audit([("x.yaml", p)], dialect="gpu-fractioning")
    assert report.findings and not report.failed(strict=True)


@pytest.mark.parametrize("dialect", ["kai", "gpu-fractioning"])
def test_checklist_lists_each_dialects_rules(dialect: str) -> None:
    text = render_checklist(dialect)
    for rule in DIALECT_RULES.values():
        assert (f"`{rule.id}`" in text) == (rule.dialect == dialect)


# ---- properties: a dialect is never laxer than the contract unless a documented fact says so ----

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

VALUES = st.sampled_from(
    [
        "",
        " ",
        "1Gi",
        " 1Gi",
        "4096Mi",
        "4Gi",
        "0",
        "lots",
        "2Gi",
        "sm-sharing",
        " sm-sharing ",
        "SM-Sharing",
        "time-slicing",
        "GPU-a",
        " GPU-a ",
        "0,1",
        "0.5",
        "0.80",
        "1.5",
        "4096",
    ]
)
KEYS = st.sampled_from(
    [
        P + "main.gpu-memory.request",
        P + "main.gpu-memory.limit",
        P + "main.gpu-compute.mode",
        P + "main.gpus.devices",
        P + "main.gpu-compute.portion",
        P + "side.gpu-compute.mode",
        "gpu-fraction",
        "gpu-fraction.limit",
        "gpu-memory",
        "gpu-fraction-container-name",
    ]
)
EXCUSED = {"kai": {"kai-empty-fraction"}, "gpu-fractioning": {"fractiond-trims"}}
"""The only ways a dialect may relax the contract: each a documented fact (docs/contract.md §9)."""


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(KEYS, VALUES, max_size=6), st.booleans())
def test_dialects_never_laxer_than_the_contract(annotations: dict[str, str], bound: bool) -> None:
    p = pod(annotations, ("main", "side"), bound=bound)
    contract = audit_pod(p)
    errors = {(v.rule, v.key) for v in contract if v.is_error}
    for dialect, excused in EXCUSED.items():
        judged = apply_dialect(p, contract, dialect)
        kept = {(v.rule, v.key) for v in judged if v.is_error}
        relaxed = {v.key for v in judged if v.rule in excused}
        assert {e for e in errors if e[1] not in relaxed} <= kept, dialect

"""Lint dialects: the contract as docs/contract.md states it, and as two real consumers read it.

``gpuconf lint --dialect``:

- ``contract`` (default): the rule table (``enforcement.rules``) as the contract states it;
- ``kai``: the contract, plus KAI Scheduler admission's own refusals as errors, each worded
  "KAI admission refuses this: ..." (docs/contract.md §9.3); an empty ``gpu-fraction`` is absent to
  KAI, so it is a note there, not an error;
- ``gpu-fractioning``: the contract, with what the released node agent accepts though the contract
  discourages it (mode and devices values padded with whitespace, which fractiond trims) turned
  from errors into notes.

Every dialect rule is data (``DIALECT_RULES``) with the dialect it holds in and its source, so
the checklist lists them per dialect and docs/contract.md names them.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

from enforcement.contract import (
    CONTAINER_NAME,
    GPU_FRACTION,
    GPU_FRACTION_LIMIT,
    GPU_MEMORY,
    GPU_MEMORY_LIMIT,
    KAI_PREFIX,
    MODES,
    NVIDIA_PREFIX,
    SUFFIX_DEVICES,
    SUFFIX_LIMIT,
    SUFFIX_MODE,
    SUFFIX_PORTION_LIMIT,
    SUFFIX_REQUEST,
    WHOLE_GPU_RESOURCE,
    Violation,
)
from enforcement.quantity import canonical_quantity, parse_quantity

DIALECTS: Final = ("contract", "kai", "gpu-fractioning")
KAI_SUFFIXES: Final = (SUFFIX_REQUEST, SUFFIX_LIMIT, SUFFIX_MODE, SUFFIX_DEVICES)
"""The suffixes released KAI admission knows; any other (``.gpu-compute.portion``) is refused."""
_INT: Final = re.compile(r"[0-9]{1,9}")


@dataclass(frozen=True)
class DialectRule:
    id: str
    dialect: str
    severity: str
    statement: str
    source: str


DIALECT_RULES: Final[dict[str, DialectRule]] = {
    r.id: r
    for r in (
        DialectRule(
            "kai-whole-gpu-beside-fraction",
            "kai",
            "error",
            "A Pod MUST NOT ask for a fraction beside a whole `nvidia.com/gpu` resource.",
            "KAI admission (docs/contract.md §9.3)",
        ),
        DialectRule(
            "kai-one-container",
            "kai",
            "error",
            "At most one container MAY carry `nvidia.com/container.*` keys (a mode or devices key counts).",
            "KAI admission (docs/contract.md §9.3)",
        ),
        DialectRule(
            "kai-container-name",
            "kai",
            "error",
            "`gpu-fraction-container-name` MUST name the container the `nvidia.com/container.*` keys name.",
            "KAI admission (docs/contract.md §9.3)",
        ),
        DialectRule(
            "kai-user-devices",
            "kai",
            "error",
            "An author MUST NOT write `gpus.devices` (only KAI's binder does).",
            "KAI admission (docs/contract.md §9.3)",
        ),
        DialectRule(
            "kai-unknown-suffix",
            "kai",
            "error",
            "A `nvidia.com/container.<c>.` key MUST use a suffix KAI knows: `gpu-memory.request`, "
            "`gpu-memory.limit`, `gpu-compute.mode`, `gpus.devices` (so no `gpu-compute.portion`).",
            "KAI admission (docs/contract.md §9.3)",
        ),
        DialectRule(
            "kai-request-above-limit",
            "kai",
            "error",
            "A request MUST NOT exceed its limit.",
            "KAI admission (docs/contract.md §9.3)",
        ),
        DialectRule(
            "kai-fraction-range",
            "kai",
            "error",
            "A non-empty `gpu-fraction` MUST lie in (0, 1); an empty one counts as absent.",
            "KAI admission (docs/contract.md §9.3)",
        ),
        DialectRule(
            "kai-legacy-string-match",
            "kai",
            "error",
            "A legacy value next to the key KAI copies it to MUST equal that key as a string after KAI "
            "canonicalises it (`gpu-memory: 4096` becomes `4Gi`, so a request of `4096Mi` is refused; "
            "`gpu-memory.limit: 4Gi` beside a limit of `4096Mi`, and `gpu-fraction.limit: 0.8` beside a "
            "portion limit of `0.80`, too).",
            "KAI admission, mutating step (docs/contract.md §9.3)",
        ),
        DialectRule(
            "kai-empty-fraction",
            "kai",
            "note",
            "An empty `gpu-fraction` is absent to KAI (the contract calls it malformed).",
            "KAI admission (docs/contract.md §9.3)",
        ),
        DialectRule(
            "fractiond-trims",
            "gpu-fractioning",
            "note",
            "The released node agent trims surrounding whitespace from mode and devices values; the "
            "contract calls a padded value malformed.",
            "fractiond's parser (docs/contract.md §9.2)",
        ),
    )
}


def _v(pod: Mapping[str, Any], rule: str, container: str, key: str, message: str, fix: str) -> Violation:
    meta = pod.get("metadata") or {}
    severity = DIALECT_RULES[rule].severity
    prefix = (
        "KAI admission refuses this: " if DIALECT_RULES[rule].dialect == "kai" and severity == "error" else ""
    )
    return Violation(
        kind=str(pod.get("kind") or "Pod"),
        namespace=str(meta.get("namespace") or ""),
        name=str(meta.get("name") or ""),
        container=container,
        key=key,
        rule=rule,
        severity=severity,  # type: ignore[arg-type]
        message=prefix + message,
        fix=fix,
    )


def canonical_mib(mib: int) -> str:
    """``mib`` MiB as Kubernetes writes a binary quantity canonically (``4096`` -> ``4Gi``)."""
    value, unit = mib, "Mi"
    for bigger in ("Gi", "Ti", "Pi", "Ei"):
        if value % 1024:
            break
        value, unit = value // 1024, bigger
    return f"{value}{unit}"


def canonical_float(text: str) -> str:
    """A number as its shortest decimal (``0.80`` -> ``0.8``), as KAI formats it."""
    number = float(text)
    return repr(number) if not number.is_integer() else str(int(number))


def kai_findings(pod: Mapping[str, Any]) -> list[Violation]:
    """KAI admission's refusals of one Pod (or template), worded as KAI's."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    annotations = {str(k): str(v) for k, v in (meta.get("annotations") or {}).items()}
    containers = [str(c.get("name")) for c in spec.get("containers") or []]
    keyed: dict[str, list[str]] = {}
    for key in annotations:
        if key.startswith(NVIDIA_PREFIX):
            rest = key[len(NVIDIA_PREFIX) :]
            name = next(
                (c for c in sorted(containers, key=len, reverse=True) if rest.startswith(c + ".")), ""
            )
            name = name or rest.split(".", 1)[0]
            keyed.setdefault(name, []).append(key)
    out: list[Violation] = []
    fraction = annotations.get(GPU_FRACTION, "").strip()
    asks = (
        bool(fraction)
        or bool(annotations.get(GPU_MEMORY))
        or any(k.endswith((SUFFIX_REQUEST, SUFFIX_LIMIT)) for ks in keyed.values() for k in ks)
    )
    whole = [
        str(c.get("name"))
        for c in spec.get("containers") or []
        if WHOLE_GPU_RESOURCE in ((c.get("resources") or {}).get("limits") or {})
        or WHOLE_GPU_RESOURCE in ((c.get("resources") or {}).get("requests") or {})
    ]
    if asks and whole:
        out.append(
            _v(
                pod,
                "kai-whole-gpu-beside-fraction",
                whole[0],
                WHOLE_GPU_RESOURCE,
                f"a fraction beside {WHOLE_GPU_RESOURCE} on container {whole[0]!r}",
                "ask for a fraction or for whole GPUs, not both",
            )
        )
    if len(keyed) > 1:
        names = ", ".join(sorted(keyed))
        out.append(
            _v(
                pod,
                "kai-one-container",
                "",
                sorted(keyed[sorted(keyed)[1]])[0],
                f"nvidia.com/container.* keys on more than one container ({names})",
                "keep the keys (mode and devices included) on one container",
            )
        )
    named = annotations.get(CONTAINER_NAME)
    if named and keyed and named not in keyed:
        out.append(
            _v(
                pod,
                "kai-container-name",
                named,
                CONTAINER_NAME,
                f"{CONTAINER_NAME} {named!r} differs from the container in the keys "
                f"({', '.join(sorted(keyed))})",
                "name the same container in both",
            )
        )
    bound = bool(spec.get("nodeName"))
    for container, keys in sorted(keyed.items()):
        for key in sorted(keys):
            suffix = key[len(NVIDIA_PREFIX) + len(container) :]
            if suffix not in KAI_SUFFIXES:
                out.append(
                    _v(
                        pod,
                        "kai-unknown-suffix",
                        container,
                        key,
                        f"unknown suffix {suffix!r}",
                        "drop the key; released KAI knows request, limit, mode and devices only",
                    )
                )
            elif suffix == SUFFIX_DEVICES and not bound:
                out.append(
                    _v(
                        pod,
                        "kai-user-devices",
                        container,
                        key,
                        "gpus.devices written by the author",
                        "drop gpus.devices; KAI's binder writes it",
                    )
                )
        request = annotations.get(f"{NVIDIA_PREFIX}{container}{SUFFIX_REQUEST}")
        limit = annotations.get(f"{NVIDIA_PREFIX}{container}{SUFFIX_LIMIT}")
        try:
            if request and limit and parse_quantity(request) > parse_quantity(limit):
                out.append(
                    _v(
                        pod,
                        "kai-request-above-limit",
                        container,
                        f"{NVIDIA_PREFIX}{container}{SUFFIX_REQUEST}",
                        f"request {request!r} exceeds limit {limit!r}",
                        "make the request at most the limit",
                    )
                )
        except ValueError:
            pass  # malformed: the contract's rules say so
        legacy = annotations.get(GPU_MEMORY)
        if legacy and request is not None and _INT.fullmatch(legacy.strip()):
            canonical = canonical_mib(int(legacy.strip()))
            if canonical != request:
                out.append(
                    _v(
                        pod,
                        "kai-legacy-string-match",
                        container,
                        GPU_MEMORY,
                        f"gpu-memory {legacy!r} becomes {canonical!r}, which differs as a string from the "
                        f"request {request!r}",
                        f"write the request as {canonical!r}, or drop one of them",
                    )
                )
        legacy_memory_limit = annotations.get(GPU_MEMORY_LIMIT)
        if legacy_memory_limit and limit is not None:
            try:
                written = canonical_quantity(legacy_memory_limit)
            except ValueError:
                written = limit  # malformed: the contract's rules say so
            if written != limit:
                out.append(
                    _v(
                        pod,
                        "kai-legacy-string-match",
                        container,
                        GPU_MEMORY_LIMIT,
                        f"gpu-memory.limit {legacy_memory_limit!r} becomes {written!r}, which differs as a "
                        f"string from the limit {limit!r}",
                        f"write the limit as {written!r}, or drop one of them",
                    )
                )
    for container in containers:
        portion_limit = annotations.get(f"{KAI_PREFIX}{container}{SUFFIX_PORTION_LIMIT}")
        legacy_limit = annotations.get(GPU_FRACTION_LIMIT)
        if portion_limit is not None and legacy_limit:
            try:
                canonical = canonical_float(legacy_limit)
            except ValueError:
                canonical = legacy_limit
            if canonical != portion_limit:
                out.append(
                    _v(
                        pod,
                        "kai-legacy-string-match",
                        container,
                        GPU_FRACTION_LIMIT,
                        f"gpu-fraction.limit {legacy_limit!r} becomes {canonical!r}, which differs as a "
                        f"string from the portion limit {portion_limit!r}",
                        f"write both as {canonical!r}",
                    )
                )
    if fraction:
        try:
            value = float(fraction)
            inside = math.isfinite(value) and 0 < value < 1
        except ValueError:
            inside = True  # not a number: the contract's fraction-value says so
        if not inside:
            out.append(
                _v(
                    pod,
                    "kai-fraction-range",
                    "",
                    GPU_FRACTION,
                    f"gpu-fraction {fraction!r} is outside (0, 1)",
                    "write a portion strictly between 0 and 1",
                )
            )
    return out


def apply_dialect(pod: Mapping[str, Any], violations: Iterable[Violation], dialect: str) -> list[Violation]:
    """The contract's ``violations`` of ``pod`` as ``dialect`` judges them."""
    found = list(violations)
    if dialect == "contract":
        return found
    if dialect == "kai":
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        out = []
        for v in found:
            if (
                v.key == GPU_FRACTION
                and v.rule == "fraction-value"
                and not str(annotations.get(GPU_FRACTION, "")).strip()
            ):
                out.append(
                    replace(
                        v,
                        rule="kai-empty-fraction",
                        severity="note",
                        message="an empty gpu-fraction is absent to KAI (the contract calls it malformed)",
                    )
                )
            else:
                out.append(v)
        return out + [k for k in kai_findings(pod) if (k.rule, k.key) not in {(v.rule, v.key) for v in out}]
    if dialect == "gpu-fractioning":
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        out = []
        for v in found:
            value = str(annotations.get(v.key, ""))
            trimmed = value.strip()
            padded = value != trimmed and trimmed
            if padded and v.rule == "mode-word" and trimmed in MODES:
                out.append(_trimmed(v, value))
            elif padded and v.rule == "devices-format" and not any(ch.isspace() for ch in trimmed):
                out.append(_trimmed(v, value))
            else:
                out.append(v)
        return out
    raise ValueError(f"dialect {dialect!r}: unknown; known: {', '.join(DIALECTS)}")


def _trimmed(v: Violation, value: str) -> Violation:
    return replace(
        v,
        rule="fractiond-trims",
        severity="note",
        message=f"{value!r}: the released node agent trims it to {value.strip()!r}; the contract calls a "
        "padded value malformed",
    )

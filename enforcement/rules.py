"""The rule table: every check the contract module can report, as data.

Why a table and not checks scattered through the parser: three consumers must agree on what
the rules are. The contract module (``enforcement.contract``) reports violations by rule id,
``gpuconf lint`` renders them, and ``gpuconf checklist`` prints the whole list for a human
to tick off. If the checklist were written by hand it would drift from what lint enforces;
generating both from this one table makes a disagreement impossible, and a change to the
contract becomes one reviewable diff here.

Each rule has a short stable id (used in JSON/JUnit output and in tests), a severity, the
*side* of the contract it belongs to, one RFC 2119 statement and a generic one-line fix.
Individual violations may carry a more specific fix; the statement is the rule itself.

Sides:

``request``
    what the workload author writes (any Pod or Pod template, bound or not; docs/contract.md §2-3);
``placement``
    what the scheduler must have written on a *bound* Pod (``spec.nodeName`` set; §2, §4);
``node``
    facts that need the Pod's Node object (its GPUs);
``gpu``
    arithmetic across every Pod sharing one physical GPU (§4).

This module imports nothing from the project so every other module may import it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final, Literal

Severity = Literal["error", "warning", "note"]
"""``note``: only from a lint dialect (``enforcement.dialects``): what a real consumer accepts though
the contract discourages it; never fails lint."""
Side = Literal["request", "placement", "node", "gpu"]

SIDES: Final[tuple[Side, ...]] = ("request", "placement", "node", "gpu")
SIDE_TITLES: Final[dict[Side, str]] = {
    "request": "Request: what the workload author writes (every Pod and Pod template)",
    "placement": "Placement: what the scheduler must write before binding (every bound Pod)",
    "node": "Node: the assigned devices exist on the Pod's node",
    "gpu": "GPU: every Pod sharing one physical GPU, taken together",
}


class ContractError(ValueError):
    """A single value broke a rule; raised by the low-level parsers only.

    The Pod-level entry points in ``enforcement.contract`` catch it and turn it into a
    ``Violation``; it never escapes them. ``rule`` is the id of the broken rule.
    """

    def __init__(self, rule: str, message: str) -> None:
        super().__init__(message)
        self.rule = rule
        self.message = message


@dataclass(frozen=True)
class Rule:
    """One check of the GPU-fraction contract."""

    id: str
    """Short, stable identifier; never renamed once released (reports and CI key on it)."""
    severity: Severity
    """``error`` fails lint; ``warning`` fails it only with ``--strict``."""
    side: Side
    """Which party's output the rule judges (see the module docstring)."""
    statement: str
    """The rule as one RFC 2119 sentence."""
    fix: str
    """A generic one-line fix; a violation may carry a more specific one."""


def _rules(*rules: Rule) -> dict[str, Rule]:
    table: dict[str, Rule] = {}
    for rule in rules:
        if rule.id in table:  # pragma: no cover - guards edits to the table below
            raise AssertionError(f"duplicate rule id {rule.id!r}")
        table[rule.id] = rule
    return table


RULES: Final[dict[str, Rule]] = _rules(
    # ----- request: values and keys, on any Pod -----
    Rule(
        "value-not-string",
        "error",
        "request",
        "Every GPU-fraction annotation value MUST be a string; the API server rejects numbers and booleans.",
        'Quote the value in YAML, e.g. `gpu-fraction: "0.5"`.',
    ),
    Rule(
        "memory-quantity",
        "error",
        "request",
        "A `gpu-memory.request` or `gpu-memory.limit` value MUST be a Kubernetes "
        "quantity without surrounding whitespace: decimal SI or binary suffix, or plain bytes; milli (`m`) "
        "is not allowed.",
        "Write the amount with a binary suffix, e.g. `4Gi` or `4096Mi`.",
    ),
    Rule(
        "memory-minimum",
        "error",
        "request",
        "A GPU memory amount MUST be at least 1 MiB; zero, negatives and bare small byte counts are "
        "malformed.",
        "Add a unit: `4096` means 4096 bytes, `4096Mi` means 4 GiB.",
    ),
    Rule(
        "memory-unit",
        "error",
        "request",
        "A `gpu-memory.limit` value MUST carry a unit (`8Gi`); a bare number is refused.",
        "Write the limit with a unit, e.g. `gpu-memory.limit: 8Gi`.",
    ),
    Rule(
        "request-exceeds-limit",
        "error",
        "request",
        "A container's GPU memory request MUST NOT exceed its GPU memory limit (compared in bytes).",
        "Raise the limit to at least the request, or lower the request.",
    ),
    Rule(
        "mode-word",
        "error",
        "request",
        "A `gpu-compute.mode` value MUST be exactly `time-slicing` or `sm-sharing` (lower case, no spaces).",
        "Write `time-slicing` or `sm-sharing`, or drop the key (`time-slicing` is the default).",
    ),
    Rule(
        "mode-disabled",
        "error",
        "request",
        "A container MUST NOT ask for `sm-sharing` on a cluster that has sm-sharing disabled.",
        "Use `time-slicing`, or enable sm-sharing in the node agent.",
    ),
    Rule(
        "mode-only",
        "warning",
        "request",
        "A `gpu-compute.mode` key SHOULD accompany a `gpu-memory.request` or `gpu-memory.limit` on the same "
        "container; on its own it does nothing.",
        "Add the container's `gpu-memory.request` (or a `gpu-fraction`), or drop the mode key.",
    ),
    Rule(
        "unknown-container",
        "error",
        "request",
        "Every container-scoped key and `gpu-fraction-container-name` MUST name a container of the Pod; "
        "the node agent ignores keys for other names and the workload runs unfenced.",
        "Use the container name exactly as written in `spec.containers[].name`.",
    ),
    Rule(
        "unknown-suffix",
        "error",
        "request",
        "A `nvidia.com/container.<c>.<suffix>` key MUST use one of the suffixes `gpu-memory.request`, "
        "`gpu-memory.limit`, `gpu-compute.mode`, `gpus.devices` or `gpu-compute.portion`.",
        "Fix the spelling of the suffix (for example `gpu-memory.limit`, not `gpu-memory.limits`).",
    ),
    Rule(
        "multiple-fractional-containers",
        "error",
        "request",
        "At most one container of a Pod MAY carry a fractional GPU request.",
        "Move the GPU work into one container and keep the fraction keys on that container only.",
    ),
    Rule(
        "container-mismatch",
        "error",
        "request",
        "`gpu-fraction-container-name`, the `nvidia.com/container.<c>` keys and the "
        "`kai.scheduler/container.<c>` portion limit MUST all name the same container.",
        "Make every container-scoped key and `gpu-fraction-container-name` name the same container.",
    ),
    Rule(
        "fraction-value",
        "error",
        "request",
        "A `gpu-fraction` value MUST be a decimal number strictly between 0 and 1.",
        'Write the portion of one GPU, e.g. `gpu-fraction: "0.5"`.',
    ),
    Rule(
        "fraction-limit-value",
        "error",
        "request",
        "A `gpu-fraction.limit` or `gpu-memory.portion.limit` value MUST be a number with at most 5 "
        "decimals, greater than `gpu-fraction` and smaller than 1.",
        'Write a portion between `gpu-fraction` and 1, e.g. `gpu-fraction.limit: "0.8"`.',
    ),
    Rule(
        "limit-without-request",
        "error",
        "request",
        "`gpu-fraction.limit` and `gpu-memory.portion.limit` MUST be used only with `gpu-fraction`, and "
        "`gpu-memory.limit` only with `gpu-memory`.",
        "Add the matching request annotation, or remove the limit.",
    ),
    Rule(
        "gpu-memory-value",
        "error",
        "request",
        "A `gpu-memory` value MUST be a whole number of MiB greater than 0, without a unit.",
        'Write whole MiB, e.g. `gpu-memory: "4096"`.',
    ),
    Rule(
        "num-devices-value",
        "error",
        "request",
        "`gpu-fraction-num-devices` MUST be an integer of at least 1 and MUST accompany a fractional "
        "request.",
        'Write the number of GPUs, e.g. `gpu-fraction-num-devices: "2"`, next to `gpu-fraction` or '
        "`gpu-memory`.",
    ),
    Rule(
        "dialect-conflict",
        "error",
        "request",
        "A Pod MUST NOT combine `gpu-fraction` with `gpu-memory`, MUST NOT combine an author-written "
        "`nvidia.com` limit with `gpu-fraction` or `gpu-memory`, and a `gpu-memory` next to an `nvidia.com` "
        "request MUST equal it.",
        "Request the memory in one dialect only.",
    ),
    Rule(
        "whole-gpu-conflict",
        "error",
        "request",
        "A Pod with a fractional GPU request MUST NOT also request whole GPUs (`nvidia.com/gpu`).",
        "Remove the `nvidia.com/gpu` resource, or drop the fraction annotations.",
    ),
    Rule(
        "devices-set-by-author",
        "error",
        "request",
        "An unbound Pod MUST NOT carry `nvidia.com/container.<c>.gpus.devices`; only the scheduler "
        "writes it.",
        "Remove the `gpus.devices` annotation; the scheduler chooses the GPUs.",
    ),
    Rule(
        "portion-set-by-author",
        "error",
        "request",
        "An unbound Pod MUST NOT carry `nvidia.com/container.<c>.gpu-compute.portion`; only the scheduler "
        "writes it.",
        "Remove the `gpu-compute.portion` annotation; the scheduler derives it.",
    ),
    # ----- placement: what the scheduler wrote on a bound Pod -----
    Rule(
        "memory-missing",
        "error",
        "placement",
        "On a bound Pod, the container that asked for a fraction MUST carry `gpu-memory.request` or "
        "`gpu-memory.limit`, written by the scheduler before binding.",
        "The scheduler must write `nvidia.com/container.<c>.gpu-memory.request` before binding.",
    ),
    Rule(
        "devices-missing",
        "error",
        "placement",
        "On a bound Pod, every fractional container MUST carry `gpus.devices`; without it the node agent "
        "applies no per-device limit and the workload runs unfenced.",
        "The scheduler must write `nvidia.com/container.<c>.gpus.devices` before binding.",
    ),
    Rule(
        "devices-format",
        "error",
        "placement",
        "`gpus.devices` MUST be a comma-separated list, without spaces or empty entries, of distinct GPU "
        "UUIDs, indices or CDI device names.",
        "Write e.g. `GPU-8f6c...,GPU-1a2b...` or `0,1` (no spaces, no duplicates, never `all`).",
    ),
    Rule(
        "devices-count",
        "error",
        "placement",
        "The number of devices in `gpus.devices` MUST equal `gpu-fraction-num-devices` (default 1).",
        "The scheduler must assign exactly `gpu-fraction-num-devices` distinct GPUs.",
    ),
    Rule(
        "limit-missing",
        "warning",
        "placement",
        "A bound fractional container SHOULD carry `gpu-memory.limit` next to its request and devices; "
        "when absent the limit equals the request.",
        "Write `nvidia.com/container.<c>.gpu-memory.limit` (equal to the request when no burst is wanted).",
    ),
    Rule(
        "portion-value",
        "error",
        "placement",
        "A `gpu-compute.portion` value MUST be a decimal number greater than 0 and at most 1.",
        'Write the compute share as a number in (0, 1], e.g. `"0.5"`.',
    ),
    # ----- node: the devices against the node's GPU record -----
    Rule(
        "devices-unknown",
        "error",
        "node",
        "Every device in `gpus.devices` MUST exist on the Pod's node (by UUID, or by index below the "
        "node's GPU count).",
        "Assign GPUs the node has (see its `gpuconf.io/gpu-uuids` annotation or `nvidia.com/gpu.count`).",
    ),
    # ----- gpu: all Pods on one physical GPU -----
    Rule(
        "mode-mixing",
        "error",
        "gpu",
        "A GPU MUST NOT hold `time-slicing` and `sm-sharing` containers at the same time.",
        "Place time-slicing and sm-sharing workloads on different GPUs.",
    ),
    Rule(
        "gpu-overcommit",
        "error",
        "gpu",
        "The sum of the guaranteed memory requests on a GPU MUST NOT exceed its usable memory.",
        "Move a workload to another GPU, or lower the requests.",
    ),
)


def rules_by_side() -> Iterator[tuple[Side, list[Rule]]]:
    """The rules grouped by side, in table order (the order the checklist prints)."""
    for side in SIDES:
        yield side, [r for r in RULES.values() if r.side == side]


@dataclass(frozen=True)
class AnnotationKey:
    """One annotation of the contract, as the checklist lists it."""

    key: str
    writer: str
    value: str
    default: str


# The keys of docs/contract.md §2-3, in the order a reader meets them. ``<c>`` is the container name.
ANNOTATION_KEYS: Final[tuple[AnnotationKey, ...]] = (
    AnnotationKey(
        "nvidia.com/container.<c>.gpu-memory.request",
        "scheduler (or author)",
        "quantity, >= 1 MiB, rounded up to whole MiB; per assigned device",
        "the limit",
    ),
    AnnotationKey(
        "nvidia.com/container.<c>.gpu-memory.limit",
        "scheduler (or author)",
        "quantity, >= request; per assigned device",
        "the request",
    ),
    AnnotationKey(
        "nvidia.com/container.<c>.gpu-compute.mode",
        "scheduler (or author)",
        "time-slicing | sm-sharing",
        "time-slicing",
    ),
    AnnotationKey(
        "nvidia.com/container.<c>.gpus.devices",
        "scheduler only",
        "comma-separated GPU UUIDs, indices or CDI names, no spaces",
        "none: the workload is unfenced",
    ),
    AnnotationKey(
        "nvidia.com/container.<c>.gpu-compute.portion",
        "scheduler only",
        "number in (0, 1]; sm-sharing active-thread share",
        "no compute cap",
    ),
    AnnotationKey("gpu-fraction", "author", "number, 0 < x < 1: portion of one GPU's memory", "-"),
    AnnotationKey("gpu-fraction.limit", "author", "number, gpu-fraction < x < 1, at most 5 decimals", "-"),
    AnnotationKey(
        "kai.scheduler/container.<c>.gpu-memory.portion.limit",
        "author",
        "as gpu-fraction.limit, for container <c>",
        "-",
    ),
    AnnotationKey("gpu-memory", "author", "whole MiB > 0, no unit", "-"),
    AnnotationKey("gpu-memory.limit", "author", "quantity with a unit, >= gpu-memory", "-"),
    AnnotationKey(
        "gpu-fraction-num-devices", "author", "integer >= 1; the request applies to each device", "1"
    ),
    AnnotationKey(
        "gpu-fraction-container-name",
        "author",
        "name of the fractional container",
        "the container named in the nvidia.com keys, else the first container",
    ),
)

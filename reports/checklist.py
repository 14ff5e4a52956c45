"""The annotation checklist with this run's verdict per item.

The rows are the contract's rule table (``enforcement.rules.RULES``, the same one ``gpuconf lint``
enforces and ``gpuconf checklist`` prints). Which checks judge a rule comes from the result
(``CheckResult.rules``, declared with the check) or, when a result names none, from the table
below. A rule is:

- ``failed`` only when a failed check's finding names it (``[rule-id, ...]``, as the contract module
  writes it): a check that failed on something else says nothing of the rule's other items (a
  scheduler that writes no annotations breaks ``memory-missing``, not the author-side rules);
- ``passed`` when a check that judges it passed;
- ``error`` / ``skipped`` when its checks could not be judged or were skipped;
- ``not judged`` when no check of this run judges it (lint covers it on manifests), or its only
  checks failed on another rule first.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from enforcement.rules import SIDE_TITLES, Rule, rules_by_side
from reports.model import CheckResult, RunRecord

DEFAULT_RULES: Final[Mapping[str, tuple[str, ...]]] = {
    "annotations-at-bind": (
        "memory-missing",
        "devices-missing",
        "devices-format",
        "memory-quantity",
        "memory-unit",
        "memory-minimum",
        "request-exceeds-limit",
        "mode-word",
        "portion-value",
    ),
    "annotations-name-the-container": (
        "unknown-container",
        "container-mismatch",
        "multiple-fractional-containers",
    ),
    "limit-and-mode-at-bind": ("limit-missing",),
    "memory-fit": ("gpu-overcommit",),
    "release-on-completion": ("gpu-overcommit",),
    "multi-device": ("devices-count",),
    "devices-scheduler-owned": ("devices-set-by-author", "devices-unknown"),
    "mode-separation": ("mode-mixing",),
    "modes-side-by-side": ("mode-mixing",),
    "mode-guard": ("mode-mixing",),
    "fail-closed": ("memory-minimum",),
}
"""Which contract rules each check of gpuconf's catalog judges, for results that do not say."""


def rules_of(result: CheckResult) -> tuple[str, ...]:
    return tuple(result.rules) or DEFAULT_RULES.get(result.id, ())


def _text(result: CheckResult) -> str:
    problems = [
        str(p)
        for pod in (result.evidence.get("pods") or {}).values()
        for p in (pod.get("problemsAtBind") or [])
    ]
    return "\n".join([result.reason, result.detail, *problems])


def _names(result: CheckResult, rule: str) -> bool:
    text = _text(result)
    return f"[{rule}," in text or f"[{rule}]" in text


@dataclass
class Item:
    rule: Rule
    status: str
    checks: list[CheckResult] = field(default_factory=list)
    failing: list[CheckResult] = field(default_factory=list)


def checklist(record: RunRecord) -> list[tuple[str, list[Item]]]:
    """(side title, items) in the checklist's order."""
    out = []
    for side, rules in rules_by_side():
        items = []
        for rule in rules:
            judging = [r for r in record.results if rule.id in rules_of(r)]
            failing = [r for r in record.results if r.outcome == "failed" and _names(r, rule.id)]
            outcomes = {r.outcome for r in judging}
            if failing:
                status = "failed"
            elif "passed" in outcomes:
                status = "passed"
            elif "error" in outcomes:
                status = "error"
            elif "skipped" in outcomes:
                status = "skipped"
            else:  # none, or only checks that failed on another rule and stopped there
                status = "not judged"
            items.append(Item(rule, status, judging, failing))
        out.append((SIDE_TITLES[side], items))
    return out


def counts(items: list[tuple[str, list[Item]]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for _title, rows in items:
        for item in rows:
            out[item.status] = out.get(item.status, 0) + 1
    return out

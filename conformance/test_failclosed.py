"""Fail closed: a container whose placement annotations are malformed does not start, and says why.

docs/contract.md §2, parsing rules: a malformed value is not trimmed or guessed; by default the node
agent fails *closed* (the container is not created) and names the key and the rule, in the
container's waiting state or an Event. A node that starts the container anyway runs it unfenced:
whatever the annotations meant to limit is not limited.

Only the ``node`` profile: malformed placement annotations are what a broken scheduler writes, and
a correct one never does, so through a scheduler the scenario cannot be set up.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Final

from enforcement.contract import SUFFIX_DEVICES, SUFFIX_LIMIT, SUFFIX_MODE, SUFFIX_REQUEST, nvidia_key
from fixtures.suite.checks import Needs, check
from fixtures.suite.frame import Suite, fail
from fixtures.suite.manifests import placement_annotations
from fixtures.suite.scenario import CONTAINER, Stage, plan
from fixtures.suite.waiting import WaitTimeout, wait_until

EXPLAIN_S: Final = 15.0
"""How long the node has to say why it refuses (the reference agent: well under a second)."""
QUIET_S: Final = 1.0
"""After the refusal shows, how long the container must still not start."""


@dataclass(frozen=True)
class Malformed:
    name: str
    key: str
    value: str
    rule: str
    words: tuple[str, ...]
    """Any of these (the rule id among them) in the explanation names the rule."""


def cases(stage: Stage) -> tuple[Malformed, ...]:
    beyond = str(stage.node.gpu_count + 7)
    return (
        Malformed(
            "not-a-quantity",
            nvidia_key(CONTAINER, SUFFIX_REQUEST),
            "lots",
            "memory-quantity",
            ("memory-quantity", "quantity"),
        ),
        Malformed(
            "request-above-limit",
            nvidia_key(CONTAINER, SUFFIX_REQUEST),
            "2048Mi",
            "request-exceeds-limit",
            ("request-exceeds-limit", "exceed", "greater than", "above", "larger than"),
        ),
        Malformed(
            "unknown-mode",
            nvidia_key(CONTAINER, SUFFIX_MODE),
            "SM-Sharing",
            "mode-word",
            ("mode-word", "time-slicing", "sm-sharing", "mode"),
        ),
        Malformed(
            "unknown-device",
            nvidia_key(CONTAINER, SUFFIX_DEVICES),
            beyond,
            "devices-unknown",
            ("devices-unknown", "not a gpu", "unknown", "not found", "no gpu", "does not exist"),
        ),
    )


def placement(stage: Stage, case: Malformed) -> dict[str, str]:
    annotations = placement_annotations(CONTAINER, 1024, 1024, stage.free[:1])
    annotations[case.key] = case.value
    if case.rule == "request-exceeds-limit":
        annotations[nvidia_key(CONTAINER, SUFFIX_LIMIT)] = "1024Mi"
    return annotations


def explanations(suite: Suite, name: str) -> list[str]:
    """What the Pod says about its container: the waiting state's message, and Warning Events."""
    pod = suite.pod(name) or {}
    out = []
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("message"):
            out.append(f"{waiting.get('reason')}: {waiting['message']}")
    for event in suite.events(name):
        if event.get("type") == "Warning":
            out.append(f"{event.get('reason')}: {event.get('message') or ''}")
    return out


def _names(case: Malformed, text: str) -> tuple[bool, bool]:
    low = text.lower()
    return case.key in text, any(w in low for w in case.words)


@check(
    id="fail-closed",
    level="MUST",
    statement="A container placed with malformed placement annotations MUST NOT start where the "
    "implementation makes the node agent the one to refuse that case, and its status or Events MUST name "
    "the annotation key and the rule it breaks where the implementation claims its refusals do.",
    profiles=("node", "probe"),
    seed="000/4",
    needs=Needs(nodes=1, gpus=1, idle=True),
)
def test_fail_closed(suite: Suite) -> None:
    part = suite.options.node_part()
    stage = Stage(suite)
    never = plan("never", {"op": "hold", "seconds": 60})
    chosen = []
    for case in cases(stage):
        party = part.who_refuses(case.name)
        if party == "node":
            chosen.append(case)
        else:
            suite.not_judged(case.name, refused_elsewhere(part.implementation, party))
    names_key = part.refusal_names_key
    if not names_key:
        suite.not_judged(
            "refusal names key and rule", f"{part.implementation} does not claim its refusals name the key"
        )
    if not chosen:
        return
    for case in chosen:
        stage.pod(case.name, never, request_mib=1024, annotations=placement(stage, case))
    problems: list[str] = []
    seen: dict[str, Any] = {}
    for case in chosen:
        problem, said = _judge(suite, stage, case, names_key)
        seen[case.name] = {"key": case.key, "value": case.value, "rule": case.rule, "said": said[-3:]}
        if problem:
            problems.append(problem)
    time.sleep(suite.timeout(QUIET_S))
    for case in chosen:
        if stage.ran(case.name) and not any(case.name in p for p in problems):
            problems.append(f"{case.name} ({case.key}: {case.value!r}) started later, unfenced")
    suite.evidence.fact("malformed", seen)
    if problems:
        raise fail("; ".join(problems))


def refused_elsewhere(implementation: str, party: str) -> str:
    """Why a malformed case is not the node agent's to refuse in ``implementation``."""
    return {
        "admission": f"in {implementation} the admission refuses it, not the node agent (which does not "
        "check it); judged where the admission is under test (gpuconf lint --dialect kai)",
        "runtime": f"in {implementation} the node agent does not validate devices; their format is the "
        "NVIDIA container runtime's business",
        "scheduler": f"in {implementation} the scheduler must never write it (the scheduler profile)",
        "nobody": f"{implementation} refuses it nowhere",
    }.get(party, f"in {implementation} the {party} refuses it")


def _judge(suite: Suite, stage: Stage, case: Malformed, names_key: bool = True) -> tuple[str, list[str]]:
    def explained() -> list[str] | None:
        if stage.ran(case.name):
            return ["(the container started)"]
        said = explanations(suite, case.name)
        if not names_key:
            return said if said or _refused(suite, case.name) else None
        return said if any(all(_names(case, s)) for s in said) else None

    try:
        said = wait_until(explained, f"{case.name} to be refused with a reason", suite.timeout(EXPLAIN_S))
    except WaitTimeout:
        said = explanations(suite, case.name)
        if stage.ran(case.name):
            return f"{case.name} ({case.key}: {case.value!r} [{case.rule}]) started, unfenced", said
        if not names_key:
            return "", said  # it did not start, which is all that is claimed
        named = [_names(case, s) for s in said]
        if any(k for k, _ in named):
            return (
                f"{case.name} was refused naming {case.key}, but not the rule {case.rule}: {said[-1]}",
                said,
            )
        return (
            f"{case.name} ({case.key}: {case.value!r} [{case.rule}]) did not start, but nothing in its "
            f"status or Events names the key{': ' + said[-1] if said else ''}",
            said,
        )
    if stage.ran(case.name):
        return f"{case.name} ({case.key}: {case.value!r} [{case.rule}]) started, unfenced", said
    return "", said


def _refused(suite: Suite, name: str) -> bool:
    """Whether the Pod's container is held in a waiting state (refused), whatever the message says."""
    pod = suite.pod(name) or {}
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if ((cs.get("state") or {}).get("waiting") or {}).get("reason"):
            return True
    return False

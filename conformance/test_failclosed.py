"""Fail closed: a container whose placement annotations are malformed does not start, and says why.

docs/contract.md §2, parsing rules: a malformed value is not trimmed or guessed; by default the node
agent fails *closed* (the container is not created) and names the key and the rule, in the
container's waiting state or an Event. A node that starts the container anyway runs it unfenced:
whatever the annotations meant to limit is not limited.

A present but blank ``gpu-compute.mode`` (empty, or whitespace only) is malformed too (``mode-word``);
an older operator version took it as the default. Where the implementation's description says so
(``node.validation.blankMode: default``) those cases are judged by their effect instead: the
container starts and runs time-slicing.

Only the ``node`` profile: malformed placement annotations are what a broken scheduler writes, and
a correct one never does, so through a scheduler the scenario cannot be set up.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from enforcement.contract import (
    SUFFIX_DEVICES,
    SUFFIX_LIMIT,
    SUFFIX_MODE,
    SUFFIX_REQUEST,
    TIME_SLICING,
    nvidia_key,
)
from enforcement.implementations import BLANK_MODE_CASES, NodePart
from fixtures.suite.checks import Needs, check
from fixtures.suite.frame import Suite, fail
from fixtures.suite.manifests import placement_annotations
from fixtures.suite.scenario import CONTAINER, Outcome, Stage, plan
from fixtures.suite.waiting import WaitTimeout, wait_until
from workloads.plan import hold, meminfo, read_env

EXPLAIN_S: Final = 15.0
"""How long the node has to say why it refuses (the reference agent: well under a second). One wait
for every case together: their Pods are created at once, so a node that never explains costs this
once, not once per case."""
QUIET_S: Final = 1.0
"""After the refusal shows, how long the container must still not start."""


@dataclass(frozen=True)
class Malformed:
    name: str
    key: str
    value: str | None
    """The malformed value written under ``key``; None: the key is left out."""
    rule: str
    words: tuple[str, ...]
    """Any of these (the rule id among them) in the explanation names the rule."""

    @property
    def shown(self) -> str:
        return "(absent)" if self.value is None else repr(self.value)

    @property
    def blank_mode(self) -> bool:
        """A present but blank mode: ``node.validation.blankMode`` says what the node does with it."""
        return self.name in BLANK_MODE_CASES


MINIMUM_WORDS: Final = ("memory-minimum", "minimum", "at least", "below", "too small")
BLANK_MODE_WORDS: Final = ("mode-word", "time-slicing", "sm-sharing", "empty", "blank")


def cases(gpu_count: int) -> tuple[Malformed, ...]:
    """docs/contract.md §2, parsing rules: each malformed form once, on the request (memory) or the key
    the form belongs to, for a node of ``gpu_count`` GPUs. ``enforcement.implementations.MALFORMED_CASES``
    lists the same names; ``gpuconf probe``'s fail-closed judges the same cases."""
    beyond = str(gpu_count + 7)
    request = nvidia_key(CONTAINER, SUFFIX_REQUEST)
    quantity = ("memory-quantity", "quantity")
    return (
        Malformed("not-a-quantity", request, "lots", "memory-quantity", quantity),
        Malformed("empty-value", request, "", "memory-quantity", (*quantity, "empty", "blank")),
        Malformed("whitespace-only", request, " ", "memory-quantity", (*quantity, "whitespace", "blank")),
        Malformed("zero", request, "0", "memory-minimum", (*MINIMUM_WORDS, "zero")),
        Malformed("negative", request, "-1Gi", "memory-minimum", (*MINIMUM_WORDS, "negative")),
        # A bare number is bytes: 4096 is four kilobytes, not 4096 MiB.
        Malformed("bare-number", request, "4096", "memory-minimum", (*MINIMUM_WORDS, "unit", "bytes")),
        # 100m is a tenth of a byte: gpuconf calls the milli suffix malformed (memory-quantity), the
        # real agent's reading is the minimum; either rule names what is wrong.
        Malformed("milli-unit", request, "100m", "memory-quantity", (*quantity, "milli", *MINIMUM_WORDS)),
        Malformed(
            "request-above-limit",
            request,
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
        # A blank mode is not the default: an empty or blank value is malformed, not "absent". The
        # key holds "mode" itself, so only the rule's own words name the rule here.
        Malformed("blank-mode", nvidia_key(CONTAINER, SUFFIX_MODE), "", "mode-word", BLANK_MODE_WORDS),
        Malformed(
            "blank-mode-whitespace",
            nvidia_key(CONTAINER, SUFFIX_MODE),
            " ",
            "mode-word",
            (*BLANK_MODE_WORDS, "whitespace"),
        ),
        Malformed(
            "unknown-device",
            nvidia_key(CONTAINER, SUFFIX_DEVICES),
            beyond,
            "devices-unknown",
            ("devices-unknown", "not a gpu", "unknown", "not found", "no gpu", "does not exist"),
        ),
        # On a bound Pod memory without devices fences nothing (the agent has no device to limit).
        Malformed(
            "memory-without-devices",
            nvidia_key(CONTAINER, SUFFIX_DEVICES),
            None,
            "devices-missing",
            ("devices-missing", "missing", "no gpus.devices", "no devices", "without devices"),
        ),
    )


def placement(valid: Mapping[str, str], case: Malformed) -> dict[str, str]:
    """``valid`` (a correct placement of request = limit on one GPU) broken as ``case`` says."""
    annotations = dict(valid)
    if case.value is None:
        annotations.pop(case.key, None)
    else:
        annotations[case.key] = case.value
    if case.rule == "request-exceeds-limit":
        annotations[nvidia_key(CONTAINER, SUFFIX_LIMIT)] = "1024Mi"
    return annotations


def explanations(pod: Mapping[str, Any] | None, events: Iterable[Mapping[str, Any]]) -> list[str]:
    """What a Pod says about its container: its waiting state, and its Warning Events."""
    out = []
    for cs in ((pod or {}).get("status") or {}).get("containerStatuses") or []:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        # A waiting reason without a message is still a refusal (the container is held), if a mute one.
        if waiting.get("message") or waiting.get("reason"):
            out.append(f"{waiting.get('reason')}: {waiting.get('message') or ''}")
    for event in events:
        if event.get("type") == "Warning":
            out.append(f"{event.get('reason')}: {event.get('message') or ''}")
    return out


def refusal_names(text: str, key: str, value: str | None, words: Sequence[str]) -> tuple[bool, bool]:
    """Whether ``text`` names ``key``, and any of ``words`` (the rule), outside echoes of ``value``.

    A refusal that only quotes the value back ("'SM-Sharing' refused") says nothing of what is wrong
    with it, yet the value may contain a rule's word (sm-sharing) or a key's: an occurrence that lies
    wholly inside an echo of the value is not counted. Case-insensitive. A value without a visible
    character (empty, blanks) echoes nothing.
    """
    low = text.lower()
    echo = (value or "").lower()
    echoes = _spans(low, echo) if echo.strip() else []

    def named(needle: str) -> bool:
        needle = needle.lower()
        return any(
            not any(a <= start and start + len(needle) <= b for a, b in echoes)
            for start, _ in _spans(low, needle)
        )

    return named(key), any(named(w) for w in words)


def _spans(text: str, needle: str) -> list[tuple[int, int]]:
    """Every occurrence of ``needle`` in ``text`` (overlapping ones too), as [start, end)."""
    out = []
    at = text.find(needle)
    while needle and at >= 0:
        out.append((at, at + len(needle)))
        at = text.find(needle, at + 1)
    return out


@check(
    id="fail-closed",
    level="MUST",
    statement="A container placed with malformed placement annotations MUST NOT start where the "
    "implementation makes the node agent the one to refuse that case, and its status or Events MUST name "
    "the annotation key and the rule it breaks where the implementation claims its refusals do; a blank "
    "gpu-compute.mode is malformed, unless the implementation takes it as the default: then the container "
    "MUST run time-slicing.",
    profiles=("node", "probe"),
    seed="000/4",
    needs=Needs(nodes=1, gpus=1, idle=True),
)
def test_fail_closed(suite: Suite) -> None:
    part = suite.options.node_part()
    stage = Stage(suite)
    never = plan("never", hold(seconds=60))
    chosen: list[Malformed] = []
    defaulted: list[Malformed] = []
    for case in cases(stage.node.gpu_count):
        party = part.who_refuses(case.name)
        if party != "node":
            suite.not_judged(case.name, refused_elsewhere(part.implementation, party))
        elif case.blank_mode and part.blank_mode == "default":
            defaulted.append(case)
        else:
            chosen.append(case)
    names_key = part.refusal_names_key
    if not names_key and chosen:
        suite.not_judged(
            "refusal names key and rule", f"{part.implementation} does not claim its refusals name the key"
        )
    if not chosen and not defaulted:
        return
    # Every case's Pod at once, and one wait for all: the cases are independent, and the node
    # decides each in well under a second.
    valid = placement_annotations(CONTAINER, 1024, 1024, stage.free[:1])
    for case in chosen:
        stage.pod(case.name, never, request_mib=1024, annotations=placement(valid, case))
    # Taken as the default: it starts, says which MPS server it reached, and ends.
    looks = plan("blank-mode", read_env(*[part.env.pipe_directory]), meminfo())
    for case in defaulted:
        stage.pod(case.name, looks, request_mib=1024, annotations=placement(valid, case))
    said: dict[str, list[str]] = {}
    everyone = [c.name for c in (*chosen, *defaulted)]

    def settled() -> bool:
        said.update(_said(suite, everyone))
        refused = all(_verdict(stage, c, said[c.name], names_key, final=False) is not None for c in chosen)
        return refused and all(stage.ran(c.name) or said[c.name] for c in defaulted)

    try:
        wait_until(settled, "every malformed container to be refused with a reason", suite.timeout(EXPLAIN_S))
    except WaitTimeout:
        pass  # the verdicts below say which case did not settle, and how
    time.sleep(suite.timeout(QUIET_S))
    said.update(_said(suite, everyone))
    problems: list[str] = []
    seen: dict[str, Any] = {}
    for case in chosen:
        problem = _verdict(stage, case, said[case.name], names_key, final=True) or ""
        seen[case.name] = {
            "key": case.key,
            "value": case.shown,
            "rule": case.rule,
            "started": stage.ran(case.name),
            "said": said[case.name][-3:],
        }
        if problem:
            problems.append(problem)
    for case in defaulted:
        ran = stage.ran(case.name)
        out = stage.wait_ended(case.name) if ran else None
        judged = default_verdict(case, part, out)
        seen[case.name] = {
            "key": case.key,
            "value": case.shown,
            "blankMode": part.blank_mode,
            "started": ran,
            "status": out.status if out is not None else None,
            "deviceMode": (out.result or {}).get("mode") if out is not None else None,
            "pipeDirectory": _pipe(out, part),
            "said": said[case.name][-3:],
            "judged": judged.as_fact(),
        }
        if judged.not_judged:
            suite.not_judged(f"{case.name}'s compute mode", judged.not_judged)
        if judged.problem:
            problems.append(judged.problem)
    suite.evidence.fact("malformed", seen)
    if problems:
        raise fail("; ".join(problems))


@dataclass(frozen=True)
class DefaultVerdict:
    """How a blank mode taken as the default was judged: a problem (empty: none), and what was not."""

    problem: str = ""
    not_judged: str = ""
    how: str = ""
    """What the judgement rested on: the device's mode, the MPS pipe directory, or a refusal."""

    def as_fact(self) -> dict[str, Any]:
        return {"problem": self.problem, "notJudged": self.not_judged, "how": self.how}


def _pipe(out: Outcome | None, part: NodePart) -> str | None:
    if out is None:
        return None
    return (out.step("env").get("env") or {}).get(part.env.pipe_directory)


def default_verdict(case: Malformed, part: NodePart, out: Outcome | None) -> DefaultVerdict:
    """The judgement of a blank-mode case where ``part`` takes a blank mode as the default
    (``blankMode: default``): it runs time-slicing, by the mode the device reports to the workload,
    else by the MPS pipe directory the dialect names for time-slicing, else not judged (the fact
    named). ``out``: how its container ended; None: it never started. A refusal is no failure: a
    blank mode is malformed (docs/contract.md §2), so refusing it is what the contract asks for."""
    declared = f"{part.implementation} declares node.validation.blankMode: default"
    what = f"{case.name} ({case.key}: {case.shown})"
    if out is None:
        return DefaultVerdict(how=f"refused: stricter than {declared}, as the contract asks")
    if out.status != "ok":
        detail = ((out.result or {}).get("error") or {}).get("message") or out.reason or "no result"
        return DefaultVerdict(
            f"{what} ended {out.status or out.phase or 'without a result'} ({detail}), but {declared}: it "
            "must run as time-slicing",
            how="its outcome",
        )
    mode = (out.result or {}).get("mode")
    if mode:
        if mode != TIME_SLICING:
            return DefaultVerdict(
                f"{what} runs {mode} on its device, but {declared} (time-slicing)", how="the device's mode"
            )
        return DefaultVerdict(how="the device's mode")
    want = part.env.pipe_directories.get(TIME_SLICING)
    if want:
        pipe = _pipe(out, part)
        if pipe != want:
            return DefaultVerdict(
                f"{what} reached MPS pipe directory {pipe!r}, not {want!r} ({part.implementation}'s "
                f"time-slicing server), but {declared}",
                how="the MPS pipe directory",
            )
        return DefaultVerdict(how="the MPS pipe directory")
    return DefaultVerdict(
        not_judged=f"{declared}, and neither the device reports a mode to the workload nor does "
        f"{part.implementation} name a time-slicing pipe directory: that it started is all that was judged",
        how="that it started",
    )


def refused_elsewhere(implementation: str, party: str) -> str:
    """Why a malformed case is not the node agent's to refuse in ``implementation``."""
    return {
        "admission": f"in {implementation} the admission refuses it, not the node agent (which does not "
        "check it); judged where the admission is under test (gpuconf lint --dialect kai)",
        "runtime": f"in {implementation} the node agent does not validate devices; their format is the "
        "NVIDIA container runtime's business",
        "scheduler": f"in {implementation} the node agent does not refuse it (it starts the container, "
        "unfenced); the scheduler must never write it, which annotations-at-bind judges (the scheduler "
        "profile)",
        "nobody": f"{implementation} refuses it nowhere",
    }.get(party, f"in {implementation} the {party} refuses it")


def _said(suite: Suite, names: Sequence[str]) -> dict[str, list[str]]:
    """Each Pod's explanations, from one read of the namespace's Events."""
    by_pod: dict[str, list[Mapping[str, Any]]] = {}
    for event in suite.events():
        by_pod.setdefault((event.get("involvedObject") or {}).get("name") or "", []).append(event)
    return {n: explanations(suite.pod(n), by_pod.get(n, [])) for n in names}


def _verdict(
    stage: Stage, case: Malformed, said: Sequence[str], names_key: bool, *, final: bool
) -> str | None:
    return refusal_verdict(case, stage.ran(case.name), said, names_key, final=final)


def refusal_verdict(
    case: Malformed, started: bool, said: Sequence[str], names_key: bool, *, final: bool = True
) -> str | None:
    """The judgement of one malformed case, wherever it runs (the suite, ``gpuconf probe``): empty when
    it did not start and (where ``names_key``) something it said names the key and the rule outside
    echoes of the value; a problem when not; None while not ``final`` and it may still settle (the
    node has time left to explain)."""
    what = f"{case.name} ({case.key}: {case.shown} [{case.rule}])"
    if started:
        return f"{what} started instead of being refused"
    if not names_key:
        # Only that it does not start is claimed; a waiting state or a Warning is the refusal.
        return "" if said or final else None
    named = [refusal_names(s, case.key, case.value, case.words) for s in said]
    if any(k and r for k, r in named):
        return ""
    if not final:
        return None
    if any(k for k, _ in named):
        return f"{case.name} was refused naming {case.key}, but not the rule {case.rule}: {said[-1]}"
    return (
        f"{what} did not start, but nothing in its status or Events names the key "
        f"(an echo of the value does not){': ' + said[-1] if said else ''}"
    )

"""fail-closed's judgement of a refusal: it names the key and the rule, and an echo of the value does not."""

from __future__ import annotations

import dataclasses

import pytest

from conformance.test_failclosed import (
    cases,
    default_verdict,
    explanations,
    placement,
    refusal_names,
    refusal_verdict,
)
from enforcement.contract import SUFFIX_DEVICES, SUFFIX_MODE, SUFFIX_REQUEST, nvidia_key, read_placement
from enforcement.implementations import MALFORMED_CASES, builtins
from fixtures.suite.manifests import placement_annotations
from fixtures.suite.scenario import Outcome

REQUEST = nvidia_key("main", SUFFIX_REQUEST)
MODE = nvidia_key("main", SUFFIX_MODE)
WORDS = ("memory-quantity", "quantity")


def test_the_reference_agents_refusal_names_key_and_rule() -> None:
    text = f"GPUFractionRejected: {REQUEST}: 'lots' is not a Kubernetes quantity [memory-quantity]"
    assert refusal_names(text, REQUEST, "lots", WORDS) == (True, True)


def test_an_echo_of_the_value_names_neither_key_nor_rule() -> None:
    # The value holds a rule word (sm-sharing) and part of a key's wording (gpu-memory).
    words = ("mode-word", "time-slicing", "sm-sharing", "mode")
    assert refusal_names("refused: 'SM-Sharing'", MODE, "SM-Sharing", words) == (False, False)
    assert refusal_names("refused: 'bad-gpu-memory'", REQUEST, "bad-gpu-memory", ("gpu-memory",)) == (
        False,
        False,
    )
    # ... but the same word outside the echo counts.
    said = "'SM-Sharing' is not time-slicing or sm-sharing"
    assert refusal_names(said, MODE, "SM-Sharing", words) == (False, True)


def test_a_value_that_holds_the_whole_key_does_not_name_it() -> None:
    value = f"x{REQUEST}x"
    assert refusal_names(f"refused {value!r}", REQUEST, value, WORDS) == (False, False)
    assert refusal_names(f"{REQUEST}: refused {value!r}", REQUEST, value, WORDS) == (True, False)


@pytest.mark.parametrize("value", ["", " ", None])
def test_an_invisible_or_absent_value_masks_nothing(value: str | None) -> None:
    text = f"{REQUEST}: the value is empty [memory-quantity]"
    assert refusal_names(text, REQUEST, value, WORDS) == (True, True)


def test_a_short_value_inside_a_longer_word_does_not_hide_it() -> None:
    text = f"{REQUEST}: '0' is 0 bytes, below the 1 MiB minimum [memory-minimum]"
    assert refusal_names(text, REQUEST, "0", ("memory-minimum",)) == (True, True)
    assert refusal_names("below", REQUEST, "below", ("below",)) == (False, False)


def test_every_case_is_one_the_descriptions_can_name_and_each_is_malformed_for_the_contract() -> None:
    found = cases(2)
    assert tuple(c.name for c in found) == MALFORMED_CASES
    for case in found:
        annotations = placement(placement_annotations("main", 1024, 1024, ["GPU-a"]), case)
        pod = {
            "metadata": {"name": "p", "namespace": "ns", "annotations": annotations},
            "spec": {"nodeName": "n", "containers": [{"name": "main"}]},
        }
        _, violations = read_placement(pod)
        rules = {v.rule for v in violations if v.is_error}
        if case.key.endswith(SUFFIX_DEVICES) and case.rule == "devices-unknown":
            continue  # unknown only against the node's GPUs, which the agent resolves
        assert case.rule in rules, (case.name, rules)


def test_a_waiting_state_and_warning_events_are_what_the_pod_says() -> None:
    pod = {
        "status": {"containerStatuses": [{"state": {"waiting": {"reason": "CreateContainerConfigError"}}}]}
    }
    events = [{"type": "Normal", "reason": "Scheduled"}, {"type": "Warning", "reason": "R", "message": "m"}]
    assert explanations(pod, events) == ["CreateContainerConfigError: ", "R: m"]


def test_a_verdict_names_what_went_wrong_and_settles_only_when_final() -> None:
    case = next(c for c in cases(2) if c.name == "bare-number")
    named = f"{REQUEST}: '4096' is 4096 bytes, below the 1 MiB minimum [memory-minimum]"
    assert refusal_verdict(case, False, [named], True) == ""
    assert "started instead of being refused" in (refusal_verdict(case, True, [named], True) or "")
    assert refusal_verdict(case, False, ["refused: '4096'"], True, final=False) is None
    assert "names the key" in (refusal_verdict(case, False, ["refused: '4096'"], True) or "")
    assert "not the rule" in (refusal_verdict(case, False, [f"{REQUEST} refused"], True) or "")
    # Where the implementation does not claim to name the key, any refusal is enough.
    assert refusal_verdict(case, False, ["refused: '4096'"], False) == ""


# ---- a blank mode


@pytest.mark.parametrize("value", ["", " "])
def test_a_blank_mode_is_named_by_the_rule_and_the_key_alone_does_not_name_the_rule(value: str) -> None:
    case = next(c for c in cases(2) if c.blank_mode and c.value == value)
    named = f"{MODE}: {value!r} is not time-slicing or sm-sharing (exact, lower case) [mode-word]"
    assert refusal_verdict(case, False, [named], True) == ""
    # The key holds "mode": a refusal that names the key only does not name the rule.
    assert "not the rule" in (refusal_verdict(case, False, [f"{MODE}: refused"], True) or "")
    # The reference agent's vague-refusal fault echoes the (invisible) value: neither is named.
    vague = f"GPU fraction of container 'main' refused: {value!r}"
    assert "names the key" in (refusal_verdict(case, False, [vague], True) or "")
    assert "started instead of being refused" in (refusal_verdict(case, True, [], True) or "")


def _blank_ran(status: str = "ok", mode: str | None = None, pipe: str | None = None) -> Outcome:
    result: dict = {"status": status, "steps": [{"op": "env", "env": {"CUDA_MPS_PIPE_DIRECTORY": pipe}}]}
    if mode:
        result["mode"] = mode
    return Outcome("blank-mode", "Succeeded", 0, "Completed", result, False, "")


def test_a_blank_mode_taken_as_the_default_is_judged_by_its_effect() -> None:
    case = next(c for c in cases(2) if c.name == "blank-mode")
    part = builtins()["operator-gen3"].node
    assert part is not None
    default = dataclasses.replace(part, blank_mode="default")
    # Its device's mode, where the device reports one.
    assert default_verdict(case, default, _blank_ran(mode="time-slicing")).problem == ""
    assert "runs sm-sharing" in default_verdict(case, default, _blank_ran(mode="sm-sharing")).problem
    # Else the dialect's time-slicing pipe directory.
    assert default_verdict(case, default, _blank_ran(pipe="/run/nvidia-mps")).how == "the MPS pipe directory"
    assert "/tmp/nvidia-mps" in default_verdict(case, default, _blank_ran(pipe="/tmp/nvidia-mps")).problem
    # Else only that it started, said as not judged with the declaration it rests on.
    bare = dataclasses.replace(default, env=dataclasses.replace(default.env, pipe_directories={}))
    verdict = default_verdict(case, bare, _blank_ran())
    assert verdict.problem == "" and "blankMode: default" in verdict.not_judged
    # It must run; a refusal is stricter than declared, and what the contract asks for: no failure.
    assert "blankMode: default" in default_verdict(case, default, _blank_ran(status="error")).problem
    assert default_verdict(case, default, None).problem == ""


def test_the_reference_and_the_released_operator_declare_a_blank_mode_an_error() -> None:
    for name in ("gpuconf-reference", "operator-gen3", "operator-pr"):
        node = builtins()[name].node
        assert node is not None and node.blank_mode == "error" and node.who_refuses("blank-mode") == "node"

"""The mode guard's judgement (``conformance.judgements.judge_intrusion``), the same either way round
and after an agent restart: an intruder must not start, and must say that the modes conflict."""

from __future__ import annotations

from conformance.judgements import Intrusion, judge_intrusion, names_mode_conflict

ONTO_SHARED = Intrusion("unset-on-shared", "time-slicing", "GPU-1", "shared", "sm-sharing", written=False)
ONTO_SLICED = Intrusion("shared-on-sliced", "sm-sharing", "GPU-0", "sliced", "time-slicing")
REFUSED = (
    "GPUModeConflict: compute mode conflict on GPU GPU-1 of node n: container 'main' of Pod ns/x asks for "
    "time-slicing, but the GPU already runs container 'main' of Pod ns/shared (sm-sharing)"
)


def test_a_refusal_that_names_both_modes_holds_either_way_round() -> None:
    assert judge_intrusion(ONTO_SHARED, False, [REFUSED]) == ""
    assert judge_intrusion(ONTO_SLICED, False, ["x: SM-Sharing and Time-Slicing do not mix"]) == ""


def test_a_started_intruder_fails_naming_both_pods_and_modes() -> None:
    problem = judge_intrusion(ONTO_SHARED, True, [REFUSED]) or ""
    assert "started" in problem
    for word in ("unset-on-shared", "no mode annotation", "shared", "sm-sharing", "GPU-1"):
        assert word in problem


def test_a_refusal_that_does_not_say_why_fails_only_once_final() -> None:
    mute = ["CreateContainerConfigError: refused"]
    assert judge_intrusion(ONTO_SLICED, False, mute, final=False) is None
    assert judge_intrusion(ONTO_SLICED, False, [], final=False) is None
    problem = judge_intrusion(ONTO_SLICED, False, mute) or ""
    assert "nothing it says names" in problem and "refused" in problem


def test_one_mode_named_is_not_a_conflict_named() -> None:
    assert not names_mode_conflict("container asks for sm-sharing")
    assert names_mode_conflict("sm-sharing beside time-slicing")


def test_the_evidence_names_both_pods() -> None:
    fact = ONTO_SHARED.as_fact()
    assert (fact["pod"], fact["holder"], fact["holderMode"]) == ("unset-on-shared", "shared", "sm-sharing")
    assert fact["asks"] == "time-slicing, no mode annotation"

"""``gpuconf mutate``'s choice of faults: canonical names only, an earlier name counted as its new one."""

from __future__ import annotations

import pytest

from conformance.mutate import EXPECTED_AGENT, _pick
from enforcement.agent.options import FAULT_ALIASES, FAULTS, canonical_fault


def pick(*values: str) -> list[str]:
    return _pick(list(values) or None, dict(FAULTS), "agent", canonical_fault)


def test_every_agent_fault_has_an_expected_check_and_no_alias_is_judged() -> None:
    assert set(EXPECTED_AGENT) == set(FAULTS)
    assert not set(FAULT_ALIASES) & set(EXPECTED_AGENT)
    assert EXPECTED_AGENT["shared-fault-domain"] == ("fault-isolation",)
    assert EXPECTED_AGENT["limit-from-request"] == ("burst-borrowing",)
    assert EXPECTED_AGENT["leak-on-exit"] == ("release-on-exit",)


def test_all_lists_the_canonical_names_once_each() -> None:
    assert pick() == pick("all") == list(FAULTS)
    assert pick("none") == []


def test_an_earlier_name_is_judged_as_its_new_one_and_only_once() -> None:
    assert pick("no-release,leak-on-exit", "no-borrowing") == ["leak-on-exit", "limit-from-request"]
    assert pick("shared-fault-domain") == ["shared-fault-domain"]


def test_an_unknown_name_is_refused_with_the_canonical_names() -> None:
    with pytest.raises(SystemExit, match="unknown agent fault") as exc:
        pick("no-such")
    assert "no-release" not in str(exc.value) and "leak-on-exit" in str(exc.value)

"""The workload's result: always one valid JSON object within the 4096-byte termination message."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workloads.report import (
    DEFAULT_TERMINATION_PATH,
    TERMINATION_MESSAGE_LIMIT,
    ExitCode,
    render_result,
    termination_path,
    write_termination_message,
)


def verdict(**extra: Any) -> dict[str, Any]:
    return {
        "gpuconf_workload": 1,
        "status": "ok",
        "exit_code": 0,
        "simulated": True,
        "backend": "sim",
        **extra,
    }


def test_exit_codes_are_distinct_and_named() -> None:
    assert len({int(c) for c in ExitCode}) == len(ExitCode)
    assert ExitCode.EXPECTED_OOM.status == "expected-oom"
    assert ExitCode.TERMINATED == 128 + 15
    assert all(0 <= int(c) <= 255 for c in ExitCode)


def test_a_small_result_is_left_whole() -> None:
    text = render_result(verdict(steps=[{"op": "alloc", "outcome": "ok"}]))
    assert json.loads(text)["truncated"] is False
    assert json.loads(text)["steps"] == [{"op": "alloc", "outcome": "ok"}]


def test_long_lists_are_cut_and_their_length_kept() -> None:
    spans = [[i * 50.0, i * 50.0 + 49.5] for i in range(2000)]
    text = render_result(
        verdict(steps=[{"op": "compute", "outcome": "ok", "kernels": 2000, "spans_ms": spans}])
    )
    assert len(text.encode()) <= TERMINATION_MESSAGE_LIMIT
    result = json.loads(text)
    assert result["truncated"] is True
    step = result["steps"][0]
    assert step["kernels"] == 2000 and step["spans_ms_total"] == 2000
    assert step["spans_ms"] == spans[: len(step["spans_ms"])] and len(step["spans_ms"]) >= 8


def test_many_steps_keep_the_last_ones_in_detail() -> None:
    steps = [{"i": i, "op": "alloc", "outcome": "ok", "bytes": 1 << 20, "note": "x" * 40} for i in range(300)]
    steps[-1] = {
        "i": 299,
        "op": "alloc",
        "outcome": "oom",
        "oom": {"requested": 1, "error_type": "simulated-oom/x"},
    }
    text = render_result(verdict(status="unexpected-oom", exit_code=11, steps=steps))
    assert len(text) <= TERMINATION_MESSAGE_LIMIT
    result = json.loads(text)
    assert (result["status"], result["exit_code"], result["truncated"]) == ("unexpected-oom", 11, True)
    assert result["steps"][-1]["oom"]["error_type"] == "simulated-oom/x"


def test_the_limit_counts_bytes_not_characters() -> None:
    text = render_result(verdict(error={"message": "ü" * 5000}))
    assert len(text.encode("utf-8")) <= TERMINATION_MESSAGE_LIMIT
    assert json.loads(text)["error"]["message"].startswith("ü")


keys = st.text(alphabet="abcdefgh_ü", min_size=1, max_size=8)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=300),
    lambda inner: st.lists(inner, max_size=60) | st.dictionaries(keys, inner, max_size=6),
    max_leaves=40,
)


@settings(max_examples=40, deadline=None)
@given(extra=st.dictionaries(keys, json_values, max_size=12), limit=st.sampled_from([512, 4096]))
def test_any_result_renders_as_valid_json_within_the_limit_with_its_verdict(
    extra: dict[str, Any], limit: int
) -> None:
    result = {**extra, **verdict(status="device-fault", exit_code=14)}
    text = render_result(result, limit)
    assert len(text.encode("utf-8")) <= limit
    parsed = json.loads(text)
    assert (parsed["status"], parsed["exit_code"]) == ("device-fault", 14)
    assert isinstance(parsed["truncated"], bool)


def test_the_termination_path_comes_from_flag_then_env_then_default() -> None:
    assert termination_path("/a", {"GPUCONF_TERMINATION_PATH": "/b"}) == "/a"
    assert termination_path(None, {"GPUCONF_TERMINATION_PATH": "/b"}) == "/b"
    assert termination_path(None, {}) == DEFAULT_TERMINATION_PATH


def test_writing_the_termination_message(tmp_path: Path) -> None:
    target = tmp_path / "term"
    assert write_termination_message(str(target), "{}") is None
    assert target.read_text() == "{}"
    assert "cannot write" in (write_termination_message(str(tmp_path / "no" / "dir"), "{}") or "")


@pytest.mark.skipif(Path(DEFAULT_TERMINATION_PATH).exists(), reason="running under a kubelet")
def test_the_default_path_is_not_created_outside_a_kubelet() -> None:
    problem = write_termination_message(DEFAULT_TERMINATION_PATH, "{}")
    assert problem is not None and "not running under a kubelet" in problem
    assert not Path(DEFAULT_TERMINATION_PATH).exists()

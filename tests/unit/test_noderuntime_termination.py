"""Termination messages with the kubelet's limits, and the ``FallbackToLogsOnError`` rules."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from fixtures.sandbox.noderuntime.termination import (
    FALLBACK_BYTES,
    FALLBACK_LINES,
    MAX_CONTAINER_BYTES,
    POLICY_FALLBACK,
    POLICY_FILE,
    budget,
    log_tail,
    message,
    read_file,
    tail,
)


def test_budget_is_4096_per_container_and_12_kib_per_pod() -> None:
    assert [budget(n) for n in (0, 1, 3, 4, 6)] == [4096, 4096, 4096, 3072, 2048]


def test_file_is_read_up_to_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "termination-log"
    assert read_file(path) == ""  # never written
    path.write_text("x" * 5000)
    assert read_file(path) == "x" * MAX_CONTAINER_BYTES
    assert read_file(path, 10) == "x" * 10


def test_a_cut_utf8_sequence_is_dropped_not_garbled(tmp_path: Path) -> None:
    path = tmp_path / "termination-log"
    path.write_bytes(b"ab" + "é".encode() * 3)  # 2 + 6 bytes
    assert read_file(path, 5) == "abé"  # the half of the second é is dropped


def test_tail_keeps_the_last_80_lines_then_the_last_2048_bytes() -> None:
    data = b"".join(b"line %d\n" % i for i in range(200))
    kept = tail(data)
    assert kept.splitlines()[0] == b"line 120" and kept.splitlines()[-1] == b"line 199"
    assert len(kept.splitlines()) == FALLBACK_LINES
    wide = b"".join(b"%03d " % i + b"y" * 60 + b"\n" for i in range(100))
    cut = tail(wide)
    assert len(cut) == FALLBACK_BYTES and cut.endswith(b"099 " + b"y" * 60 + b"\n")
    assert tail(b"") == b"" and tail(b"no newline") == b"no newline"


@given(st.lists(st.text(alphabet="abc ", max_size=50), max_size=300))
def test_tail_is_a_suffix_within_both_limits(lines: list[str]) -> None:
    data = "\n".join(lines).encode()
    kept = tail(data)
    assert data.endswith(kept)
    assert len(kept) <= FALLBACK_BYTES
    assert kept.count(b"\n") <= FALLBACK_LINES


def test_log_tail_reads_only_the_end_of_a_large_log(tmp_path: Path) -> None:
    log = tmp_path / "0.log"
    log.write_bytes(b"".join(b"line %d\n" % i for i in range(100_000)))
    text = log_tail(log)
    assert text.splitlines()[-1] == "line 99999" and len(text.splitlines()) == FALLBACK_LINES
    assert log_tail(tmp_path / "missing.log") == ""


def test_fallback_only_when_the_file_is_empty_and_the_container_failed(tmp_path: Path) -> None:
    log = tmp_path / "0.log"
    log.write_text("starting\nTraceback: boom\n")
    assert message(POLICY_FALLBACK, "", 1, log) == "starting\nTraceback: boom\n"
    assert message(POLICY_FALLBACK, "", 0, log) == ""  # succeeded: no fallback
    assert message(POLICY_FALLBACK, "result", 1, log) == "result"  # the file wins
    assert message(POLICY_FILE, "", 1, log) == ""  # policy File: never the log


def test_fallback_respects_a_smaller_pod_budget(tmp_path: Path) -> None:
    log = tmp_path / "0.log"
    log.write_text("z" * 3000)
    assert len(message(POLICY_FALLBACK, "", 2, log, limit=1024)) == 1024

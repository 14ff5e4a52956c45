"""tests/repeat.py (make test-loaded): the failures of a run are read from pytest's short summary."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests import repeat  # noqa: E402

SUMMARY = """\
tests/unit/test_x.py ....F                                         [100%]
=========================== short test summary info ============================
FAILED tests/unit/test_x.py::test_rate[ideal] - AssertionError: 43 kernels in a second
ERROR tests/integration/test_y.py::test_z - RuntimeError: the sandbox did not start
FAILED tests/unit/test_w.py::test_bare
= 2 failed, 1 error, 12 passed in 3.21s =
"""


def test_each_failed_and_errored_test_is_named_with_its_first_line() -> None:
    found = repeat.failures_in(SUMMARY)
    assert [(f.kind, f.test, f.first_line) for f in found] == [
        ("FAILED", "tests/unit/test_x.py::test_rate[ideal]", "AssertionError: 43 kernels in a second"),
        ("ERROR", "tests/integration/test_y.py::test_z", "RuntimeError: the sandbox did not start"),
        ("FAILED", "tests/unit/test_w.py::test_bare", ""),
    ]


def test_a_passing_run_names_nothing() -> None:
    assert repeat.failures_in("==== 1499 passed in 200.1s ====\n") == []


def test_the_hog_is_a_busy_python_loop() -> None:
    argv = repeat.hog_command()
    assert argv[1:] == ["-c", "while True: pass"]

"""The suite's pytest plugin, tested as pytest-xdist tests itself: small check files run by pytester.

Each test writes a few checks declared with ``@check`` and runs pytest on them in a subprocess,
against the shared test sandbox's real API server (no scheduler: preflight is skipped, and these
checks judge nothing of a scheduler). What is asserted is the frame's own behaviour: option
errors, skips for unsupported features, the line between a failure and an error, per-form items,
exit codes, the result files.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from fixtures.sandbox.controlplane import Sandbox

pytestmark = pytest.mark.sandbox

pytest_plugins = ["pytester"]

INI = "[pytest]\ngpuconf_suite = true\n"


def run(pytester: pytest.Pytester, sandbox: Sandbox, *args: str) -> tuple[pytest.RunResult, dict[str, Any]]:
    pytester.makeini(INI)
    out = pytester.path / "results"
    # Paths as --opt=value: pytest takes a lone path-like token as a hint for its rootdir.
    result = pytester.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        f"--kubeconfig={sandbox.kubeconfig}",
        "--scheduler-name=nobody",
        "--skip-preflight",
        f"--report-dir={out}",
        *args,
    )
    record = json.loads((out / "run.json").read_text()) if (out / "run.json").exists() else {}
    return result, record


def by_key(record: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["key"]: r for r in record.get("results", [])}


CHECKS = """
from fixtures.suite.checks import Needs, check
from fixtures.suite.frame import Suite, fail
from fixtures.suite.waiting import wait_until


@check(id="plugin-passes", level="MUST", statement="It MUST pass.", profiles=("scheduler",),
       needs=Needs(cluster=True))
def test_passes(suite: Suite) -> None:
    assert suite.namespace


@check(id="plugin-fails", level="MUST", statement="It MUST fail.", profiles=("scheduler",),
       needs=Needs(cluster=True))
def test_fails(suite: Suite) -> None:
    raise fail("the rule was broken: 2 > 1")


@check(id="plugin-should-fails", level="SHOULD", statement="It SHOULD fail.", profiles=("scheduler",),
       needs=Needs(cluster=True))
def test_should_fails(suite: Suite) -> None:
    raise fail("a SHOULD was not met")


@check(id="plugin-waits", level="MUST", statement="It MUST wait for something that never comes.",
       profiles=("scheduler",), needs=Needs(cluster=True))
def test_waits(suite: Suite) -> None:
    wait_until(lambda: None, "something the check does not judge", 0.2, describe=lambda: "nothing at all")


@check(id="plugin-breaks", level="MUST", statement="It MUST not crash.", profiles=("scheduler",),
       needs=Needs(cluster=True))
def test_breaks(suite: Suite) -> None:
    {}["missing"]


@check(id="plugin-needs-sm", level="MUST", statement="It MUST be skipped.", profiles=("scheduler",),
       features=("sm-sharing",), needs=Needs(cluster=True))
def test_needs_sm(suite: Suite) -> None:
    raise AssertionError("must not run")


@check(id="plugin-per-form", level="MUST", statement="It MUST run once per supported form.",
       profiles=("scheduler",), each_form=True, needs=Needs(cluster=True))
def test_per_form(suite: Suite) -> None:
    assert suite.form in ("gpu-memory", "nvidia", "gpu-fraction")
"""


def test_outcomes_failure_error_skip_and_per_form(pytester: pytest.Pytester, sandbox: Sandbox) -> None:
    pytester.makepyfile(test_checks=CHECKS)
    result, record = run(pytester, sandbox, "--exempt-features", "sm-sharing,gpu-fraction")
    results = by_key(record)
    assert results["scheduler/plugin-passes"]["outcome"] == "passed"
    failed = results["scheduler/plugin-fails"]
    assert failed["outcome"] == "failed" and "2 > 1" in failed["reason"] and failed["party"] == "scheduler"
    assert results["scheduler/plugin-should-fails"]["outcome"] == "failed"
    waited = results["scheduler/plugin-waits"]
    assert waited["outcome"] == "error", "a wait for something the check does not judge is an error"
    assert "something the check does not judge" in waited["reason"] and "nothing at all" in waited["reason"]
    broken = results["scheduler/plugin-breaks"]
    assert broken["outcome"] == "error" and "KeyError" in broken["reason"], (
        "a crash in the suite is never a failure"
    )
    skipped = results["scheduler/plugin-needs-sm"]
    assert skipped["outcome"] == "skipped" and "sm-sharing" in skipped["reason"]
    assert results["scheduler/plugin-per-form[gpu-memory]"]["outcome"] == "passed"
    assert results["scheduler/plugin-per-form[nvidia]"]["outcome"] == "passed"
    assert results["scheduler/plugin-per-form[gpu-fraction]"]["outcome"] == "skipped"
    assert result.ret == 1, "a MUST check failed"
    assert record["statistics"] == {"passed": 3, "failed": 2, "skipped": 2, "error": 2}
    junit = ET.parse(pytester.path / "results" / "junit.xml").getroot()
    cases = {c.get("name"): c for c in junit.iter("testcase")}
    assert cases["scheduler/plugin-waits"].find("error") is not None
    assert cases["scheduler/plugin-waits"].find("failure") is None
    assert cases["scheduler/plugin-fails"].find("failure") is not None
    result.stdout.fnmatch_lines(["FAIL  scheduler/plugin-fails*2 > 1*", "ERROR scheduler/plugin-waits*"])


def test_an_error_alone_exits_3_and_a_should_failure_alone_exits_0(
    pytester: pytest.Pytester, sandbox: Sandbox
) -> None:
    pytester.makepyfile(test_checks=CHECKS)
    result, _ = run(pytester, sandbox, "--check", "plugin-waits", "--check", "plugin-passes")
    assert result.ret == 3, result.stdout.str()
    result, _ = run(pytester, sandbox, "--check", "plugin-should-fails")
    assert result.ret == 0, result.stdout.str()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--profile", "nope"), "--profile 'nope': unknown profile"),
        (("--supported-features", "warp-drive"), "feature 'warp-drive': unknown"),
        (("--timeout-scale", "0"), "--timeout-scale 0.0: must be a positive number"),
    ],
)
def test_bad_options_exit_2_before_anything_is_created(
    pytester: pytest.Pytester, sandbox: Sandbox, args: tuple[str, ...], message: str
) -> None:
    pytester.makepyfile(test_checks=CHECKS)
    before = {ns.metadata.name for ns in sandbox.core_v1().list_namespace().items}
    result, record = run(pytester, sandbox, *args)
    assert result.ret == 2
    assert message in result.stdout.str() + result.stderr.str()
    assert not record
    assert {ns.metadata.name for ns in sandbox.core_v1().list_namespace().items} == before


def test_an_unreadable_kubeconfig_is_a_usage_error(pytester: pytest.Pytester, tmp_path: Path) -> None:
    pytester.makeini(INI)
    pytester.makepyfile(test_checks=CHECKS)
    bad = tmp_path / "kubeconfig"
    bad.write_text("this: is: not: a kubeconfig")
    result = pytester.runpytest_subprocess(
        "-p", "no:cacheprovider", f"--kubeconfig={bad}", "--scheduler-name=x"
    )
    assert result.ret == 2
    assert "cannot load kubeconfig" in result.stdout.str() + result.stderr.str()


def test_the_plugin_is_inert_outside_the_suite(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_plain="def test_plain():\n    assert True\n")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert "gpuconf: judging" not in result.stdout.str()

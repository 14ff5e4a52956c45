"""``gpuconf run --dry-run``: the checks that would run or skip and why, what each would create, and
nothing created; and the run's choice of target inside a Pod."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from conformance import dryrun
from conformance import run as run_module
from conformance.catalog import load_checks
from conformance.cli import build_parser, main
from fixtures.suite.checks import FEATURES, REGISTRY
from fixtures.suite.cluster import GpuNode, left_out
from fixtures.suite.session import WITHHELD_REASON


@pytest.fixture(scope="module")
def checks() -> list[Any]:
    return load_checks()


def by_key(data: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {row["key"]: row for row in data["checks"]}


def test_every_per_form_check_gives_one_item_per_form_and_skips_unsupported_forms(checks: list[Any]) -> None:
    supported = frozenset(FEATURES) - {"nvidia", "sm-sharing"}
    rows = by_key(dryrun.plan(checks, profiles=("scheduler",), supported=supported))
    assert rows["scheduler/annotations-at-bind[gpu-memory]"]["runs"]
    nvidia = rows["scheduler/annotations-at-bind[nvidia]"]
    assert not nvidia["runs"] and nvidia["skip"] == (
        "needs feature(s) nvidia, which the implementation does not support"
    )
    assert rows["scheduler/mode-separation"]["skip"].startswith("needs feature(s) sm-sharing")
    assert all(key.startswith("scheduler/") for key in rows)


def test_no_request_form_skips_every_fraction_check(checks: list[Any]) -> None:
    rows = by_key(dryrun.plan(checks, profiles=("scheduler",), supported=frozenset({"sm-sharing"})))
    assert (
        rows["scheduler/memory-fit"]["skip"]
        == "no request form (gpu-memory, nvidia, gpu-fraction) is supported"
    )


def test_check_selection_and_the_footprint_read_from_the_code(checks: list[Any]) -> None:
    data = dryrun.plan(checks, only=("annotations-at-bind", "memory-fit", "node-readiness"))
    rows = by_key(data)
    assert set(rows) == {
        "scheduler/annotations-at-bind[gpu-memory]",
        "scheduler/annotations-at-bind[gpu-fraction]",
        "scheduler/annotations-at-bind[nvidia]",
        "scheduler/memory-fit",
        "scheduler/node-readiness",
    }
    at_bind = rows["scheduler/annotations-at-bind[gpu-memory]"]
    assert at_bind["creates"] == {"namespaces": 1, "pods": "1", "nodeLeases": 1}
    assert at_bind["needs"] == {"nodes": 1, "gpusPerNode": 1, "idle": True}
    assert rows["scheduler/memory-fit"]["creates"]["pods"] == "6 or more", (
        "a multi-device filler (or fillers per GPU), one more, top-ups with one of another party, one more"
    )
    assert rows["scheduler/memory-fit"]["creates"]["namespaces"] == 2  # the other party's Pod has its own
    assert rows["scheduler/node-readiness"]["creates"]["nodes"] == "1, only where the GPU nodes are simulated"
    assert data["summary"] == {"items": 5, "run": 5, "skipped": 0, "namespaces": 6}
    assert data["changesOutsideItsNamespaces"] == ["nothing"]


def test_agent_restart_is_the_one_change_outside_and_is_withheld_on_real_gpus(checks: list[Any]) -> None:
    mark = dryrun.footprint(REGISTRY["agent-restart"])
    assert mark.restarts_agent
    sandbox = dryrun.plan(checks, profiles=("node",), only=("agent-restart",))
    assert by_key(sandbox)["node/agent-restart"]["runs"]
    assert sandbox["changesOutsideItsNamespaces"] == [
        "restarts the node agent of its leased node (feature agent-restart)"
    ]
    real = dryrun.plan(checks, profiles=("node",), only=("agent-restart",), withheld=WITHHELD_REASON)
    assert by_key(real)["node/agent-restart"]["skip"] == WITHHELD_REASON
    assert real["changesOutsideItsNamespaces"] == ["nothing"]


def gpu(name: str, **labels: str) -> GpuNode:
    node = GpuNode.from_dict(
        {
            "metadata": {
                "name": name,
                "labels": {"nvidia.com/gpu.count": "2", "nvidia.com/gpu.memory": "81920", **labels},
            },
            "spec": {},
            "status": {
                "conditions": [
                    {"type": "Ready", "status": "True"},
                    {"type": "gpu-fractioning.nvidia.com/Ready", "status": "True"},
                ]
            },
        }
    )
    assert node is not None
    return node


def test_with_a_cluster_view_it_names_the_nodes_each_check_could_use(checks: list[Any]) -> None:
    nodes = [
        gpu("free"),
        gpu("mig", **{"nvidia.com/mig.config": "all-1g.10gb"}),
        gpu("half-held"),
        gpu("shared"),
    ]
    holders = {"half-held": [("ml/train", 1)]}
    view = {
        "server": "https://cluster",
        "nodes": nodes,
        "whole": {"half-held": 1},
        "guaranteed": {"shared"},
        "leftOut": left_out(nodes, holders),
        "leasesNamespace": True,
    }
    data = dryrun.plan(checks, only=("memory-fit", "node-readiness", "multi-device"), view=view)
    rows = by_key(data)
    assert rows["scheduler/memory-fit"]["eligibleNodes"] == ["free"], "idle: not shared, not held, not MIG"
    assert rows["scheduler/node-readiness"]["eligibleNodes"] == ["free", "half-held", "shared"]
    assert rows["scheduler/multi-device"]["eligibleNodes"] == ["free"], (
        "needs 2 GPUs: one of half-held's is held"
    )
    assert {e["node"] for e in data["leftOut"]} == {"mig", "half-held"}
    assert data["runCreates"][0] == "namespace gpuconf-leases: exists, kept"
    lines: list[str] = []
    dryrun.render(data, lines.append)
    text = "\n".join(lines)
    assert "mig: left out: MIG-partitioned" in text
    assert "half-held: left out of checks needing idle GPUs" in text
    assert "RUN  scheduler/memory-fit [MUST]: creates 2 namespaces, 6 or more Pod(s), 1 node Lease(s)" in text


def test_gpuconf_run_dry_run_on_the_sandbox_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    box = tmp_path / "sandbox"
    report = tmp_path / "report"
    rc = main(
        ["run", "--dry-run=json", "--dir", str(box), "--report-dir", str(report), "--check", "memory-fit"]
    )
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    assert data["dryRun"] and data["target"]["kind"] == "gpuconf-sandbox"
    assert data["target"]["sandbox"].startswith("absent") and "would bring it up" in data["target"]["sandbox"]
    assert data["schedulerName"] == "gpuconf-reference"
    assert [r["key"] for r in data["checks"]] == ["scheduler/memory-fit"]
    assert not box.exists() and not report.exists(), "a dry run creates nothing"


def test_gpuconf_run_dry_run_text(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc = main(["run", "--dry-run", "--dir", str(tmp_path / "sb"), "--profile", "scheduler"])
    assert rc == 0
    out = capsys.readouterr().out
    assert out.startswith("gpuconf run --dry-run: nothing is created; target gpuconf-sandbox")
    assert "outside its own namespaces and Leases it changes: nothing" in out


def test_a_usage_error_is_still_a_usage_error_in_a_dry_run(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--dry-run", "--check", "no-such-check"]) == 2
    assert "--check 'no-such-check'" in capsys.readouterr().err


# ------------------------------------------------------------------------------- in a Pod


def run_args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["run", *argv])


def test_in_a_pod_the_scheduler_name_is_required_and_no_kubeconfig_is_passed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(run_module, "in_cluster", lambda: True)
    assert "--scheduler-name" in (run_module.validate(run_args()) or "")
    args = run_args("--scheduler-name", "kai-scheduler")
    assert run_module.validate(args) is None
    argv = run_module.pytest_args(args, None, "kai-scheduler", "in-cluster")
    assert not any(a.startswith("--kubeconfig") for a in argv)
    assert "--gpuconf-target=in-cluster" in argv


def test_in_a_pod_gpuconf_run_never_starts_a_sandbox(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(run_module, "in_cluster", lambda: True)
    seen: list[list[str]] = []

    def fake_main(argv: list[str]) -> int:
        seen.append(argv)
        return 0

    def no_sandbox(_args: argparse.Namespace) -> Any:
        raise AssertionError("a run in a Pod must never start a sandbox")

    monkeypatch.setattr(run_module.pytest, "main", fake_main)
    monkeypatch.setattr(run_module, "sandbox_from_args", no_sandbox)
    rc = run_module.cmd_run(run_args("--scheduler-name", "kai", "--report-dir", str(tmp_path / "r")))
    assert rc == 0
    (argv,) = seen
    assert "--gpuconf-target=in-cluster" in argv and not any(a.startswith("--kubeconfig") for a in argv)


# ------------------------------------------------------------------------------- agent-restart consent


class Options:
    def __init__(self, named: list[str] | None) -> None:
        self.named = named

    def getoption(self, name: str) -> Any:
        return self.named if name == "supported_features" else None


@pytest.mark.parametrize(
    ("named", "target", "simulated", "withheld"),
    [
        (None, "cluster", False, True),
        (None, "in-cluster", None, True),
        (["agent-restart,gpu-memory"], "cluster", False, False),
        (None, "cluster", True, False),
        (None, "gpuconf-sandbox", None, False),
    ],
)
def test_the_plugin_restarts_a_real_agent_only_when_the_user_names_the_feature(
    named: list[str] | None, target: str, simulated: bool | None, withheld: bool
) -> None:
    from types import SimpleNamespace

    from fixtures.suite.frame import RunOptions
    from fixtures.suite.session import WITHHELD, withhold_agent_restart

    options = RunOptions(
        scheduler_name="s", profiles=("node",), supported_features=frozenset(FEATURES), run_id="r"
    )
    state = SimpleNamespace(options=options, target={"kind": target}, preflight={"simulatedGpus": simulated})
    withhold_agent_restart(Options(named), state)  # type: ignore[arg-type]
    assert (state.options.extra.get(WITHHELD) == WITHHELD_REASON) is withheld
    assert state.options.supported_features == options.supported_features, "the features stay as declared"


@pytest.mark.parametrize(("simulated", "withheld"), [(True, False), (False, True)])
def test_with_preflight_skipped_the_plugin_reads_the_nodes_to_decide(simulated: bool, withheld: bool) -> None:
    from types import SimpleNamespace

    from fixtures.suite.frame import RunOptions
    from fixtures.suite.session import WITHHELD, withhold_agent_restart

    labels = {"gpuconf.io/simulated": "true"} if simulated else {}

    class Nodes:
        def gpu_nodes(self, selector: str = "") -> list[GpuNode]:
            return [gpu("a", **labels), gpu("b", **labels)]

    options = RunOptions(
        scheduler_name="s", profiles=("node",), supported_features=frozenset(FEATURES), run_id="r"
    )
    state = SimpleNamespace(
        options=options, target={"kind": "cluster"}, preflight={"skipped": True}, cluster=Nodes()
    )
    withhold_agent_restart(Options(None), state)  # type: ignore[arg-type]
    assert (WITHHELD in state.options.extra) is withheld

"""The reference scheduler's other parts, without a cluster: ledger, faults, specs, CLI, RBAC."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from fixtures.sandbox.cli import schedulers_from_args
from fixtures.sandbox.errors import SandboxError
from fixtures.sandbox.scheduler import rbac
from fixtures.sandbox.scheduler.__main__ import main as scheduler_main
from fixtures.sandbox.scheduler.component import SchedulerSpec, parse_spec, parse_specs, with_faults
from fixtures.sandbox.scheduler.faults import FAULTS, UnknownFault, parse_faults
from fixtures.sandbox.scheduler.ledger import Ledger

NODE = {"metadata": {"name": "n", "annotations": {"gpuconf.io/gpu-uuids": "GPU-a,GPU-b"}}}


def placed(name: str, devices: str, mib: int = 1000, mode: str = "time-slicing", **extra: Any) -> dict:
    pod: dict[str, Any] = {
        "metadata": {
            "name": name,
            "namespace": "ns",
            "uid": f"uid-{name}",
            "annotations": {
                "nvidia.com/container.c.gpu-memory.request": f"{mib}Mi",
                "nvidia.com/container.c.gpu-compute.mode": mode,
                "nvidia.com/container.c.gpus.devices": devices,
            },
        },
        "spec": {"nodeName": "n", "containers": [{"name": "c"}]},
    }
    pod.update(extra)
    return pod


# --------------------------------------------------------------------------- ledger


def test_ledger_counts_each_gpu_of_a_bound_pod_and_resolves_indices() -> None:
    ledger = Ledger()
    ledger.observe(placed("p", "0,GPU-b", 300), NODE)
    ledger.observe(placed("q", "GPU-a", 200, "time-slicing"), NODE)
    assert ledger.gpus() == {("n", "GPU-a"): 500, ("n", "GPU-b"): 300}
    assert ledger.modes("n", "GPU-a") == {"time-slicing"}
    assert ledger.pods_on("n") == 2


def test_ledger_frees_terminal_and_deleted_pods() -> None:
    ledger = Ledger()
    ledger.observe(placed("p", "GPU-a"), NODE)
    assert ledger.observe(placed("p", "GPU-a", status={"phase": "Succeeded"}), NODE) is True
    assert ledger.gpus() == {}
    ledger.observe(placed("q", "GPU-a"), NODE)
    assert ledger.forget("uid-q") is True
    assert (ledger.gpus(), ledger.pods_on("n")) == ({}, 0)


def test_ledger_keeps_an_assumed_pod_until_the_watch_shows_it_bound() -> None:
    ledger = Ledger()
    bound = placed("p", "GPU-a", 700)
    ledger.assume(bound, NODE)
    assert ledger.is_assumed("uid-p")
    unbound = placed("p", "GPU-a", 700)
    unbound["spec"] = {"containers": [{"name": "c"}]}  # the annotation patch's event, before the bind's
    ledger.observe(unbound, NODE)
    assert ledger.used_mib("n", "GPU-a") == 700 and ledger.is_assumed("uid-p")
    assert ledger.observe(bound, NODE) is False  # confirmed: same claims, no longer assumed
    assert ledger.used_mib("n", "GPU-a") == 700 and not ledger.is_assumed("uid-p")


def test_ledger_counts_pods_bound_without_annotations_only_per_node() -> None:
    ledger = Ledger()
    ledger.observe({"metadata": {"uid": "x"}, "spec": {"nodeName": "n"}}, NODE)
    assert (ledger.gpus(), ledger.pods_on("n")) == ({}, 1)


# --------------------------------------------------------------------------- faults


def test_faults_parse_from_repeats_and_commas() -> None:
    assert parse_faults(["overcommit,mix-modes", "omit-limit", ""]) == {
        "overcommit",
        "mix-modes",
        "omit-limit",
    }


def test_unknown_fault_lists_the_known_ones() -> None:
    with pytest.raises(UnknownFault) as err:
        parse_faults(["overcommitt"])
    assert str(err.value) == f"unknown fault 'overcommitt'; known faults: {', '.join(FAULTS)}"


def test_the_fault_table_is_the_one_in_the_issue() -> None:
    assert set(FAULTS) == {
        "overcommit",
        "mix-modes",
        "omit-limit",
        "omit-devices",
        "omit-request",
        "wrong-device-count",
        "request-gt-limit",
        "wrong-container-name",
        "trust-pod-devices",
        "ignore-node-ready",
        "devices-not-on-node",
        "annotate-after-bind",
        "leak-completed",
        "silent-unschedulable",
        "portion-of-wrong-size",
        "inflate-request",
        "limit-to-gpu",
        "default-sm-sharing",
        "overcommit-slightly",
        "leak-failed",
        "vague-unschedulable",
        "mode-check-sm-only",
        "absent-mode-fits-any",
        "mode-check-first-device",
        "charge-first-device-only",
        "ignore-foreign-pods",
        "place-on-retry",
        "own-namespace-only",
        "trust-fitting-pod-devices",
        "refuse-only-not-ready-false",
        "trust-compatible-pod-devices",
        "limit-to-unguaranteed",
        "mode-check-last-device",
        "devices-as-indices",
    }
    assert all(f.breaks and f.name == name for name, f in FAULTS.items())


def test_command_line_refuses_an_unknown_fault(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as err:
        scheduler_main(["--kubeconfig", "k", "--fault", "nope"])
    assert err.value.code == 2
    assert "unknown fault 'nope'; known faults: overcommit," in capsys.readouterr().err


def test_print_rbac(capsys: pytest.CaptureFixture[str]) -> None:
    assert scheduler_main(["--print-rbac", "--name", "x"]) == 0
    out = capsys.readouterr().out
    assert "kind: ClusterRole\n" in out and "name: gpuconf:scheduler:x" in out


# --------------------------------------------------------------------------- specs


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        ("reference", SchedulerSpec("reference", "gpuconf-reference", (), "reference")),
        ("reference/b", SchedulerSpec("reference", "b", (), "reference/b")),
        (
            "reference/m:overcommit,mix-modes",
            SchedulerSpec("reference", "m", ("mix-modes", "overcommit"), "reference/m:overcommit,mix-modes"),
        ),
        (
            "reference:omit-limit",
            SchedulerSpec("reference", "gpuconf-reference", ("omit-limit",), "reference:omit-limit"),
        ),
        ("upstream", SchedulerSpec("upstream", "default-scheduler", (), "upstream")),
        (
            "upstream/default-scheduler",
            SchedulerSpec("upstream", "default-scheduler", (), "upstream/default-scheduler"),
        ),
    ],
)
def test_specs_parse(text: str, spec: SchedulerSpec) -> None:
    assert parse_spec(text) == spec


@pytest.mark.parametrize(
    ("text", "rule"),
    [
        ("kube", "unknown kind 'kube'; known kinds: reference, upstream"),
        ("reference/", "the name after '/' is empty"),
        ("reference:", "no fault after ':'"),
        ("reference/Big", "name 'Big' is not a valid schedulerName"),
        ("reference:overcommitt", "unknown fault 'overcommitt'; known faults: overcommit,"),
        ("upstream/mine", "the upstream kube-scheduler keeps its own name 'default-scheduler'"),
        ("upstream:overcommit", "faults apply to the reference scheduler only"),
    ],
)
def test_bad_specs_name_the_spec_and_the_rule(text: str, rule: str) -> None:
    with pytest.raises(SandboxError) as err:
        parse_spec(text)
    assert str(err.value).startswith(f"--scheduler {text!r}: {rule}")
    assert "(syntax: KIND[/NAME][:FAULT,FAULT...])" in str(err.value)


def test_names_must_be_unique() -> None:
    with pytest.raises(
        SandboxError, match="the name 'gpuconf-reference' is already used by --scheduler 'reference'"
    ):
        parse_specs(["reference", "reference/gpuconf-reference:overcommit"])
    with pytest.raises(SandboxError, match="already used"):
        parse_specs(["upstream", "upstream"])
    assert [s.name for s in parse_specs(["reference", "reference/b", "upstream"])] == [
        "gpuconf-reference",
        "b",
        "default-scheduler",
    ]


def test_cli_fault_applies_to_every_reference_spec() -> None:
    assert with_faults(["reference", "reference/b:omit-limit", "upstream"], ["mix-modes"]) == (
        "reference:mix-modes",
        "reference/b:mix-modes,omit-limit",
        "upstream",
    )
    with pytest.raises(SandboxError, match="no --scheduler reference"):
        with_faults(["upstream"], ["mix-modes"])
    with pytest.raises(SandboxError, match="--fault: unknown fault 'x'"):
        with_faults(["reference"], ["x"])


def _args(scheduler: list[str] | None = None, fault: list[str] | None = None) -> argparse.Namespace:
    return argparse.Namespace(scheduler=scheduler, fault=fault or [], dir=Path("/nonexistent"))


def test_cli_defaults_to_the_reference_scheduler_and_none_means_none() -> None:
    assert schedulers_from_args(_args()) == ("reference",)
    assert schedulers_from_args(_args(["none"])) == ()
    assert schedulers_from_args(_args(["upstream", "reference/b"])) == ("upstream", "reference/b")
    assert schedulers_from_args(_args(None, ["mix-modes"])) == ("reference:mix-modes",)
    with pytest.raises(SandboxError, match="cannot be combined"):
        schedulers_from_args(_args(["none", "upstream"]))


def test_cli_turns_scheduler_and_fault_options_into_the_sandbox_config() -> None:
    from conformance.cli import build_parser
    from fixtures.sandbox.cli import sandbox_from_args

    def config(*argv: str) -> tuple[str, ...]:
        return sandbox_from_args(
            build_parser().parse_args(["sandbox", "up", "--dir", "/x", *argv])
        ).config.schedulers

    assert config() == ("reference",)
    assert config("--scheduler", "none") == ()
    assert config("--scheduler", "reference", "--scheduler", "upstream", "--fault", "mix-modes") == (
        "reference:mix-modes",
        "upstream",
    )
    with pytest.raises(SystemExit, match="gpuconf: error: --fault: unknown fault 'bogus'"):
        config("--fault", "bogus")
    assert config("--scheduler", "kube") == ("kube",)  # refused by `up`, before anything starts


# --------------------------------------------------------------------------- rbac


def test_rbac_grants_exactly_the_calls_the_scheduler_makes() -> None:
    granted = {(r, v) for rule in rbac.RULES for r in rule["resources"] for v in rule["verbs"]}
    assert granted == {
        ("pods", "get"),
        ("pods", "list"),
        ("pods", "watch"),
        ("pods", "patch"),
        ("pods", "create"),  # device discovery
        ("pods", "delete"),
        ("namespaces", "create"),
        ("pods/binding", "create"),
        ("pods/status", "patch"),
        ("nodes", "list"),
        ("nodes", "watch"),
        ("events", "create"),
    }
    role, binding = rbac.manifests("x")
    assert binding["subjects"] == [
        {"apiGroup": rbac.RBAC_GROUP, "kind": "User", "name": "gpuconf:scheduler:x"}
    ]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]

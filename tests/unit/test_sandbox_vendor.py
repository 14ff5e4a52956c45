"""A vendor's scheduler in the sandbox, without a cluster: ``--scheduler-command`` and ``--manifests``
are read and checked before anything starts; the commands become components with stable argv."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import pytest

from fixtures.sandbox import apply, topology
from fixtures.sandbox.cli import add_sandbox_options, sandbox_from_args, schedulers_from_args
from fixtures.sandbox.config import SandboxConfig
from fixtures.sandbox.errors import SandboxError
from fixtures.sandbox.scheduler import command

STACK = Path(__file__).resolve().parents[1] / "data" / "vendor-stack"


def args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_sandbox_options(parser)
    return parser.parse_args(list(argv))


# ------------------------------------------------------------------------------- the options


def test_a_scheduler_command_replaces_the_default_reference_scheduler() -> None:
    assert schedulers_from_args(args()) == ("reference",)
    assert schedulers_from_args(args("--scheduler-command", "true")) == ()
    both = args("--scheduler-command", "true", "--scheduler", "reference")
    assert schedulers_from_args(both) == ("reference",)


def test_sandbox_options_carry_commands_and_absolute_manifest_paths(tmp_path: Path) -> None:
    box = sandbox_from_args(
        args("--dir", str(tmp_path), "--scheduler-command", "a {kubeconfig}", "--manifests", "tests/data")
    )
    assert box.config.scheduler_commands == ("a {kubeconfig}",)
    (manifests,) = box.config.manifests
    assert Path(manifests).is_absolute()


def test_a_relative_state_folder_becomes_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Workloads run in folders of their own: a relative folder would name a device socket they
    cannot reach (their backend unavailable, which preflight stops on)."""
    monkeypatch.chdir(tmp_path)
    box = sandbox_from_args(args("--dir", "rel-sb"))
    assert box.config.state_dir == tmp_path.resolve() / "rel-sb"


# ------------------------------------------------------------------------------- the commands


def test_parse_command_splits_and_checks_placeholders_and_program() -> None:
    words = command.parse_command(f"{sys.executable} -m x --kubeconfig={{kubeconfig}} --json '{{\"a\": 1}}'")
    assert words[-1] == '{"a": 1}' and words[-3] == "--kubeconfig={kubeconfig}"
    with pytest.raises(SandboxError, match=r"unknown placeholder \{kubecfg\}; known: \{kubeconfig\}"):
        command.parse_command("true --kubeconfig {kubecfg}")
    with pytest.raises(SandboxError, match="neither on PATH nor a file"):
        command.parse_command("/no/such/scheduler --x")
    with pytest.raises(SandboxError, match="the command is empty"):
        command.parse_command("   ")
    with pytest.raises(SandboxError, match="cannot split"):
        command.parse_command("true 'unclosed")


def test_fill_replaces_known_placeholders_inside_words_only() -> None:
    filled = command.fill(
        ["s", "--kubeconfig={kubeconfig}", "{dir}/conf.yaml", "{other}", '{"k": 1}'],
        {"kubeconfig": "/k", "dir": "/d"},
    )
    assert filled == ("s", "--kubeconfig=/k", "/d/conf.yaml", "{other}", '{"k": 1}')


def test_the_check_runs_before_anything_starts() -> None:
    topo = topology.load("default")
    with pytest.raises(SandboxError, match="--scheduler-command 'nope-not-a-program'"):
        command.SOURCE.check(SandboxConfig(scheduler_commands=("nope-not-a-program",)), topo)


class FakeHost:
    """What a component source may use of a sandbox, recording what it was asked."""

    def __init__(self, folder: Path, commands: tuple[str, ...]) -> None:
        self.config = SandboxConfig(state_dir=folder, scheduler_commands=commands)
        self.dir = folder
        self.server = "https://127.0.0.1:1"
        self.ca_file = folder / "ca.crt"
        self.issued: list[tuple[str, str]] = []

    def api_client(self, kubeconfig: Path | None = None) -> Any:
        return object()

    def issue_kubeconfig(self, name: str, user: str, groups: tuple[str, ...] = ()) -> Path:
        self.issued.append((name, user))
        return self.dir / f"{name}.kubeconfig"

    def recorded_argv(self, component: str) -> tuple[str, ...] | None:
        return None


def test_each_command_is_a_component_with_its_own_identity(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from enforcement import clusterrbac

    applied: list[Any] = []
    monkeypatch.setattr(clusterrbac, "apply", lambda _api, objects: applied.extend(objects))
    host = FakeHost(tmp_path, ("true --kubeconfig {kubeconfig} --ca {ca} --server {server}", "true {dir}"))
    first, second = command.SOURCE.components(host, topology.load("default"))  # type: ignore[arg-type]
    assert first.name == "scheduler/command-1" and second.name == "scheduler/command-2"
    kubeconfig = str(tmp_path / "scheduler-command-1.kubeconfig")
    assert first.argv == (
        "true",
        "--kubeconfig",
        kubeconfig,
        "--ca",
        str(tmp_path / "ca.crt"),
        "--server",
        host.server,
    )
    assert ("KUBECONFIG", kubeconfig) in first.env
    assert second.argv == ("true", str(tmp_path / "schedulers" / "command-2"))
    assert (tmp_path / "schedulers" / "command-2").is_dir()
    assert host.issued == [
        ("scheduler-command-1", "gpuconf:scheduler-command:1"),
        ("scheduler-command-2", "gpuconf:scheduler-command:2"),
    ]
    assert [b["subjects"][0]["name"] for b in applied] == [
        "gpuconf:scheduler-command:1",
        "gpuconf:scheduler-command:2",
    ]
    assert {b["roleRef"]["name"] for b in applied} == {"cluster-admin"}
    # Stable argv: the same commands give the same components, so a reused sandbox restarts nothing.
    again = command.SOURCE.components(host, topology.load("default"))  # type: ignore[arg-type]
    assert [c.argv for c in again] == [first.argv, second.argv]


def test_a_command_counts_as_up_only_after_it_stayed_up(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    monkeypatch.setattr(command.time, "monotonic", lambda: clock[0])
    ready = command._StillRunningAfter(2.0)
    assert not ready()
    clock[0] += 1.9
    assert not ready()
    clock[0] += 0.2
    assert ready()


# ------------------------------------------------------------------------------- the manifests


def test_manifests_load_crds_first_then_namespaces_then_the_rest() -> None:
    loaded = apply.load([STACK])
    crds, rest = apply.ordered(loaded)
    assert [m.kind for m in crds] == ["CustomResourceDefinition"]
    assert [m.kind for m in rest] == ["Namespace", "ToyQueue"]
    assert rest[1].source.endswith("20-namespace-and-queue.yaml#1")


def test_lists_and_json_are_read(tmp_path: Path) -> None:
    (tmp_path / "a.yaml").write_text(
        "apiVersion: v1\nkind: List\nitems:\n"
        "- {apiVersion: v1, kind: ConfigMap, metadata: {name: one, namespace: x}}\n"
        "- {apiVersion: v1, kind: ConfigMap, metadata: {name: two, namespace: x}}\n"
    )
    (tmp_path / "b.json").write_text('{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}}')
    (tmp_path / "notes.txt").write_text("not a manifest")
    names = [m.name for m in apply.load([tmp_path])]
    assert names == ["one", "two", "x"]


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("kind: ConfigMap\nmetadata: {name: a}\n", "missing apiVersion"),
        ("apiVersion: v1\nkind: ConfigMap\n", "missing metadata.name"),
        ("apiVersion: v1\nkind: [unclosed\n", "cannot read it"),
    ],
)
def test_a_bad_manifest_is_refused_naming_the_file(tmp_path: Path, text: str, says: str) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    with pytest.raises(SandboxError, match=says) as caught:
        apply.load([bad])
    assert str(bad) in str(caught.value)


def test_a_missing_manifest_path_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SandboxError, match="no such file or folder"):
        apply.load([tmp_path / "absent"])

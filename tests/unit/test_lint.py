"""``gpuconf lint`` and ``gpuconf checklist`` on the fixture manifests: findings, exit codes, formats."""

from __future__ import annotations

import argparse
import io
import json
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from conformance import lint
from enforcement.rules import ANNOTATION_KEYS, RULES

DATA = Path(__file__).resolve().parents[1] / "data" / "manifests"
UUID0 = "GPU-00000000-0000-0000-0000-000000000000"
UUID2 = "GPU-22222222-2222-2222-2222-222222222222"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="gpuconf")
    lint.register(parser.add_subparsers())
    args = parser.parse_args(list(argv))
    code = args.func(args)
    out, err = capsys.readouterr()
    return code, out, err


def findings(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, set[tuple[str, ...]]]:
    code, out, _ = run(capsys, "lint", "--output", "json", *argv)
    return code, {
        (f["kind"], f["namespace"], f["name"], f["rule"], f["key"], f["severity"]) for f in json.loads(out)
    }


# ----------------------------------------------------------------------------- one file per kind

KIND_CASES = [
    ("pod.yaml", 0, set()),
    (
        "deployment.yaml",
        1,
        {("Deployment", "team-a", "infer", "fraction-value", "gpu-fraction", "error")},
    ),
    (
        "statefulset.yaml",
        1,
        {
            (
                "StatefulSet",
                "team-b",
                "vector-db",
                "unknown-container",
                "nvidia.com/container.db.gpu-memory.request",
                "error",
            )
        },
    ),
    (
        "daemonset.yaml",
        1,
        {
            (
                "DaemonSet",
                "kube-system",
                "probe",
                "mode-word",
                "nvidia.com/container.probe.gpu-compute.mode",
                "error",
            )
        },
    ),
    ("replicaset.yaml", 1, {("ReplicaSet", "team-a", "embed", "gpu-memory-value", "gpu-memory", "error")}),
    (
        "job.yaml",
        1,
        {
            (
                "Job",
                "team-c",
                "finetune",
                "devices-set-by-author",
                "nvidia.com/container.worker.gpus.devices",
                "error",
            )
        },
    ),
    (
        "cronjob.yaml",
        1,
        {
            (
                "CronJob",
                "team-c",
                "nightly-eval",
                "request-exceeds-limit",
                "nvidia.com/container.eval.gpu-memory.request",
                "error",
            )
        },
    ),
    ("list.yaml", 1, {("Pod", "team-a", "listed-unquoted", "value-not-string", "gpu-fraction", "error")}),
    (
        "pod.json",
        1,
        {
            (
                "Pod",
                "team-a",
                "json-pod",
                "memory-quantity",
                "nvidia.com/container.app.gpu-memory.request",
                "error",
            )
        },
    ),
    (
        "multi.yaml",
        1,
        {("Pod", "team-a", "multi-orphan-limit", "limit-without-request", "gpu-memory.limit", "error")},
    ),
    (
        "warning-only.yaml",
        0,
        {
            (
                "Pod",
                "team-a",
                "no-limit",
                "limit-missing",
                "nvidia.com/container.app.gpu-memory.limit",
                "warning",
            )
        },
    ),
    (
        "placement.yaml",
        1,
        {
            (
                "Pod",
                "team-a",
                "placed-no-devices",
                "devices-missing",
                "nvidia.com/container.app.gpus.devices",
                "error",
            ),
            (
                "Pod",
                "team-a",
                "placed-ghost-gpu",
                "devices-unknown",
                "nvidia.com/container.app.gpus.devices",
                "error",
            ),
            # placed-ok names GPU 0 by UUID, placed-sm by index: one GPU, two modes
            ("Node", "", "gpu-a-0", "mode-mixing", UUID0, "error"),
            # placed-big-1 (index 2) and placed-big-2 (UUID): 20 GiB on a 16 GiB GPU; placed-done is finished
            ("Node", "", "gpu-a-0", "gpu-overcommit", UUID2, "error"),
        },
    ),
]


@pytest.mark.parametrize(("name", "code", "expected"), KIND_CASES, ids=[c[0] for c in KIND_CASES])
def test_each_manifest_yields_its_findings(
    capsys: pytest.CaptureFixture[str], name: str, code: int, expected: set[tuple[str, ...]]
) -> None:
    assert findings(capsys, str(DATA / name)) == (code, expected)


def test_sources_name_file_line_and_list_item(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(capsys, "lint", "-o", "json", str(DATA / "list.yaml"), str(DATA / "multi.yaml"))
    sources = {f["name"]: f["source"] for f in json.loads(out)}
    assert sources["listed-unquoted"] == f"{DATA / 'list.yaml'}:2 items[1]"
    assert sources["multi-orphan-limit"] == f"{DATA / 'multi.yaml'}:24"


def test_json_findings_carry_every_field(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(capsys, "lint", "-o", "json", str(DATA / "job.yaml"))
    (finding,) = json.loads(out)
    assert set(finding) == {
        "source",
        "kind",
        "namespace",
        "name",
        "container",
        "key",
        "rule",
        "severity",
        "message",
        "fix",
    }
    assert finding["container"] == "worker"
    assert finding["fix"] == RULES["devices-set-by-author"].fix


def test_clean_input_prints_an_empty_json_list(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "lint", "-o", "json", str(DATA / "pod.yaml"))[:2] == (0, "[]\n")


# ----------------------------------------------------------------------------- inputs


def test_directory_is_read_recursively(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    (tmp_path / "nested").mkdir()
    shutil.copy(DATA / "pod.yaml", tmp_path / "a.yaml")
    shutil.copy(DATA / "cronjob.yaml", tmp_path / "nested" / "b.yml")
    shutil.copy(DATA / "pod.json", tmp_path / "nested" / "c.json")
    (tmp_path / "notes.txt").write_text("not: [a manifest")
    code, found = findings(capsys, str(tmp_path))
    assert code == 1
    assert {(f[0], f[2], f[3]) for f in found} == {
        ("CronJob", "nightly-eval", "request-exceeds-limit"),
        ("Pod", "json-pod", "memory-quantity"),
    }


def test_stdin_yaml(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO((DATA / "deployment.yaml").read_text()))
    code, out, _ = run(capsys, "lint", "-o", "json", "-")
    assert code == 1
    (finding,) = json.loads(out)
    assert (finding["kind"], finding["rule"], finding["source"]) == (
        "Deployment",
        "fraction-value",
        "<stdin>:2",
    )


def test_stdin_json(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO((DATA / "pod.json").read_text()))
    code, found = findings(capsys, "-")
    assert code == 1
    assert {f[3] for f in found} == {"memory-quantity"}


# ----------------------------------------------------------------------------- exit codes


def test_exit_0_when_clean_and_for_warnings_alone(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "lint", str(DATA / "pod.yaml"))[0] == 0
    assert run(capsys, "lint", str(DATA / "warning-only.yaml"))[0] == 0


def test_strict_fails_on_warnings(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "lint", "--strict", str(DATA / "warning-only.yaml"))[0] == 1
    assert run(capsys, "lint", "--strict", str(DATA / "pod.yaml"))[0] == 0


def test_exit_1_on_errors(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys, "lint", str(DATA / "pod.yaml"), str(DATA / "job.yaml"))[0] == 1


def test_yaml_syntax_error_names_file_and_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "lint", str(DATA / "pod.yaml"), str(DATA / "bad-syntax.yaml"))
    assert code == 2 and out == ""
    assert f"{DATA / 'bad-syntax.yaml'}:9: invalid YAML" in err
    assert "line 6" in err  # where the unterminated string starts


def test_json_syntax_error_names_file_and_line(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "lint", str(DATA / "bad-syntax.json"))
    assert code == 2
    assert f"{DATA / 'bad-syntax.json'}:4:" in err and "invalid JSON" in err


def test_missing_file_is_unreadable_input(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "lint", str(tmp_path / "nope.yaml"))
    assert code == 2 and "cannot read" in err and "nope.yaml" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["lint"], "give PATH"),
        (["lint", "--namespace", "x", "pod.yaml"], "need --cluster"),
        (["lint", "--all-namespaces", "pod.yaml"], "need --cluster"),
    ],
)
def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str], message: str) -> None:
    code, _, err = run(capsys, *argv)
    assert code == 2 and message in err


@pytest.mark.parametrize(
    "argv",
    [
        ["lint", "--output", "xml", "pod.yaml"],
        ["lint", "--cluster", "--namespace", "a", "--all-namespaces"],
        ["lint", "--gpu-reserve-mib", "lots", "pod.yaml"],
    ],
)
def test_argparse_usage_errors_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        run(capsys, *argv)
    assert caught.value.code == 2


def test_unreachable_cluster_is_unreadable_input(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: k, cluster: {server: 'http://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: k, user: u, namespace: team-a}}]\n"
    )
    code, out, err = run(capsys, "lint", "--cluster", "--kubeconfig", str(kubeconfig))
    assert code == 2 and out == ""
    assert "cannot" in err


def test_bad_kubeconfig_is_unreadable_input(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, _, err = run(capsys, "lint", "--cluster", "--kubeconfig", str(tmp_path / "missing"))
    assert code == 2 and "kubeconfig" in err


# ----------------------------------------------------------------------------- options


def test_sm_sharing_disabled(capsys: pytest.CaptureFixture[str]) -> None:
    _, found = findings(capsys, "--sm-sharing-disabled", str(DATA / "placement.yaml"))
    assert (
        "Pod",
        "team-b",
        "placed-sm",
        "mode-disabled",
        "nvidia.com/container.app.gpu-compute.mode",
        "error",
    ) in found


def test_gpu_reserve_shrinks_usable_memory(capsys: pytest.CaptureFixture[str]) -> None:
    # GPU 0 holds 4096 + 2048 MiB: fine on 16384, overcommitted once 12000 MiB are held back
    _, found = findings(capsys, "--gpu-reserve-mib", "12000", str(DATA / "placement.yaml"))
    assert ("Node", "", "gpu-a-0", "gpu-overcommit", UUID0, "error") in found


# ----------------------------------------------------------------------------- formats


def test_table_format(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "lint", str(DATA / "warning-only.yaml"), str(DATA / "cronjob.yaml"))
    assert code == 1
    lines = out.splitlines()
    assert lines[0].split() == ["SEVERITY", "RULE", "OBJECT", "CONTAINER", "KEY", "MESSAGE"]
    assert lines[1].startswith("warning   limit-missing") and "Pod team-a/no-limit" in lines[1]
    assert lines[2].strip() == f"fix: {RULES['limit-missing'].fix.replace('<c>', 'app')}"
    assert lines[3].strip() == f"at:  {DATA / 'warning-only.yaml'}:2"
    assert "request-exceeds-limit" in lines[4] and "CronJob team-c/nightly-eval" in lines[4]
    assert lines[-1] == "1 error(s), 1 warning(s) in 2 object(s) checked"


def test_table_format_when_clean(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        run(capsys, "lint", str(DATA / "pod.yaml"))[1] == "0 error(s), 0 warning(s) in 1 object(s) checked\n"
    )


def _junit(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, ET.Element]:
    code, out, _ = run(capsys, "lint", "-o", "junit", *argv)
    assert out.startswith("<?xml")
    return code, ET.fromstring(out)


def test_junit_format(capsys: pytest.CaptureFixture[str]) -> None:
    code, root = _junit(
        capsys, str(DATA / "pod.yaml"), str(DATA / "warning-only.yaml"), str(DATA / "placement.yaml")
    )
    assert code == 1
    suite = root.find("testsuite")
    assert suite is not None
    cases = {(c.get("classname"), c.get("name")): c for c in suite.findall("testcase")}
    # 1 + 1 + 7 Pods checked, plus the Node that the per-GPU findings name
    assert len(cases) == 10 and suite.get("tests") == "10"
    assert cases[("Pod", "team-a/frac-ok")].find("failure") is None
    warned = cases[("Pod", "team-a/no-limit")]
    assert warned.find("failure") is None and "limit-missing" in (warned.findtext("system-out") or "")
    assert (warned.get("file"), warned.get("line")) == (str(DATA / "warning-only.yaml"), "2")
    node = cases[("Node", "gpu-a-0")].find("failure")
    assert node is not None and node.get("type") == "mode-mixing, gpu-overcommit"
    ghost = cases[("Pod", "team-a/placed-ghost-gpu")].find("failure")
    assert ghost is not None and "devices-unknown" in (ghost.text or "")
    assert suite.get("failures") == root.get("failures") == "3"


def test_junit_strict_fails_warnings(capsys: pytest.CaptureFixture[str]) -> None:
    code, root = _junit(capsys, "--strict", str(DATA / "warning-only.yaml"))
    assert code == 1
    (case,) = root.iter("testcase")
    failure = case.find("failure")
    assert failure is not None and failure.get("type") == "limit-missing"


# ----------------------------------------------------------------------------- checklist


def test_checklist_lists_every_rule_and_key(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "checklist")
    assert code == 0
    assert out.startswith("# GPU-fraction annotation checklist")
    for r in RULES.values():
        assert f"- [ ] **`{r.id}`** ({r.severity}): {r.statement}" in out
        assert f"  - Fix: {r.fix}" in out
    for k in ANNOTATION_KEYS:
        assert f"| `{k.key}` |" in out
    assert "time-slicing \\| sm-sharing" in out  # a pipe inside a cell is escaped
    assert out.count("- [ ] ") == len(RULES)


def test_checklist_and_lint_share_rule_ids(capsys: pytest.CaptureFixture[str]) -> None:
    _, out, _ = run(capsys, "checklist")
    _, found = findings(capsys, *(str(DATA / c[0]) for c in KIND_CASES))
    assert {f[3] for f in found} <= {r for r in RULES if f"`{r}`" in out}


def test_commands_are_wired_into_gpuconf(capsys: pytest.CaptureFixture[str]) -> None:
    from conformance.cli import main

    assert main(["checklist"]) == 0
    assert "## Annotations" in capsys.readouterr().out
    assert main(["lint", "-o", "json", str(DATA / "job.yaml")]) == 1
    assert json.loads(capsys.readouterr().out)[0]["rule"] == "devices-set-by-author"


def test_junit_survives_control_characters(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    manifest = {
        "kind": "Pod",
        "metadata": {
            "name": "odd",
            "annotations": {"nvidia.com/container.app\u0001.gpu-memory.request": "1Gi"},
        },
        "spec": {"containers": [{"name": "app"}]},
    }
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(manifest)))
    code, root = _junit(capsys, "-")
    assert code == 1
    failure = root.find("testsuite/testcase/failure")
    assert failure is not None and failure.get("type") == "unknown-container"

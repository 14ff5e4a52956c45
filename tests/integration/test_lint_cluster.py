"""``gpuconf lint --cluster`` against the sandbox: live Pods, the Nodes' GPU records, per-GPU checks.

Pods are created bound (``spec.nodeName``) the way a scheduler would leave them, in a namespace of
this test's own, and audited with ``--namespace`` so that other tests' Pods on the same GPUs
cannot change the verdict. Unbound Pods name a scheduler that does not exist, so nothing binds them
while the test runs.
"""

from __future__ import annotations

import argparse
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client.rest import ApiException

from conformance import lint
from fixtures.suite import manifests

pytestmark = pytest.mark.sandbox

NODE = "gpu-a-0"
NO_SCHEDULER = "gpuconf-lint-test-no-such-scheduler"


def nv(container: str, suffix: str) -> str:
    return f"nvidia.com/container.{container}.{suffix}"


def pod(name: str, annotations: dict[str, str], node: str | None = NODE) -> dict[str, Any]:
    return manifests.pod(
        name,
        [manifests.sleeper("app", 600, image="gpuconf/workload:test")],
        annotations=annotations,
        node_name=node,
        scheduler=None if node else NO_SCHEDULER,
        restart_policy="Always",
        grace_seconds=0,
    )


def placed(devices: str, mode: str = "time-slicing", limit: str | None = "2Gi") -> dict[str, str]:
    out = {
        nv("app", "gpu-memory.request"): "1Gi",
        nv("app", "gpu-compute.mode"): mode,
        nv("app", "gpus.devices"): devices,
    }
    if limit:
        out[nv("app", "gpu-memory.limit")] = limit
    return out


@pytest.fixture
def lint_namespace(sandbox: Any) -> Iterator[str]:
    core = sandbox.core_v1()
    name = f"lint-{uuid.uuid4().hex[:10]}"
    core.create_namespace({"metadata": {"name": name, "labels": {"gpuconf.io/test": "lint"}}})
    try:
        yield name
    finally:
        try:
            core.delete_namespace(name)
        except ApiException as exc:
            if exc.status != 404:
                raise


def run_lint(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser(prog="gpuconf")
    lint.register(parser.add_subparsers())
    args = parser.parse_args(["lint", *argv])
    code = args.func(args)
    out, err = capsys.readouterr()
    return code, out, err


def test_lint_audits_live_pods_against_their_nodes(
    sandbox: Any, lint_namespace: str, capsys: pytest.CaptureFixture[str]
) -> None:
    core = sandbox.core_v1()
    uuids = core.read_node(NODE).metadata.annotations["gpuconf.io/gpu-uuids"].split(",")
    assert len(uuids) == 4
    pods = [
        pod("fenced", placed(uuids[3])),
        # GPU 1, once by index and once by UUID: the same GPU in two modes
        pod("slicer", placed("1")),
        pod("sharer", placed(uuids[1], mode="sm-sharing")),
        pod("unfenced", {nv("app", "gpu-memory.request"): "1Gi", nv("app", "gpu-memory.limit"): "1Gi"}),
        pod("ghost-gpu", placed("7")),
        pod("no-limit", placed(uuids[2], limit=None)),
        pod("self-placed", {"gpu-fraction": "0.5", nv("app", "gpus.devices"): "0"}, node=None),
    ]
    for body in pods:
        core.create_namespaced_pod(lint_namespace, body)

    code, out, err = run_lint(
        capsys,
        "--cluster",
        "--kubeconfig",
        str(sandbox.kubeconfig),
        "--namespace",
        lint_namespace,
        "-o",
        "json",
    )
    assert code == 1, err
    found = {
        (f["kind"], f["namespace"], f["name"], f["rule"], f["key"], f["severity"]) for f in json.loads(out)
    }
    ns, devices = lint_namespace, nv("app", "gpus.devices")
    assert found == {
        ("Pod", ns, "unfenced", "devices-missing", devices, "error"),
        ("Pod", ns, "ghost-gpu", "devices-unknown", devices, "error"),
        ("Pod", ns, "no-limit", "limit-missing", nv("app", "gpu-memory.limit"), "warning"),
        ("Pod", ns, "self-placed", "devices-set-by-author", devices, "error"),
        ("Node", "", NODE, "mode-mixing", uuids[1], "error"),
    }
    assert all(f["source"] == "cluster" for f in json.loads(out))


def test_lint_reads_kubeconfig_from_the_environment(
    sandbox: Any, lint_namespace: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    sandbox.core_v1().create_namespaced_pod(lint_namespace, pod("no-limit", placed("0", limit=None)))
    monkeypatch.setenv("KUBECONFIG", str(sandbox.kubeconfig))

    code, out, _ = run_lint(capsys, "--cluster", "--namespace", lint_namespace)
    assert code == 0  # a warning alone passes
    assert "limit-missing" in out and f"Pod {lint_namespace}/no-limit" in out

    code, _, _ = run_lint(capsys, "--cluster", "--namespace", lint_namespace, "--strict")
    assert code == 1

    code, out, _ = run_lint(capsys, "--cluster", "--all-namespaces", "-o", "json")
    ours = [f for f in json.loads(out) if f["namespace"] == lint_namespace]
    assert [(f["name"], f["rule"]) for f in ours] == [("no-limit", "limit-missing")]

"""Metrics text per fraction and for the agent; served over HTTP; and the deploy manifests' consistency."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

import yaml

from enforcement.agent import rbac
from enforcement.agent.metrics import FAMILIES, Metrics, MetricsServer
from enforcement.agent.registry import Registry
from enforcement.agent.testing import make_pod, placement, sim_agent
from enforcement.backends import ClientGpuUsage, ClientUsage, GpuUsage, Usage
from workloads.simwire import SIM_TOKEN_ENV

MIB = 1 << 20
DEPLOY = Path(__file__).resolve().parents[2] / "enforcement" / "deploy"
SAMPLE = re.compile(r"^([a-z_]+)(\{[^}]*\})? (-?[0-9.e+]+)$")


def series(text: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line.startswith("#") or not line:
            continue
        m = SAMPLE.match(line)
        assert m, f"not a valid sample line: {line!r}"
        out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def test_per_fraction_series_carry_pod_and_gpu_labels_and_the_right_numbers() -> None:
    a = sim_agent()
    pod = make_pod("p", placement("main", 256, 512, devices=("1",)))
    adj = a.core.create_container(pod, "main")
    ctx, _ = a.node.open_context(adj.env[SIM_TOKEN_ENV])
    a.node.alloc(ctx, 0, 300 * MIB)
    text = a.core.metrics.render(a.backend.usage(), a.core.registry)
    values = series(text)
    uid, gpu = pod["metadata"]["uid"], a.node.gpus[1].uuid
    labels = f'{{namespace="ns",pod="p",pod_uuid="{uid}",container="main",gpu_uuid="{gpu}",gpu="1"}}'
    assert values["gpu_fractioning_gpu_memory_used_bytes" + labels] == 300 * MIB
    assert values["gpu_fractioning_gpu_memory_limit_bytes" + labels] == 512 * MIB
    assert values["gpu_fractioning_gpu_memory_request_bytes" + labels] == 256 * MIB
    assert values[f'gpu_fractioning_node_gpu_memory_used_bytes{{gpu_uuid="{gpu}",gpu="1"}}'] == 300 * MIB
    assert values["gpu_fractioning_agent_admitted_containers_total"] == 1
    assert values["gpu_fractioning_agent_fenced_containers"] == 1
    assert values['gpu_fractioning_agent_evictions_total{reason="pressure"}'] == 0
    # the simulated device measures no SM utilisation: the family is absent, not a made-up 0
    assert "gpu_fractioning_gpu_sm_utilization_percent" not in text
    for name, family in FAMILIES.items():
        if name in text:
            assert f"# TYPE {name} {family.kind}" in text


def test_sm_utilisation_and_label_escaping() -> None:
    usage = Usage(
        (GpuUsage(0, "GPU-x", 1024, 10, 1014, 5, "sm-sharing"),),
        (
            ClientUsage(
                'odd"name',
                "sm-sharing",
                {},
                (ClientGpuUsage("GPU-x", 0, 0, 10, 20, 5, sm_percent=37.5),),
            ),
        ),
    )
    text = Metrics().render(usage, Registry())
    assert 'pod="odd\\"name"' in text
    assert re.search(r"gpu_fractioning_gpu_sm_utilization_percent\{.*\} 37.5$", text, re.M)


def test_metrics_render_without_a_backend() -> None:
    text = Metrics().render(None, Registry())
    assert "gpu_fractioning_agent_fenced_containers 0" in text
    assert "gpu_fractioning_gpu_memory_used_bytes" not in text


def test_metrics_server_serves_text_and_health() -> None:
    a = sim_agent()
    a.core.create_container(make_pod("p", placement("main", 16, 16)), "main")
    server = MetricsServer(
        0, a.core.metrics, a.core.registry, a.backend.usage, lambda: True, bind="127.0.0.1"
    )
    server.start()
    try:
        base = f"http://127.0.0.1:{server.port}"
        with urllib.request.urlopen(f"{base}/metrics", timeout=10) as resp:
            assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            assert 'pod="p"' in resp.read().decode()
        with urllib.request.urlopen(f"{base}/healthz", timeout=10) as resp:
            assert resp.status == 200
    finally:
        server.close()


# ---- deploy manifests


def load(name: str) -> dict:
    return yaml.safe_load((DEPLOY / name).read_text())


def test_the_deployed_cluster_role_is_exactly_the_agent_rules() -> None:
    role = load("clusterrole.yaml")
    assert role["metadata"]["name"] == rbac.ROLE_NAME
    assert role["rules"] == [dict(r) for r in rbac.RULES] == rbac.cluster_role()["rules"]
    binding = load("clusterrolebinding.yaml")
    sa = load("serviceaccount.yaml")
    assert binding["roleRef"]["name"] == rbac.ROLE_NAME
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": sa["metadata"]["namespace"]}
    ]


def test_daemonset_targets_gpu_nodes_with_a_placeholder_image_and_the_agent_cli() -> None:
    ds = load("daemonset.yaml")
    spec = ds["spec"]["template"]["spec"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    (container,) = spec["containers"]
    assert container["image"] == "gpuconf-agent:TAG"  # no registry host
    assert container["command"][-2:] == ["-m", "enforcement.agent"]
    from enforcement.agent.agent import build_parser

    args = build_parser().parse_args(container["args"])
    assert args.backend == "mps" and args.metrics_port == 9464
    kustomization = load("kustomization.yaml")
    assert sorted(kustomization["resources"]) == sorted(
        p.name for p in DEPLOY.glob("*.yaml") if p.name != "kustomization.yaml"
    )


def test_ensure_rbac_creates_then_replaces() -> None:
    from kubernetes.client.rest import ApiException

    calls: list[tuple[str, str]] = []

    class FakeRbac:
        def __init__(self, exists: bool) -> None:
            self.exists = exists

        def _create(self, kind: str, body: dict) -> None:
            calls.append((f"create-{kind}", body["metadata"]["name"]))
            if self.exists:
                raise ApiException(status=409)

        def create_cluster_role(self, body, **_k):
            self._create("role", body)

        def create_cluster_role_binding(self, body, **_k):
            self._create("binding", body)

        def replace_cluster_role(self, name, body, **_k):
            calls.append(("replace-role", name))

        def replace_cluster_role_binding(self, name, body, **_k):
            calls.append(("replace-binding", name))
            assert body["subjects"] == [rbac.user_subject("gpuconf:agent:gpu-a-0")]

    names = rbac.ensure_rbac(FakeRbac(False), "gpuconf:agent:gpu-a-0")
    assert names == ["gpuconf-node-agent", "gpuconf-node-agent:user:gpuconf.agent.gpu-a-0"]
    rbac.ensure_rbac(FakeRbac(True), "gpuconf:agent:gpu-a-0")
    assert [c[0] for c in calls] == [
        "create-role",
        "create-binding",
        "create-role",
        "replace-role",
        "create-binding",
        "replace-binding",
    ]

"""Metrics per fraction and for the agent, read with prometheus_client's parser; served over HTTP
(text and OpenMetrics); and the deploy manifests' consistency."""

from __future__ import annotations

import urllib.request
from pathlib import Path

import yaml
from agent_pods import make_pod, placement
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

from enforcement.agent import rbac
from enforcement.agent.metrics import FAMILIES, Metrics, MetricsServer, parse, sample_value
from enforcement.agent.registry import Registry
from enforcement.agent.testing import sim_agent
from enforcement.backends import ClientGpuUsage, ClientUsage, GpuUsage, Usage
from workloads.simwire import SIM_TOKEN_ENV

MIB = 1 << 20
DEPLOY = Path(__file__).resolve().parents[2] / "enforcement" / "deploy"


def test_per_fraction_series_carry_pod_and_gpu_labels_and_the_right_numbers() -> None:
    a = sim_agent()
    pod = make_pod("p", placement("main", 256, 512, devices=("1",)))
    adj = a.core.create_container(pod, "main")
    ctx, _ = a.node.open_context(adj.env[SIM_TOKEN_ENV])
    a.node.alloc(ctx, 0, 300 * MIB)
    text = a.core.metrics.render(a.backend.usage(), a.core.registry)
    samples = parse(text)
    uid, gpu = pod["metadata"]["uid"], a.node.gpus[1].uuid
    labels = {
        "namespace": "ns",
        "pod": "p",
        "pod_uuid": uid,
        "container": "main",
        "gpu_uuid": gpu,
        "gpu": "1",
    }
    assert sample_value(samples, "gpu_fractioning_gpu_memory_used_bytes", **labels) == 300 * MIB
    assert sample_value(samples, "gpu_fractioning_gpu_memory_limit_bytes", **labels) == 512 * MIB
    assert sample_value(samples, "gpu_fractioning_gpu_memory_request_bytes", **labels) == 256 * MIB
    node_used = sample_value(samples, "gpu_fractioning_node_gpu_memory_used_bytes", gpu_uuid=gpu, gpu="1")
    assert node_used == 300 * MIB
    assert sample_value(samples, "gpu_fractioning_agent_admitted_containers_total") == 1
    assert sample_value(samples, "gpu_fractioning_agent_fenced_containers") == 1
    assert sample_value(samples, "gpu_fractioning_agent_evictions_total", reason="pressure") == 0
    # the simulated device measures no SM utilisation: the family is absent, not a made-up 0
    assert not [s for s in samples if s.name == "gpu_fractioning_gpu_sm_utilization_percent"]
    # nor is a reaction time shown before there was an eviction
    assert sample_value(samples, "gpu_fractioning_agent_last_eviction_reaction_seconds") is None
    types = {f.name: f.type for f in text_string_to_metric_families(text)}
    assert types and all(types[n.removesuffix("_total")] == f.kind for n, f in FAMILIES.items() if n in text)


def test_sm_utilisation_and_label_escaping() -> None:
    odd = 'odd"name\\with\nnewline'
    usage = Usage(
        (GpuUsage(0, "GPU-x", 1024, 10, 1014, 5, "sm-sharing"),),
        (ClientUsage(odd, "sm-sharing", {}, (ClientGpuUsage("GPU-x", 0, 0, 10, 20, 5, sm_percent=37.5),)),),
    )
    samples = parse(Metrics().render(usage, Registry()))
    (sm,) = [s for s in samples if s.name == "gpu_fractioning_gpu_sm_utilization_percent"]
    assert sm.labels["pod"] == odd and sm.value == 37.5  # escaped on the way out, read back whole


def test_counters_and_set_gauges_read_back() -> None:
    metrics = Metrics()
    metrics.inc("gpu_fractioning_agent_rejected_containers_total", reason="malformed")
    metrics.inc("gpu_fractioning_agent_rejected_containers_total", 2, reason="malformed")
    metrics.set("gpu_fractioning_agent_last_eviction_reaction_seconds", 0.25)
    assert metrics.value("gpu_fractioning_agent_rejected_containers_total", reason="malformed") == 3
    assert metrics.value("gpu_fractioning_agent_rejected_containers_total", reason="other") == 0
    assert metrics.value("gpu_fractioning_agent_last_eviction_reaction_seconds") == 0.25
    samples = parse(metrics.render(None, Registry()))
    assert sample_value(samples, "gpu_fractioning_agent_last_eviction_reaction_seconds") == 0.25


def test_metrics_render_without_a_backend() -> None:
    samples = parse(Metrics().render(None, Registry()))
    assert sample_value(samples, "gpu_fractioning_agent_fenced_containers") == 0
    assert not [s for s in samples if s.name.startswith("gpu_fractioning_gpu_memory")]


def test_metrics_server_serves_text_openmetrics_and_health() -> None:
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
            samples = parse(resp.read().decode())
        limits = [s for s in samples if s.name == "gpu_fractioning_gpu_memory_limit_bytes"]
        assert [s.labels["pod"] for s in limits] == ["p"]
        asks = urllib.request.Request(f"{base}/metrics", headers={"Accept": "application/openmetrics-text"})
        with urllib.request.urlopen(asks, timeout=10) as resp:
            assert resp.headers["Content-Type"].startswith("application/openmetrics-text")
            families = {f.name: f for f in openmetrics_families(resp.read().decode())}
        assert families["gpu_fractioning_agent_admitted_containers"].samples[0].value == 1
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
    container, plugin = spec["containers"]
    assert container["image"] == plugin["image"] == "gpuconf-agent:TAG"  # no registry host
    assert container["command"][-2:] == ["-m", "enforcement.agent"]
    from enforcement.agent.agent import NRI_PLUGIN_TIMEOUT_S, build_parser

    args = build_parser().parse_args(container["args"])
    assert args.backend == "mps" and args.metrics_port == 9464
    assert args.require_nri_plugin == NRI_PLUGIN_TIMEOUT_S  # Ready only while the plugin is registered
    # The NRI plugin beside it: containerd's NRI socket and the agent's hook socket, both mounted.
    assert plugin["command"] == ["/usr/local/bin/gpuconf-nri-plugin"]
    assert "--agent-socket=/var/run/gpuconf/agent.sock" in plugin["args"]
    assert "--nri-socket=/var/run/nri/nri.sock" in plugin["args"]
    volumes = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"]}
    mounts = {m["name"]: m["mountPath"] for m in plugin["volumeMounts"]}
    assert volumes["nri"] == mounts["nri"] == "/var/run/nri" and mounts["hook"] == "/var/run/gpuconf"
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

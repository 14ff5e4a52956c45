"""Implementation descriptions: the built-ins say what docs/contract.md §9 says, the format is checked."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from enforcement import implementations as impls
from enforcement.agent.environment import dialect_env
from enforcement.contract import Fraction
from enforcement.implementations import DescriptionError, builtins, resolve
from fixtures.suite import implementation as detect
from fixtures.suite.implementation import ImplementationError, Observed

BUILTINS = sorted(impls.BUILTIN_DIR.glob("*.yaml"))


def test_schema_file_is_the_spec() -> None:
    assert json.loads(impls.SCHEMA_FILE.read_text()) == impls.schema_document()


@pytest.mark.parametrize("path", BUILTINS, ids=lambda p: p.stem)
def test_builtin_validates_against_the_schema(path: Path) -> None:
    jsonschema.validate(yaml.safe_load(path.read_text()), impls.schema_document())


def test_the_builtins() -> None:
    assert set(builtins()) == {
        "gpuconf-reference",
        "operator-gen1",
        "operator-gen2",
        "operator-gen3",
        "operator-pr",
        "kai-scheduler",
        "contract-scheduler",
    }


def _node(name: str) -> impls.NodePart:
    part = builtins()[name].node
    assert part is not None
    return part


def test_generation_facts() -> None:
    gen1, gen2, gen3, pr = (_node(f"operator-{g}") for g in ("gen1", "gen2", "gen3", "pr"))
    assert gen1.conditions == ("gpu-sharing.nvidia.com/Ready",)
    assert gen2.conditions == gen3.conditions == ("gpu-fractioning.nvidia.com/Ready",)
    assert gen1.config and gen1.config.kind == "GpuSharingConfig"
    assert gen3.config and gen3.config.kind == "GpuFractioningConfig" and gen3.config.name == "default"
    assert gen3.config.conditions == ("FractiondReady", "MpsdReady", "Ready", "DriverUpgradeInProgress")
    assert gen3.config.fail_open == "spec.fractioningAgent.failOpen"
    assert gen3.config.annotation_prefix == "spec.fractioningAgent.annotationPrefix"
    # memory env: gen 1 plural in decimal MB (2048Mi -> 2147), gen 2 plural MiB, gen 3 singular MiB
    assert (gen1.env.memory_limit, gen1.env.memory_values(2048)) == ("NVIDIA_GPU_MEMORY_LIMITS", ("2147",))
    assert (gen2.env.memory_limit, gen2.env.memory_values(2048)) == ("NVIDIA_GPU_MEMORY_LIMITS", ("2048",))
    assert (gen3.env.memory_limit, gen3.env.memory_request) == (
        "NVIDIA_GPU_MEMORY_LIMIT",
        "NVIDIA_GPU_MEMORY_REQUEST",
    )
    assert gen3.env.pipe_directories == {"time-slicing": "/run/nvidia-mps", "sm-sharing": "/tmp/nvidia-mps"}
    assert gen3.env.visible_devices_value == "verbatim"
    # no release claims the pull request's mechanisms; the pull-request line claims all three
    for part in (gen1, gen2, gen3):
        assert not part.mechanisms
        assert part.who_refuses("request-above-limit") == "admission"
        assert part.who_refuses("unknown-device") == "runtime"
        assert not part.refusal_names_key
    assert pr.mechanisms == set(impls.MECHANISMS) and not pr.detect
    assert gen3.agent.daemon_sets == ("gpu-fractioning-fractiond",)
    assert gen3.daemon_selection["nvidia.com/gpu.deploy.client"] == "true"
    assert gen1.agent.daemon_sets == ("gpu-sharing-sharingd", "gpu-sharing-mpsd")


def test_kai_facts() -> None:
    kai = builtins()["kai-scheduler"].scheduler
    assert kai is not None
    assert (kai.devices_form, kai.writes_mode, kai.reserve_mib, kai.quantities) == (
        "uuid",
        False,
        0,
        "canonical",
    )
    assert kai.pod_labels == {"kai.scheduler/queue": "default-queue"}
    (reservation,) = kai.non_workload_pods
    assert reservation.matches(
        {"metadata": {"namespace": "kai-resource-reservation", "name": "gpu-reservation-x"}}
    )
    assert not reservation.matches({"metadata": {"namespace": "default", "name": "gpu-reservation-x"}})


def test_unknown_field_named_with_file(tmp_path: Path) -> None:
    data = yaml.safe_load((impls.BUILTIN_DIR / "operator-gen3.yaml").read_text())
    data["node"]["env"]["memoryLimits"] = "X"
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(DescriptionError, match=r"mine\.yaml: unknown field 'node\.env\.memoryLimits'"):
        impls.load_file(path)


def test_mistyped_field_named_with_file(tmp_path: Path) -> None:
    data = yaml.safe_load((impls.BUILTIN_DIR / "operator-gen3.yaml").read_text())
    data["node"]["mechanisms"] = "pinned-mps-limits"
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(DescriptionError, match=r"mine\.yaml: node\.mechanisms must be a list"):
        impls.load_file(path)


def test_user_file_loads(tmp_path: Path) -> None:
    data = yaml.safe_load((impls.BUILTIN_DIR / "operator-gen3.yaml").read_text())
    data["name"] = "my-agent"
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(data))
    assert resolve(str(path)).node is not None


def test_unknown_name_lists_the_known() -> None:
    with pytest.raises(DescriptionError, match="known: contract-scheduler, gpuconf-reference, kai-scheduler"):
        resolve("operator-gen4")


def test_one_part_named_twice() -> None:
    with pytest.raises(DescriptionError, match="both 'operator-gen3' and 'operator-gen2' describe the node"):
        impls.combine([resolve("operator-gen3"), resolve("operator-gen2")])


# ---- detection ---------------------------------------------------------------------------


def _seen(conditions: set[str], kinds: tuple[str, ...] = (), daemons: tuple[dict, ...] = ()) -> Observed:
    return Observed(
        condition_types=conditions,
        crds={
            k: {"group": "g", "version": "v1", "plural": k.lower() + "s", "scope": "Cluster"} for k in kinds
        },
        daemon_sets=list(daemons),
    )


FRACTIONING = "gpu-fractioning.nvidia.com/Ready"
GEN3_DS = {
    "name": "gpu-fractioning-fractiond",
    "namespace": "gpu-operator",
    "labels": {"app.kubernetes.io/component": "fractiond", "app.kubernetes.io/managed-by": "gpu-fractioning"},
}


def test_detects_each_generation() -> None:
    assert detect.detect_node(_seen({FRACTIONING}))[0].implementation == "gpuconf-reference"
    gen1 = _seen({"gpu-sharing.nvidia.com/Ready"}, ("GpuSharingConfig",))
    assert detect.detect_node(gen1)[0].implementation == "operator-gen1"
    gen3 = _seen({FRACTIONING}, ("GpuFractioningConfig",), (GEN3_DS,))
    part, why = detect.detect_node(gen3)
    assert part.implementation == "operator-gen3" and "gpu-operator/gpu-fractioning-fractiond" in why
    gen2 = _seen(
        {FRACTIONING}, ("GpuFractioningConfig",), ({"name": "fractiond", "namespace": "x", "labels": {}},)
    )
    assert detect.detect_node(gen2)[0].implementation == "operator-gen2"


def test_ambiguity_is_a_question() -> None:
    with pytest.raises(ImplementationError, match="ambiguous: operator-gen2 .* operator-gen3"):
        detect.detect_node(_seen({FRACTIONING}, ("GpuFractioningConfig",)))


def test_declared_gen3_on_a_gen1_cluster_names_both() -> None:
    said = detect.contradiction(
        _node("operator-gen3"), _seen({"gpu-sharing.nvidia.com/Ready"}, ("GpuSharingConfig",))
    )
    assert "operator-gen3" in said and "operator-gen1" in said and "gpu-sharing.nvidia.com/Ready" in said


def test_scheduler_detection() -> None:
    assert detect.detect_scheduler("gpuconf-reference", Observed())[0].implementation == "gpuconf-reference"
    kai = Observed(namespaces={"kai-resource-reservation"})
    assert detect.detect_scheduler("kai-scheduler", kai)[0].implementation == "kai-scheduler"
    assert detect.detect_scheduler("other", Observed())[0].implementation == "contract-scheduler"


def test_features_from_the_parts() -> None:
    kai = builtins()["kai-scheduler"].scheduler
    assert kai is not None
    got = detect.implementation_features(_node("operator-gen3"), kai)
    assert "pinned-mps-limits" not in got and got["sm-sharing"] == "implementation operator-gen3"
    assert got["gpu-fraction"] == "implementation kai-scheduler"


# ---- the emulated environment ---------------------------------------------------------------


def _fraction(mode: str = "time-slicing", portion: float | None = None) -> Fraction:
    return Fraction(
        container="main", request_mib=2048, limit_mib=4096, mode=mode, devices=("GPU-a",), portion=portion
    )


def test_dialect_env_per_generation() -> None:
    env1 = dialect_env(_node("operator-gen1"), _fraction(), ["GPU-a"], "GPU-a", "/sim")
    assert env1["NVIDIA_GPU_MEMORY_REQUESTS"] == "2147" and "NVIDIA_GPU_MEMORY_REQUEST" not in env1
    env3 = dialect_env(_node("operator-gen3"), _fraction("sm-sharing", 0.5), ["GPU-a"], " GPU-a ", "/sim")
    assert env3["NVIDIA_GPU_MEMORY_LIMIT"] == "4096" and env3["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
    assert env3["NVIDIA_VISIBLE_DEVICES"] == "GPU-a"
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in env3 and "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in env3
    pr = dialect_env(_node("operator-pr"), _fraction("sm-sharing", 0.5), ["GPU-a"], "GPU-a", "/sim")
    assert (
        pr["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"
        and pr["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    )


# ---- Pod decorations ------------------------------------------------------------------------


def test_decorations_never_override_the_suites_own() -> None:
    from fixtures.suite.decorations import Decorations, decorate, pairs

    body = {
        "metadata": {
            "labels": {"gpuconf.io/run": "r"},
            "annotations": {"nvidia.com/container.main.gpu-memory.request": "1Gi"},
        },
        "spec": {"containers": [{"name": "main", "image": "i"}]},
    }
    deco = Decorations(
        labels={"kai.scheduler/queue": "q", "gpuconf.io/run": "other"},
        annotations={"nvidia.com/container.main.gpu-memory.request": "9Gi", "team": "a"},
        priority_class="high",
        overlay={
            "spec": {
                "containers": [{"name": "main", "env": [{"name": "X", "value": "1"}]}],
                "tolerations": [{"key": "k"}],
            }
        },
    )
    out = decorate(body, deco)
    assert out["metadata"]["labels"] == {"kai.scheduler/queue": "q", "gpuconf.io/run": "r"}
    assert out["metadata"]["annotations"]["nvidia.com/container.main.gpu-memory.request"] == "1Gi"
    assert out["metadata"]["annotations"]["team"] == "a"
    assert out["spec"]["priorityClassName"] == "high"
    assert out["spec"]["containers"] == [{"name": "main", "image": "i", "env": [{"name": "X", "value": "1"}]}]
    assert pairs(["a=1,b=2", "c=3"], "--pod-label") == {"a": "1", "b": "2", "c": "3"}
    with pytest.raises(ValueError, match="--pod-label 'nope': expected KEY=VALUE"):
        pairs(["nope"], "--pod-label")


def test_kai_supplies_its_queue_label() -> None:
    from fixtures.suite.frame import RunOptions

    options = RunOptions(
        "kai-scheduler", ("scheduler",), frozenset(), "r", scheduler_implementation="kai-scheduler"
    )
    assert options.decorations().labels == {"kai.scheduler/queue": "default-queue"}
    mine = RunOptions(
        "kai-scheduler",
        ("scheduler",),
        frozenset(),
        "r",
        scheduler_implementation="kai-scheduler",
        pod_labels={"kai.scheduler/queue": "team-a"},
    )
    assert mine.decorations().labels == {"kai.scheduler/queue": "team-a"}


# ---- the config CR ----------------------------------------------------------------------------


def test_config_cr_decides() -> None:
    from fixtures.suite.frame import RunOptions
    from fixtures.suite.implementation import ConfigState, Settled, apply, config_problem

    gen3 = _node("operator-gen3")
    not_ready = ConfigState(
        found="GpuFractioningConfig/default",
        ready=False,
        conditions=[
            {"type": "MpsdReady", "status": "False", "reason": "MpsdCrashLoop", "message": "mpsd down"}
        ],
    )
    said = config_problem(gen3, not_ready)
    assert "is not Ready" in said and "MpsdCrashLoop" in said
    prefix = ConfigState(found="GpuFractioningConfig/default", ready=True, annotation_prefix="example.com/c.")
    assert config_problem(gen3, prefix) == ""  # written and read instead of the default, not a stop
    bad = ConfigState(found="GpuFractioningConfig/default", ready=True, annotation_prefix="Not A Prefix")
    said = config_problem(gen3, bad)
    assert "GpuFractioningConfig/default" in said and "annotation prefix 'Not A Prefix'" in said
    kai = builtins()["kai-scheduler"].scheduler
    assert kai is not None
    settled = Settled(
        gen3, kai, {"node": "declared", "scheduler": "declared"}, "operator-gen3", "kai-scheduler", Observed()
    )
    options = RunOptions("kai-scheduler", ("node",), frozenset(), "r")
    opened = apply(
        options,
        settled,
        ConfigState(found="GpuFractioningConfig/default", ready=True, fail_open=True, sm_sharing=False),
    )
    assert "failOpen" in opened.extra["failOpen"] and "sm-sharing" not in opened.supported_features
    assert opened.agent_selector == gen3.agent.selector
    assert opened.feature_sources["gpu-fraction"] == "implementation kai-scheduler"
    given = replace_sources(options)
    assert apply(given, settled, None).supported_features == frozenset({"gpu-memory"})


def replace_sources(options):  # type: ignore[no-untyped-def]
    from dataclasses import replace

    return replace(
        options,
        supported_features=frozenset({"gpu-memory"}),
        feature_sources={"gpu-memory": "--supported-features"},
    )


def test_devices_written_in_the_implementations_form() -> None:
    from enforcement.contract import resolve_device, write_device

    assert write_device("GPU-a", "uuid") == "GPU-a"
    assert write_device("GPU-a", "cdi") == "k8s.device-plugin.nvidia.com/gpu=GPU-a"
    assert resolve_device(write_device("GPU-a", "cdi")) == "GPU-a"
    assert write_device("0", "cdi") == "0"


def test_options_with_an_implementation_travel_to_workers() -> None:
    from fixtures.suite.frame import RunOptions
    from fixtures.suite.options import options_from_wire, options_to_wire

    options = RunOptions(
        "s",
        ("node",),
        frozenset({"gpu-memory"}),
        "r",
        implementation=("operator-gen3",),
        node_implementation="operator-gen3",
        feature_sources={"gpu-memory": "--supported-features"},
        exempt_features=("agent-restart",),
        pod_labels={"kai.scheduler/queue": "q"},
        pod_overlay={"spec": {"tolerations": [{"key": "k"}]}},
    )
    wire = options_to_wire(options)
    json.dumps(wire)
    assert options_from_wire(wire) == options
    assert options_from_wire(wire).node_part().implementation == "operator-gen3"


def test_a_config_prefix_is_what_the_suite_writes_and_reads() -> None:
    from enforcement import contract
    from fixtures.suite.frame import RunOptions, _nvidia
    from fixtures.suite.implementation import ConfigState, Settled, apply

    gen3 = _node("operator-gen3")
    settled = Settled(
        gen3,
        builtins()["contract-scheduler"].scheduler,  # type: ignore[arg-type]
        {"node": "declared", "scheduler": "default"},
        "operator-gen3",
        "",
        Observed(),
    )
    options = RunOptions("x", ("node",), frozenset(), "r")
    opened = apply(
        options,
        settled,
        ConfigState(found="GpuFractioningConfig/default", ready=True, annotation_prefix="ex.io/c."),
    )
    assert opened.annotation_prefix == "ex.io/c." and "ex.io/c." in opened.extra["annotationPrefix"]
    assert (
        apply(options, settled, ConfigState(found="x", ready=True)).annotation_prefix
        == contract.NVIDIA_PREFIX
    )
    try:
        contract.use_annotation_prefix("ex.io/c.")
        key = contract.nvidia_key("main", contract.SUFFIX_REQUEST)
        assert key == "ex.io/c.main.gpu-memory.request"
        pod = {
            "metadata": {"name": "p", "namespace": "n", "annotations": {key: "1Gi"}},
            "spec": {"containers": [{"name": "main"}]},
        }
        _fractions, violations = contract.read_placement(pod)
        # Read under the new prefix: what is missing is named under it, and so is the fix.
        missing = {v.key: v.fix for v in violations}
        assert "ex.io/c.main.gpus.devices" in missing
        assert all("nvidia.com/container." not in (fix or "") for fix in missing.values()), missing
        # A key under the default prefix is no contract key any more: not read, not judged.
        assert _nvidia({key: "1Gi", "nvidia.com/container.main.gpu-memory.request": "2Gi"}) == {key: "1Gi"}
    finally:
        contract.use_annotation_prefix(contract.NVIDIA_PREFIX)
    for bad in ("nvidia.com", "Nvidia.com/c.", "nvidia.com/container", "/c."):
        assert contract.annotation_prefix_problem(bad), bad
        with pytest.raises(ValueError, match="annotation prefix"):
            contract.use_annotation_prefix(bad)
    assert contract.annotation_prefix() == contract.NVIDIA_PREFIX


def test_an_agent_named_by_its_daemon_sets_is_found_by_their_pod_selector() -> None:
    from fixtures.suite.frame import RunOptions
    from fixtures.suite.implementation import Settled, apply

    gen1 = _node("operator-gen1")
    assert not gen1.agent.selector  # the record names its DaemonSets, not their labels
    daemons = (
        {"name": "gpu-sharing-mpsd", "namespace": "gs", "labels": {}, "podSelector": "app=mpsd"},
        {"name": "gpu-sharing-sharingd", "namespace": "gs", "labels": {}, "podSelector": "app=sharingd"},
    )
    observed = _seen({"gpu-sharing.nvidia.com/Ready"}, ("GpuSharingConfig",), daemons)
    contract_part = builtins()["contract-scheduler"].scheduler
    assert contract_part is not None
    settled = Settled(
        gen1, contract_part, {"node": "detected", "scheduler": "default"}, "operator-gen1", "", observed
    )
    options = RunOptions("x", ("node",), frozenset(), "r")
    opened = apply(options, settled, None)
    # The agent (sharingd, listed first in the description), not the API's alphabetical first.
    assert opened.agent_selector == "app=sharingd" and opened.agent_namespace == "gs"
    assert opened.extra["agentSelectorFrom"] == "DaemonSet gs/gpu-sharing-sharingd"
    from dataclasses import replace

    given = apply(replace(options, agent_selector="mine=1"), settled, None)
    assert given.agent_selector == "mine=1"  # a selector given on the command line stays

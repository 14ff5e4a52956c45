"""Implementation descriptions: what a node side and a scheduler side of the GPU-fraction contract do.

The suite judges *effects* as MUST for every implementation (where an allocation fails, what a
borrower keeps, who is evicted, how modes behave, what CUDA sees, where Pods land) and judges
*mechanisms* (env names and units, pinned MPS limits, thread caps, an ``nvidia-smi`` capped by an
NVML shim, condition and CR names, the device naming form) only where an implementation declares
them. An implementation is described once, as data, in a small versioned YAML file
(``apiVersion: gpuconf.io/v1alpha1``, ``kind: Implementation``): a node part, a scheduler part, or
both. The agent, the sandbox and the suite read these descriptions instead of hard-coding one.

Built in (``builtin/*.yaml``; facts and public sources in docs/contract.md §9):

- ``gpuconf-reference``: gpuconf's reference agent and reference scheduler (both parts);
- ``operator-gen1``, ``operator-gen2``, ``operator-gen3``: the released GPU Fractioning Operator
  generations (``gpu-sharing``, ``kai-gpu-fractioning``, ``gpu-fractioning``);
- ``operator-pr``: the operator's open pull-request line (pinned MPS limits, thread cap, NVML shim);
- ``kai-scheduler``: KAI Scheduler in NvFractions mode (scheduler part);
- ``contract-scheduler``: any scheduler, judged by the contract alone (no decorations, no known
  non-workload Pods): the scheduler part when none is declared or detected.

A user's own file is checked against the same spec (``spec.py``; ``schema.json`` is its JSON
schema): an unknown or mistyped field is refused with its dotted name and the file.

The word is *implementation*, never "profile": the conformance profiles (``scheduler``, ``node``,
``stack``, ``probe``) say who a check judges; an implementation says what is judged.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import yaml

from enforcement.implementations.spec import DescriptionError, T, obj, parse

API_VERSION: Final = "gpuconf.io/v1alpha1"
KIND: Final = "Implementation"
BUILTIN_DIR: Final = Path(__file__).parent / "builtin"

REFERENCE: Final = "gpuconf-reference"
CONTRACT_SCHEDULER: Final = "contract-scheduler"

MECHANISMS: Final[dict[str, str]] = {
    "pinned-mps-limits": "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT (the limit per visible ordinal) in the "
    "container's environment: only in the operator's open pull request, in no release",
    "compute-portion": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE from a gpu-compute.portion key: only in the "
    "operator's open pull request (released KAI admission refuses the portion key)",
    "nvml-memory-view": "nvidia-smi in the container reports the limit as memory.total (an NVML shim): only "
    "in the operator's open pull request (x86-64 only), in no release",
}
"""Mechanisms an implementation may claim, each with the upstream fact it rests on (a check that needs
one is skipped with this fact for an implementation that does not claim it)."""

PARTIES: Final = ("node", "admission", "scheduler", "runtime", "nobody")
MALFORMED_CASES: Final = (
    "not-a-quantity",
    "empty-value",
    "whitespace-only",
    "zero",
    "negative",
    "bare-number",
    "milli-unit",
    "request-above-limit",
    "unknown-mode",
    "blank-mode",
    "blank-mode-whitespace",
    "unknown-device",
    "memory-without-devices",
)
"""The malformed placements ``fail-closed`` sets up (docs/contract.md §2, parsing rules); a
description's ``refusedBy`` says who refuses each (absent: the node agent). ``BLANK_MODE_CASES`` are
judged by the description's ``blankMode`` too: where it says ``default``, by their effect."""
BLANK_MODE_CASES: Final = ("blank-mode", "blank-mode-whitespace")
"""A present but blank mode (empty, whitespace only): malformed (``mode-word``), which an older
operator version took as the default (docs/contract.md §9.2)."""
DEVICE_FORMS: Final = ("uuid", "cdi", "index")

_ENV = obj(
    "the environment the node gives a fenced container",
    required=True,
    memoryRequest=T("str", "the request's variable", required=True),
    memoryLimit=T("str", "the limit's variable", required=True),
    memoryUnit=T(
        "enum", "MiB (whole mebibytes) or MB (decimal megabytes)", required=True, values=("MiB", "MB")
    ),
    rounding=T(
        "enum-list",
        "how a value that is not whole in the unit is rounded; empty: not stated (any of them is accepted)",
        values=("ceil", "floor", "nearest"),
    ),
    pipeDirectory=T("str", "the MPS pipe directory's variable", required=True),
    pipeDirectories=T(
        "str-map", "mode (time-slicing, sm-sharing) to the pipe directory; empty: any, distinct"
    ),
    visibleDevices=T("str", "the visible devices' variable", required=True),
    visibleDevicesValue=T(
        "enum",
        "uuid: the GPUs' UUIDs; verbatim: the gpus.devices value as written",
        values=("uuid", "verbatim"),
    ),
    pinnedLimit=T("str", "the pinned-limit variable (mechanism pinned-mps-limits)"),
    threadPercentage=T("str", "the thread-cap variable (mechanism compute-portion)"),
    threadCapModes=T("enum-list", "modes the thread cap applies in", values=("time-slicing", "sm-sharing")),
    replacesContainerValues=T(
        "str-list", "variables whose value set by the container itself is known to be replaced"
    ),
    knownUnenforced=T("str-map", "variable name to the upstream fact saying it is not enforced"),
)
_NODE = obj(
    "the node side: the agent that fences containers",
    title=T("str", "what it is, in words"),
    readiness=obj(
        "the node condition that says the node is ready for fractions",
        required=True,
        conditions=T("str-list", "condition types, any of which counts", required=True),
        writtenBy=T("enum", "who writes it", values=("agent", "controller")),
    ),
    config=obj(
        "the cluster configuration custom resource, where one exists",
        kind=T("str", "its kind", required=True),
        group=T("str", "its API group; absent: found by kind among the CRDs"),
        name=T("str", "the one name it must have"),
        scope=T("enum", "Cluster or Namespaced", values=("Cluster", "Namespaced")),
        conditions=T("str-list", "the condition types its status carries"),
        readyCondition=T("str", "the condition that says it is ready; absent: not read"),
        failOpen=T("str", "dotted path of its fail-open switch"),
        annotationPrefix=T("str", "dotted path of its annotation prefix"),
        smSharing=T("str", "dotted path of a boolean that switches sm-sharing on"),
    ),
    annotationPrefix=T("str", "the annotation prefix by default (nvidia.com/container.)"),
    env=_ENV,
    mechanisms=T("enum-list", "mechanisms it claims (judged only where claimed)", values=tuple(MECHANISMS)),
    features=T("str-list", "features it supports (sm-sharing, soft-limit-eviction, agent-restart, ...)"),
    devices=obj(
        "device identities",
        accepts=T("enum-list", "forms of gpus.devices it accepts", values=DEVICE_FORMS),
        validates=T("bool", "whether it refuses a device that is not on the node"),
    ),
    agent=obj(
        "where its agent Pods are",
        namespace=T("str", "their namespace; absent: any"),
        selector=T("str", "a label selector for them"),
        daemonSets=T("str-list", "its DaemonSets' names"),
    ),
    validation=obj(
        "who refuses each malformed case (node, admission, scheduler, runtime, nobody)",
        refusedBy=T("str-map", f"case ({', '.join(MALFORMED_CASES)}) to party (absent: node)"),
        refusalNamesKey=T("bool", "whether the node's refusal names the annotation key and the rule"),
        blankMode=T(
            "enum",
            f"a present but blank mode ({', '.join(BLANK_MODE_CASES)}): error (refused; absent: error) or "
            "the default (started as time-slicing)",
            values=("error", "default"),
        ),
    ),
    daemonSelection=T("str-map", "labels its daemons select nodes on"),
    nodeLabels=obj(
        "the node labels GPU feature discovery writes, as this cluster has them",
        gpuCount=T("str"),
        gpuMemory=T("str"),
        gpuProduct=T("str"),
        gpuPresent=T("str"),
    ),
    detect=T("bool", "whether detection may choose it (false: only when declared)"),
)
_SCHEDULER = obj(
    "the scheduler side: what it writes, what it needs, what it creates",
    title=T("str", "what it is, in words"),
    schedulerName=T("str", "its spec.schedulerName by default"),
    devicesForm=T(
        "enum",
        "the form of gpus.devices it writes (uuid: GPU UUIDs, bare or as CDI names' devices); the check "
        "devices-form judges it, and any (the default) is not judged",
        values=(*DEVICE_FORMS, "any"),
    ),
    writesMode=T("bool", "whether it writes gpu-compute.mode"),
    reserveMiB=T("int", "MiB it keeps back per GPU when turning a portion into MiB"),
    retryPeriodSeconds=T(
        "int",
        "how often it tries a Pod it could not place again, at the longest (the suite's unbound window)",
    ),
    quantities=T("enum", "canonical (4Gi) or any", values=("canonical", "any")),
    features=T("str-list", "features it supports (request forms, multi-device, ...)"),
    pod=obj(
        "what a Pod needs to be scheduled by it",
        labels=T("str-map"),
        annotations=T("str-map"),
        priorityClass=T("str"),
    ),
    nonWorkloadPods=T(
        "list-of",
        "Pods it creates that are not workloads",
        fields={
            "item": obj(
                "one kind of such Pod",
                namespace=T("str", required=True),
                namePrefix=T("str"),
                why=T("str"),
            )
        },
    ),
    admission=T("enum", "the lint dialect of its admission (contract, kai)", values=("contract", "kai")),
    detect=obj("what on a cluster says it is this one", namespaces=T("str-list")),
)
SPEC: Final = obj(
    "a gpuconf implementation description",
    required=True,
    apiVersion=T("enum", "the description format's version", required=True, values=(API_VERSION,)),
    kind=T("enum", "", required=True, values=(KIND,)),
    name=T("str", "how --implementation names it", required=True),
    title=T("str", "what it is, in words", required=True),
    description=T("str"),
    sources=T("str-list", "public sources of its facts"),
    node=_NODE,
    scheduler=_SCHEDULER,
)


DEFAULT_PREFIX: Final = "nvidia.com/container."
DEFAULT_NODE_LABELS: Final[dict[str, str]] = {
    "gpuCount": "nvidia.com/gpu.count",
    "gpuMemory": "nvidia.com/gpu.memory",
    "gpuProduct": "nvidia.com/gpu.product",
    "gpuPresent": "nvidia.com/gpu.present",
}


def _pick(data: Mapping[str, Any] | None, key: str, default: Any) -> Any:
    value = (data or {}).get(key)
    return default if value is None else value


@dataclass(frozen=True)
class ConfigResource:
    kind: str
    group: str | None = None
    name: str | None = None
    scope: str = "Cluster"
    conditions: tuple[str, ...] = ()
    ready_condition: str | None = None
    fail_open: str | None = None
    annotation_prefix: str | None = None
    sm_sharing: str | None = None


@dataclass(frozen=True)
class EnvDialect:
    memory_request: str
    memory_limit: str
    memory_unit: str
    rounding: tuple[str, ...]
    pipe_directory: str
    pipe_directories: Mapping[str, str]
    visible_devices: str
    visible_devices_value: str
    pinned_limit: str | None
    thread_percentage: str | None
    thread_cap_modes: tuple[str, ...]
    replaces_container_values: tuple[str, ...]
    known_unenforced: Mapping[str, str]

    def names(self) -> tuple[str, ...]:
        """Every variable of the dialect (what a container's environment is read for)."""
        found = [self.memory_request, self.memory_limit, self.pipe_directory, self.visible_devices]
        found += [n for n in (self.pinned_limit, self.thread_percentage) if n]
        return tuple(dict.fromkeys(found))

    def memory_values(self, mib: int) -> tuple[str, ...]:
        """What a whole-MiB value may read as in this dialect's unit and rounding."""
        if self.memory_unit == "MiB":
            return (str(mib),)
        exact = mib * 1024 * 1024 / 1_000_000
        import math

        ways = {"ceil": math.ceil(exact), "floor": math.floor(exact), "nearest": int(exact + 0.5)}
        chosen = self.rounding or tuple(ways)
        return tuple(dict.fromkeys(str(ways[r]) for r in chosen))

    def memory_value(self, mib: int) -> str:
        """The value the dialect writes for ``mib`` (its first rounding)."""
        return self.memory_values(mib)[0]


@dataclass(frozen=True)
class AgentPods:
    namespace: str | None = None
    selector: str | None = None
    daemon_sets: tuple[str, ...] = ()


@dataclass(frozen=True)
class NodePart:
    """What the node side does (read from a description's ``node``)."""

    implementation: str
    title: str
    conditions: tuple[str, ...]
    condition_writer: str
    config: ConfigResource | None
    annotation_prefix: str
    env: EnvDialect
    mechanisms: frozenset[str]
    features: tuple[str, ...]
    accepts_devices: tuple[str, ...]
    validates_devices: bool
    agent: AgentPods
    refused_by: Mapping[str, str]
    refusal_names_key: bool
    blank_mode: str
    """A present but blank mode: ``error`` (refused as malformed) or ``default`` (taken as time-slicing)."""
    daemon_selection: Mapping[str, str]
    node_labels: Mapping[str, str]
    detect: bool

    @property
    def condition(self) -> str:
        """The condition it writes (its first)."""
        return self.conditions[0]

    def claims(self, mechanism: str) -> bool:
        return mechanism in self.mechanisms

    def who_refuses(self, case: str) -> str:
        return self.refused_by.get(case, "node")


@dataclass(frozen=True)
class NonWorkloadPods:
    namespace: str
    name_prefix: str = ""
    why: str = ""

    def matches(self, pod: Mapping[str, Any]) -> bool:
        meta = pod.get("metadata") or {}
        return meta.get("namespace") == self.namespace and str(meta.get("name") or "").startswith(
            self.name_prefix
        )


@dataclass(frozen=True)
class SchedulerPart:
    implementation: str
    title: str
    scheduler_name: str | None
    devices_form: str
    writes_mode: bool
    reserve_mib: int | None
    quantities: str
    features: tuple[str, ...]
    pod_labels: Mapping[str, str]
    pod_annotations: Mapping[str, str]
    priority_class: str | None
    non_workload_pods: tuple[NonWorkloadPods, ...]
    admission: str
    detect_namespaces: tuple[str, ...]
    retry_period_s: float | None = None
    """How often it tries an unplaced Pod again, at the longest (``retryPeriodSeconds``); None: not
    declared."""


@dataclass(frozen=True)
class Implementation:
    name: str
    title: str
    description: str = ""
    sources: tuple[str, ...] = ()
    node: NodePart | None = None
    scheduler: SchedulerPart | None = None
    path: str = ""
    """The file it was read from (a built-in's: ``builtin/<name>.yaml``)."""
    builtin: bool = False

    def parts(self) -> tuple[str, ...]:
        return tuple(p for p in ("node", "scheduler") if getattr(self, p) is not None)


def _node(name: str, data: Mapping[str, Any]) -> NodePart:
    env = data["env"]
    config = data.get("config")
    agent = data.get("agent") or {}
    validation = data.get("validation") or {}
    devices = data.get("devices") or {}
    refused = dict(_pick(validation, "refusedBy", {}))
    bad = {k: v for k, v in refused.items() if k not in MALFORMED_CASES or v not in PARTIES}
    if bad:
        case, party = next(iter(bad.items()))
        raise DescriptionError(
            f"{name}: node.validation.refusedBy has {case!r}: {party!r}; "
            f"cases: {', '.join(MALFORMED_CASES)}; parties: {', '.join(PARTIES)}"
        )
    return NodePart(
        implementation=name,
        title=_pick(data, "title", ""),
        conditions=tuple(data["readiness"]["conditions"]),
        condition_writer=_pick(data["readiness"], "writtenBy", "agent"),
        config=None
        if config is None
        else ConfigResource(
            kind=config["kind"],
            group=config.get("group"),
            name=config.get("name"),
            scope=_pick(config, "scope", "Cluster"),
            conditions=tuple(_pick(config, "conditions", ())),
            ready_condition=config.get("readyCondition"),
            fail_open=config.get("failOpen"),
            annotation_prefix=config.get("annotationPrefix"),
            sm_sharing=config.get("smSharing"),
        ),
        annotation_prefix=_pick(data, "annotationPrefix", DEFAULT_PREFIX),
        env=EnvDialect(
            memory_request=env["memoryRequest"],
            memory_limit=env["memoryLimit"],
            memory_unit=env["memoryUnit"],
            rounding=tuple(_pick(env, "rounding", ())),
            pipe_directory=env["pipeDirectory"],
            pipe_directories=dict(_pick(env, "pipeDirectories", {})),
            visible_devices=env["visibleDevices"],
            visible_devices_value=_pick(env, "visibleDevicesValue", "uuid"),
            pinned_limit=env.get("pinnedLimit"),
            thread_percentage=env.get("threadPercentage"),
            thread_cap_modes=tuple(_pick(env, "threadCapModes", ("sm-sharing",))),
            replaces_container_values=tuple(_pick(env, "replacesContainerValues", ())),
            known_unenforced=dict(_pick(env, "knownUnenforced", {})),
        ),
        mechanisms=frozenset(_pick(data, "mechanisms", ())),
        features=tuple(_pick(data, "features", ())),
        accepts_devices=tuple(_pick(devices, "accepts", DEVICE_FORMS)),
        validates_devices=bool(_pick(devices, "validates", False)),
        agent=AgentPods(agent.get("namespace"), agent.get("selector"), tuple(_pick(agent, "daemonSets", ()))),
        refused_by=refused,
        refusal_names_key=bool(_pick(validation, "refusalNamesKey", False)),
        blank_mode=_pick(validation, "blankMode", "error"),
        daemon_selection=dict(_pick(data, "daemonSelection", {})),
        node_labels={**DEFAULT_NODE_LABELS, **{k: v for k, v in (data.get("nodeLabels") or {}).items() if v}},
        detect=bool(_pick(data, "detect", True)),
    )


def _scheduler(name: str, data: Mapping[str, Any]) -> SchedulerPart:
    pod = data.get("pod") or {}
    return SchedulerPart(
        implementation=name,
        title=_pick(data, "title", ""),
        scheduler_name=data.get("schedulerName"),
        devices_form=_pick(data, "devicesForm", "any"),
        writes_mode=bool(_pick(data, "writesMode", True)),
        reserve_mib=data.get("reserveMiB"),
        quantities=_pick(data, "quantities", "any"),
        features=tuple(_pick(data, "features", ())),
        pod_labels=dict(_pick(pod, "labels", {})),
        pod_annotations=dict(_pick(pod, "annotations", {})),
        priority_class=pod.get("priorityClass"),
        non_workload_pods=tuple(
            NonWorkloadPods(p["namespace"], _pick(p, "namePrefix", ""), _pick(p, "why", ""))
            for p in _pick(data, "nonWorkloadPods", ())
        ),
        admission=_pick(data, "admission", "contract"),
        retry_period_s=data.get("retryPeriodSeconds"),
        detect_namespaces=tuple(_pick(data.get("detect"), "namespaces", ())),
    )


def from_mapping(data: Any, where: str, builtin: bool = False) -> Implementation:
    """A description from its parsed YAML; raises ``DescriptionError`` naming ``where`` and the field."""
    checked = parse(SPEC, data, where)
    name = checked["name"]
    if not checked.get("node") and not checked.get("scheduler"):
        raise DescriptionError(
            f"{where}: describes neither a node part (node:) nor a scheduler part (scheduler:)"
        )
    return Implementation(
        name=name,
        title=checked["title"],
        description=_pick(checked, "description", ""),
        sources=tuple(_pick(checked, "sources", ())),
        node=_node(name, checked["node"]) if checked.get("node") else None,
        scheduler=_scheduler(name, checked["scheduler"]) if checked.get("scheduler") else None,
        path=where,
        builtin=builtin,
    )


def load_file(path: Path) -> Implementation:
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise DescriptionError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise DescriptionError(f"{path}: not YAML: {exc}") from None
    return from_mapping(data, str(path))


@functools.cache
def builtins() -> dict[str, Implementation]:
    """Every built-in description, by name."""
    out = {}
    for path in sorted(BUILTIN_DIR.glob("*.yaml")):
        impl = from_mapping(yaml.safe_load(path.read_text()), f"builtin/{path.name}", builtin=True)
        if impl.name != path.stem:
            raise DescriptionError(
                f"builtin/{path.name}: named {impl.name!r}; a built-in is named as its file"
            )
        out[impl.name] = impl
    return out


def known_names() -> list[str]:
    return sorted(builtins())


def resolve(name_or_file: str) -> Implementation:
    """A built-in by name, or a user's file by path; raises ``DescriptionError`` listing the known names."""
    found = builtins().get(name_or_file)
    if found is not None:
        return found
    path = Path(name_or_file)
    if path.suffix in (".yaml", ".yml", ".json") or path.exists():
        if not path.is_file():
            raise DescriptionError(f"{name_or_file}: no such file")
        return load_file(path)
    raise DescriptionError(
        f"{name_or_file!r} is neither a built-in implementation nor a file; known: {', '.join(known_names())}"
    )


def reference() -> Implementation:
    return builtins()[REFERENCE]


def reference_node() -> NodePart:
    node = reference().node
    assert node is not None
    return node


@dataclass(frozen=True)
class Declared:
    """The implementation under test: a node part and a scheduler part, and how each was chosen."""

    node: NodePart
    scheduler: SchedulerPart
    how: Mapping[str, str] = field(default_factory=dict)
    """part (node, scheduler) to ``declared`` (--implementation), ``detected: <why>`` or ``default``."""

    def as_dict(self) -> dict[str, Any]:
        return {
            "node": {
                "name": self.node.implementation,
                "title": self.node.title,
                "chosen": self.how.get("node", ""),
            },
            "scheduler": {
                "name": self.scheduler.implementation,
                "title": self.scheduler.title,
                "chosen": self.how.get("scheduler", ""),
            },
        }


def combine(chosen: Iterable[Implementation]) -> tuple[NodePart | None, SchedulerPart | None]:
    """The parts named by several ``--implementation`` values; a part named twice is an error."""
    node: NodePart | None = None
    scheduler: SchedulerPart | None = None
    for impl in chosen:
        if impl.node is not None:
            if node is not None:
                raise DescriptionError(
                    f"--implementation: both {node.implementation!r} and {impl.name!r} describe the "
                    "node part; name one"
                )
            node = impl.node
        if impl.scheduler is not None:
            if scheduler is not None:
                raise DescriptionError(
                    f"--implementation: both {scheduler.implementation!r} and {impl.name!r} describe the "
                    "scheduler part; name one"
                )
            scheduler = impl.scheduler
    return node, scheduler


def contract_scheduler() -> SchedulerPart:
    part = builtins()[CONTRACT_SCHEDULER].scheduler
    assert part is not None
    return part


def reference_scheduler() -> SchedulerPart:
    part = reference().scheduler
    assert part is not None
    return part


__all__ = [
    "API_VERSION",
    "MECHANISMS",
    "Declared",
    "DescriptionError",
    "EnvDialect",
    "Implementation",
    "NodePart",
    "SchedulerPart",
    "builtins",
    "combine",
    "known_names",
    "load_file",
    "reference",
    "resolve",
]


def known_conditions() -> tuple[str, ...]:
    """Every readiness condition a built-in node implementation names (any of them marks a node ready)."""
    found: list[str] = []
    for impl in builtins().values():
        if impl.node is not None:
            found += impl.node.conditions
    return tuple(dict.fromkeys(found))


def node_label(name: str) -> str:
    """A GPU feature discovery label (``gpuCount``, ``gpuMemory``, ``gpuProduct``, ``gpuPresent``) as
    the reference description names it: the one place these label names are defined."""
    return reference_node().node_labels[name]


SCHEMA_FILE: Final = Path(__file__).parent / "schema.json"


def schema_document() -> dict[str, Any]:
    """The description format as a JSON schema (``schema.json`` is this, written out)."""
    from enforcement.implementations.spec import json_schema

    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "gpuconf.io/v1alpha1/Implementation",
        "title": "gpuconf implementation description",
        **json_schema(SPEC),
    }

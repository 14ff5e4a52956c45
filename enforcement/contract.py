"""The GPU-fraction contract: one parser for the annotations every party reads.

The node agent, the reference scheduler, the suite and ``gpuconf lint`` all import this module,
so "what does this Pod ask for, and what was it given?" has exactly one answer in the project.
docs/contract.md §2-4 are the facts; ``enforcement.rules`` is the table of checks; this module turns a
Pod into typed values plus a list of violations of those rules.

Built so because:

- **Pods are plain dicts** (as read from YAML, or ``pod_to_dict(v1_pod)`` for a live object), so a
  manifest on disk and a Pod in a cluster go through one code path.
- **Nothing raises.** The Pod-level entry points return ``Violation`` values, never exceptions: the
  node agent must not crash on a malformed annotation, and a linter wants every problem, not the
  first. A container with a malformed key gets no ``Fraction``; one placed without devices gets a
  ``Fraction`` with ``devices=()`` *and* a ``devices-missing`` error. ``fail_closed_containers``
  names every container with an error: what a fail-closed agent (the default) refuses to start.
- **Mirror the consumers.** Keys are split by their known suffix (container names may contain
  dashes, and a suffix may contain dots), keys for containers the Pod lacks are reported and
  ignored as the real agent ignores them, memory is rounded up to whole MiB, a mode alone does
  nothing, and request/limit default to each other. Checks that are looser or stricter than the
  real agent and KAI admission would judge a correct stack wrong.
- **Frozen dataclasses**: values cross process and thread boundaries in the agent and are used as
  dict keys in reports.

Public API (other modules code against these):

``parse_memory_mib(value) -> int``
    a quantity in whole MiB, rounded up; raises ``ContractError`` (the only raising parser).
``read_placement(pod) -> (dict[container, Fraction], list[Violation])``
    the scheduler-written keys, as the node agent consumes them.
``read_request(pod) -> (FractionRequest | None, list[Violation])``
    the author's request, in either dialect (docs/contract.md §3).
``to_absolute(request, gpu_memory_mib, reserve_mib=0) -> (request_mib, limit_mib)``
    portion -> absolute, as the KAI binder computes it.
``render_placement(container, fraction) -> dict[str, str]``
    the annotations a scheduler writes; ``read_placement`` of them round-trips.
``audit_pod(pod, node=None, *, sm_sharing_enabled=True) -> list[Violation]``
    request rules, plus placement rules for a bound Pod, plus device existence given its Node.
``gpu_loads(pods, nodes=()) -> dict[(node, gpu), GpuLoad]`` and ``audit_gpus(pods, nodes, reserve_mib=0)``
    per-GPU arithmetic: sum of guaranteed requests, compute modes, mixing and overcommit.

Helpers: ``fail_closed_containers(violations)``, ``pod_to_dict(v1_pod)``, ``parse_devices(value)``,
``resolve_device(device, node)`` (index/CDI/UUID -> one identity), ``node_gpu_uuids(node)``,
``node_gpu_count(node)``, ``node_gpu_memory_mib(node)``, ``nvidia_key(container, suffix)``; the key
names and suffixes are module constants (``NVIDIA_PREFIX``, ``SUFFIX_REQUEST``, ``GPU_FRACTION``...).
The per-container keys' prefix in use is ``annotation_prefix()``: ``NVIDIA_PREFIX`` unless
``use_annotation_prefix`` moved it (a cluster whose config CR sets another prefix).
Rule ids, severities and statements live in ``enforcement.rules.RULES``.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction as Exact
from typing import Any, Final, Literal

from enforcement.quantity import MIB, parse_memory_mib, parse_quantity
from enforcement.rules import RULES, ContractError, Severity

__all__ = [
    "MODES",
    "SM_SHARING",
    "TIME_SLICING",
    "ContractError",
    "Fraction",
    "FractionRequest",
    "GpuLoad",
    "GpuShare",
    "Violation",
    "audit_gpus",
    "audit_pod",
    "fail_closed_containers",
    "gpu_loads",
    "kai_portion_limit_key",
    "node_gpu_count",
    "node_gpu_memory_mib",
    "node_gpu_uuids",
    "nvidia_key",
    "parse_devices",
    "parse_memory_mib",
    "pod_to_dict",
    "read_placement",
    "read_request",
    "render_placement",
    "resolve_device",
    "to_absolute",
]

Mode = Literal["time-slicing", "sm-sharing"]
TIME_SLICING: Final[Mode] = "time-slicing"
SM_SHARING: Final[Mode] = "sm-sharing"
MODES: Final[tuple[Mode, ...]] = (TIME_SLICING, SM_SHARING)

NVIDIA_PREFIX: Final = "nvidia.com/container."
SUFFIX_REQUEST: Final = ".gpu-memory.request"
SUFFIX_LIMIT: Final = ".gpu-memory.limit"
SUFFIX_MODE: Final = ".gpu-compute.mode"
SUFFIX_DEVICES: Final = ".gpus.devices"
SUFFIX_PORTION: Final = ".gpu-compute.portion"
NVIDIA_SUFFIXES: Final = (SUFFIX_REQUEST, SUFFIX_LIMIT, SUFFIX_MODE, SUFFIX_DEVICES, SUFFIX_PORTION)

KAI_PREFIX: Final = "kai.scheduler/container."
SUFFIX_PORTION_LIMIT: Final = ".gpu-memory.portion.limit"

GPU_FRACTION: Final = "gpu-fraction"
GPU_FRACTION_LIMIT: Final = "gpu-fraction.limit"
GPU_MEMORY: Final = "gpu-memory"
GPU_MEMORY_LIMIT: Final = "gpu-memory.limit"
NUM_DEVICES: Final = "gpu-fraction-num-devices"
CONTAINER_NAME: Final = "gpu-fraction-container-name"
AUTHOR_KEYS: Final = (
    GPU_FRACTION,
    GPU_FRACTION_LIMIT,
    GPU_MEMORY,
    GPU_MEMORY_LIMIT,
    NUM_DEVICES,
    CONTAINER_NAME,
)

NODE_GPU_UUIDS: Final = "gpuconf.io/gpu-uuids"
LABEL_GPU_COUNT: Final = "nvidia.com/gpu.count"
LABEL_GPU_MEMORY: Final = "nvidia.com/gpu.memory"
WHOLE_GPU_RESOURCE: Final = "nvidia.com/gpu"

_NUMBER: Final = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
# Indices and label numbers are bounded so int() never meets a 5,000-digit string.
_INDEX: Final = re.compile(r"[0-9]{1,9}")
_UUID: Final = re.compile(r"(?:GPU|MIG)-[0-9A-Za-z][0-9A-Za-z-]*")
_CDI: Final = re.compile(r"[a-z0-9][a-z0-9.-]*/[a-z0-9][a-z0-9._-]*=(?P<device>.+)")


_prefix: str = NVIDIA_PREFIX
_PREFIX_FORM: Final = re.compile(
    r"[a-z0-9]([a-z0-9.-]*[a-z0-9])?/([A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?\.)?"
)


def annotation_prefix() -> str:
    """The prefix of the per-container keys in use (``nvidia.com/container.`` unless a cluster's
    config sets another: ``use_annotation_prefix``). The only place that knows it: every key the
    suite writes (``nvidia_key``) and every key it reads goes through it."""
    return _prefix


def use_annotation_prefix(prefix: str) -> None:
    """Write and read ``prefix`` instead of ``nvidia.com/container.`` from now on, in this process.

    A node agent whose config moves the keys (the operator's ``annotationPrefix``) reads only the
    keys under its prefix; a suite that kept writing the default would judge Pods the agent never
    sees. ``prefix`` is a DNS subdomain and a ``/``, optionally followed by a name and a dot.
    """
    global _prefix
    problem = annotation_prefix_problem(prefix)
    if problem:
        raise ValueError(problem)
    _prefix = prefix


def annotation_prefix_problem(prefix: str) -> str:
    """Why ``prefix`` cannot prefix the per-container keys (empty: it can)."""
    if _PREFIX_FORM.fullmatch(prefix) and len(prefix.partition("/")[0]) <= 253:
        return ""
    return (
        f"annotation prefix {prefix!r}: must be '<dns-subdomain>/' or '<dns-subdomain>/<name>.' "
        "(e.g. 'nvidia.com/container.')"
    )


def nvidia_key(container: str, suffix: str) -> str:
    """``<prefix><container><suffix>`` (``nvidia.com/container.`` by default: ``annotation_prefix``);
    ``suffix`` is one of ``NVIDIA_SUFFIXES``."""
    return f"{_prefix}{container}{suffix}"


def kai_portion_limit_key(container: str) -> str:
    return f"{KAI_PREFIX}{container}{SUFFIX_PORTION_LIMIT}"


# --------------------------------------------------------------------------- values


@dataclass(frozen=True)
class Violation:
    """One broken rule on one object: what, where, why, and how to fix it."""

    kind: str
    namespace: str
    name: str
    container: str
    key: str
    rule: str
    severity: Severity
    message: str
    fix: str

    @property
    def is_error(self) -> bool:
        return self.severity == "error"

    def __str__(self) -> str:
        where = f"{self.kind} {self.namespace + '/' if self.namespace else ''}{self.name}"
        if self.container:
            where += f" container {self.container!r}"
        return f"{where}: {self.key}: {self.message} [{self.rule}, {self.severity}]; fix: {self.fix}"


@dataclass(frozen=True)
class Fraction:
    """The effective enforcement for one container, after defaults (what the node agent applies)."""

    container: str
    request_mib: int
    """Guaranteed memory per assigned device (soft limit)."""
    limit_mib: int
    """Maximum per assigned device (hard limit); equals the request when not written."""
    mode: Mode = TIME_SLICING
    devices: tuple[str, ...] = ()
    """As written: UUIDs, indices or CDI names. Empty means the placement is incomplete (unfenced)."""
    portion: float | None = None
    """Compute share in (0, 1]; becomes the MPS active-thread percentage in sm-sharing."""

    @property
    def active_thread_percentage(self) -> int | None:
        """``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``: floor(portion x 100), at least 1; sm-sharing only."""
        if self.portion is None or self.mode != SM_SHARING:
            return None
        return max(1, math.floor(self.portion * 100))


@dataclass(frozen=True)
class FractionRequest:
    """What the author asked for, in whichever dialect, before a scheduler resolved it.

    Exactly one of ``request_mib`` (absolute) and ``portion`` (share of one GPU) is set.
    """

    container: str
    source: Literal["nvidia", "gpu-fraction", "gpu-memory"]
    request_mib: int | None = None
    limit_mib: int | None = None
    portion: float | None = None
    portion_limit: float | None = None
    num_devices: int = 1
    mode: Mode = TIME_SLICING


@dataclass(frozen=True)
class GpuShare:
    """One container's claim on one GPU."""

    namespace: str
    pod: str
    container: str
    request_mib: int
    mode: Mode


@dataclass(frozen=True)
class GpuLoad:
    """Everything placed on one physical GPU of one node."""

    node: str
    gpu: str
    """The GPU's UUID when the node's UUID list is known, else the device as written."""
    shares: tuple[GpuShare, ...] = ()

    @property
    def request_mib(self) -> int:
        """Sum of the guaranteed requests on this GPU."""
        return sum(s.request_mib for s in self.shares)

    @property
    def modes(self) -> frozenset[Mode]:
        return frozenset(s.mode for s in self.shares)

    @property
    def mixed(self) -> bool:
        return len(self.modes) > 1


def to_absolute(request: FractionRequest, gpu_memory_mib: int, reserve_mib: int = 0) -> tuple[int, int]:
    """``(request_mib, limit_mib)`` per device for a GPU of ``gpu_memory_mib``, as the KAI binder computes.

    usable = gpu_memory_mib - reserve_mib; a portion becomes floor(usable x portion), a portion
    limit floor(usable x portion_limit), computed in binary floating point exactly as the binder
    does so our numbers match its annotations. Raises ``ValueError`` for impossible inputs
    (nothing usable, a result of 0 MiB): this is a scheduler-side helper, not a Pod reader.
    """
    usable = gpu_memory_mib - reserve_mib
    if usable <= 0:
        raise ValueError(f"reserve {reserve_mib} MiB leaves nothing usable on a {gpu_memory_mib} MiB GPU")
    if request.request_mib is not None:
        request_mib = request.request_mib
    elif request.portion is not None:
        request_mib = math.floor(float(usable) * request.portion)
    else:
        raise ValueError("the request has neither request_mib nor portion")
    if request_mib <= 0:
        raise ValueError(f"portion {request.portion} of {usable} MiB is less than 1 MiB")
    if request.limit_mib is not None:
        limit_mib = request.limit_mib
    elif request.portion_limit is not None:
        limit_mib = math.floor(float(usable) * request.portion_limit)
    else:
        limit_mib = request_mib
    return request_mib, max(limit_mib, request_mib)


def render_placement(container: str, fraction: Fraction) -> dict[str, str]:
    """The annotations a scheduler writes for ``fraction`` on ``container`` (all four, plus portion)."""
    out = {
        nvidia_key(container, SUFFIX_REQUEST): f"{fraction.request_mib}Mi",
        nvidia_key(container, SUFFIX_LIMIT): f"{fraction.limit_mib}Mi",
        nvidia_key(container, SUFFIX_MODE): fraction.mode,
    }
    if fraction.devices:
        out[nvidia_key(container, SUFFIX_DEVICES)] = ",".join(fraction.devices)
    if fraction.portion is not None:
        # Plain decimal, never "1e-05": the value must stay readable by a decimal-only parser.
        out[nvidia_key(container, SUFFIX_PORTION)] = format(Decimal(repr(fraction.portion)), "f")
    return out


def parse_devices(value: str) -> tuple[str, ...]:
    """The entries of a ``gpus.devices`` value; raises ``ContractError("devices-format")``."""
    if value == "":
        raise ContractError("devices-format", "the device list is empty")
    if any(ch.isspace() for ch in value):
        raise ContractError("devices-format", f"{value!r} contains whitespace")
    entries = tuple(value.split(","))
    seen: set[str] = set()
    for entry in entries:
        if entry == "":
            raise ContractError("devices-format", f"{value!r} has an empty entry")
        if entry.lower() in ("all", "none", "void"):
            raise ContractError(
                "devices-format", f"{entry!r} is not a single GPU (it would expose whole GPUs)"
            )
        cdi = _CDI.fullmatch(entry)
        device = cdi.group("device") if cdi else entry
        if not (_INDEX.fullmatch(device) or _UUID.fullmatch(device)):
            raise ContractError("devices-format", f"{entry!r} is not a GPU UUID, index or CDI device name")
        if entry in seen:
            raise ContractError("devices-format", f"{entry!r} is listed twice")
        seen.add(entry)
    return entries


def node_gpu_uuids(node: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The node's GPU UUIDs in index order (annotation ``gpuconf.io/gpu-uuids``); empty if unknown."""
    raw = _dig(node, "metadata", "annotations", NODE_GPU_UUIDS)
    if not isinstance(raw, str):
        return ()
    return tuple(u for u in raw.split(",") if u)


def node_gpu_count(node: Mapping[str, Any] | None) -> int | None:
    """How many GPUs the node has: its UUID list, else label ``nvidia.com/gpu.count``; None if unknown."""
    uuids = node_gpu_uuids(node)
    if uuids:
        return len(uuids)
    raw = _dig(node, "metadata", "labels", LABEL_GPU_COUNT)
    return int(raw) if isinstance(raw, str) and _INDEX.fullmatch(raw) else None


def node_gpu_memory_mib(node: Mapping[str, Any] | None) -> int | None:
    """Memory per GPU from label ``nvidia.com/gpu.memory`` (MiB); None if absent or unusable."""
    raw = _dig(node, "metadata", "labels", LABEL_GPU_MEMORY)
    return int(raw) if isinstance(raw, str) and _INDEX.fullmatch(raw) and int(raw) > 0 else None


def resolve_device(device: str, node: Mapping[str, Any] | None = None) -> str:
    """One identity per physical GPU: a CDI name's device part, an index mapped to its UUID when the
    node's UUID list is known. Without that list an index and a UUID cannot be matched."""
    cdi = _CDI.fullmatch(device)
    inner = cdi.group("device") if cdi else device
    if _INDEX.fullmatch(inner):
        uuids = node_gpu_uuids(node)
        index = int(inner)
        return uuids[index] if index < len(uuids) else str(index)
    return inner


CDI_GPU_KIND: Final = "k8s.device-plugin.nvidia.com/gpu"
"""The NVIDIA device plugin's CDI kind, whose hook applies the memory limit (docs/contract.md §9.3)."""


def write_device(identity: str, form: str) -> str:
    """One GPU's identity (a UUID, or an index where no UUID is known) in an implementation's form:
    ``uuid`` as is, ``cdi`` as the device plugin's CDI name, ``index`` as is. Compare identities
    through ``resolve_device``, which reads all three back to one."""
    inner = resolve_device(identity)
    if form == "cdi" and not _INDEX.fullmatch(inner):
        return f"{CDI_GPU_KIND}={inner}"
    return inner


def fail_closed_containers(violations: Iterable[Violation]) -> frozenset[str]:
    """Containers a fail-closed node agent must refuse to start: those named by an error."""
    return frozenset(v.container for v in violations if v.is_error and v.container)


def pod_to_dict(pod: Any) -> dict[str, Any]:
    """A live ``V1Pod`` (or its already-serialised dict) as the plain dict this module reads.

    Uses the client's own serialiser, so field names are the API's (``nodeName``, not
    ``node_name``); list results carry no ``kind`` per item, so ``Pod`` is filled in.
    """
    data = dict(pod) if isinstance(pod, Mapping) else _serializer().sanitize_for_serialization(pod)
    data.setdefault("apiVersion", "v1")
    data.setdefault("kind", "Pod")
    return data


@functools.cache
def _serializer() -> Any:
    from kubernetes.client import ApiClient  # imported lazily: the agent's hot path never needs it

    return ApiClient()


# --------------------------------------------------------------------------- reading a Pod


@dataclass(frozen=True)
class _Ident:
    kind: str
    namespace: str
    name: str

    def violation(
        self, container: str, key: str, rule_id: str, message: str, fix: str | None = None
    ) -> Violation:
        r = RULES[rule_id]
        # the table's generic fix says <c>; here the container is known (and the prefix in use)
        fix = fix or (r.fix.replace("<c>", container) if container else r.fix)
        if _prefix != NVIDIA_PREFIX:
            fix = fix.replace(NVIDIA_PREFIX, _prefix)
        return Violation(self.kind, self.namespace, self.name, container, key, r.id, r.severity, message, fix)


@dataclass
class _Keys:
    """The nvidia.com keys of one container, parsed; a working record, never returned."""

    present: set[str] = field(default_factory=set)
    failed: bool = False
    request: Exact | None = None
    limit: Exact | None = None
    mode: Mode | None = None
    devices: tuple[str, ...] | None = None
    portion: float | None = None

    @property
    def has_memory(self) -> bool:
        return SUFFIX_REQUEST in self.present or SUFFIX_LIMIT in self.present


@dataclass
class _Pod:
    """One Pod being read: what it says, and every violation found so far (in finding order)."""

    ident: _Ident
    annotations: dict[str, str]
    """Only the contract's keys, as text."""
    containers: tuple[str, ...]
    """spec.containers then spec.initContainers (KAI admission accepts keys for either)."""
    bound: bool
    whole_gpu: tuple[str, ...]
    """Containers that request or limit whole GPUs (``nvidia.com/gpu``)."""
    keys: dict[str, _Keys] = field(default_factory=dict)
    found: list[Violation] = field(default_factory=list)

    def report(self, container: str, key: str, rule_id: str, message: str, fix: str | None = None) -> None:
        self.found.append(self.ident.violation(container, key, rule_id, message, fix))


def _dig(obj: Any, *path: str) -> Any:
    for part in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(part)
    return obj


def _ident(pod: Mapping[str, Any]) -> _Ident:
    meta = _dig(pod, "metadata")
    name = _dig(meta, "name") or _dig(meta, "generateName") or "<unnamed>"
    kind = _dig(pod, "kind") or "Pod"
    return _Ident(str(kind), str(_dig(meta, "namespace") or ""), str(name))


def _is_contract_key(key: str) -> bool:
    return (
        key.startswith(_prefix)
        or key in AUTHOR_KEYS
        or (key.startswith(KAI_PREFIX) and key.endswith(SUFFIX_PORTION_LIMIT))
    )


def _text(value: Any) -> str | None:
    """How a scalar YAML value reads once quoted; None for values no quoting could fix (maps, lists)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return None


def _split_nvidia_key(key: str) -> tuple[str, str | None]:
    """``(container, suffix)``; suffix None when unknown (the container is then a best guess).

    Matching the known suffixes, rather than splitting on dots or dashes, keeps ``my-app-2`` and
    dotted suffixes unambiguous: container names are DNS labels and contain no dots.
    """
    rest = key[len(_prefix) :]
    for suffix in NVIDIA_SUFFIXES:
        if rest.endswith(suffix):
            return rest[: -len(suffix)], suffix
        if rest == suffix[1:]:
            return "", suffix
    return rest.partition(".")[0], None


def _parse_mode(value: str) -> Mode:
    for mode in MODES:
        if value == mode:
            return mode
    raise ContractError("mode-word", f"{value!r} is not time-slicing or sm-sharing (exact, lower case)")


def _parse_number(value: str, rule_id: str) -> float:
    """A decimal number as Go's ParseFloat reads one, minus NaN and infinities (never meaningful here)."""
    number = float(value) if _NUMBER.fullmatch(value) else math.nan
    if not math.isfinite(number):
        raise ContractError(rule_id, f"{value!r} is not a decimal number")
    return number


def _parse_portion(value: str) -> float:
    portion = _parse_number(value, "portion-value")
    if not 0 < portion <= 1:
        raise ContractError("portion-value", f"{value!r} is outside (0, 1]")
    return portion


def _memory_bytes(value: str) -> Exact:
    """Validated as the agent does (>= 1 MiB), kept exact so request <= limit compares bytes as KAI does."""
    parse_memory_mib(value)
    return parse_quantity(value)


def _mib(amount: Exact) -> int:
    return math.ceil(amount / MIB)


def _num_devices(annotations: Mapping[str, str]) -> int | None:
    """``gpu-fraction-num-devices``, default 1; None when malformed."""
    raw = annotations.get(NUM_DEVICES)
    if raw is None:
        return 1
    return int(raw) if re.fullmatch(r"[+-]?[0-9]{1,18}", raw) and int(raw) >= 1 else None


def _read_pod(pod: Mapping[str, Any]) -> _Pod:
    """What both dialects share: identity, contract annotations as text, containers, nvidia keys."""
    ident = _ident(pod)
    raw = _dig(pod, "metadata", "annotations")
    annotations: dict[str, str] = {}
    bad_types: list[tuple[str, Any, str | None]] = []
    for key, value in raw.items() if isinstance(raw, Mapping) else ():
        if not isinstance(key, str) or not _is_contract_key(key):
            continue
        text = value if isinstance(value, str) else _text(value)
        if not isinstance(value, str):
            bad_types.append((key, value, text))
        if text is not None:  # keep judging the value as the author evidently meant it
            annotations[key] = text

    containers: list[str] = []
    whole_gpu: list[str] = []
    for section in ("containers", "initContainers"):
        items = _dig(pod, "spec", section)
        for item in items if isinstance(items, list) else ():
            name = _dig(item, "name")
            if not isinstance(name, str):
                continue
            containers.append(name)
            for part in ("limits", "requests"):
                amounts = _dig(item, "resources", part)
                if isinstance(amounts, Mapping) and WHOLE_GPU_RESOURCE in amounts and name not in whole_gpu:
                    whole_gpu.append(name)
    node_name = _dig(pod, "spec", "nodeName")
    bound = isinstance(node_name, str) and node_name != ""
    parsed = _Pod(ident, annotations, tuple(containers), bound, tuple(whole_gpu))

    for key, value, text in bad_types:
        container = _split_nvidia_key(key)[0] if key.startswith(_prefix) else ""
        fix = f'Quote it: {key}: "{text}"' if text else None
        parsed.report(
            container, key, "value-not-string", f"{value!r} is a {type(value).__name__}, not a string", fix
        )
    _read_nvidia_keys(parsed)
    return parsed


def _read_nvidia_keys(pod: _Pod) -> None:
    for key in sorted(k for k in pod.annotations if k.startswith(_prefix)):
        value = pod.annotations[key]
        container, suffix = _split_nvidia_key(key)
        if suffix is None:
            pod.report(container, key, "unknown-suffix", f"{key!r} ends in no known suffix")
            continue
        if container not in pod.containers:
            has = ", ".join(pod.containers) or "none"
            pod.report(
                container, key, "unknown-container", f"the Pod has no container {container!r} (it has {has})"
            )
            continue
        keys = pod.keys.setdefault(container, _Keys())
        keys.present.add(suffix)
        try:
            if suffix == SUFFIX_REQUEST:
                keys.request = _memory_bytes(value)
            elif suffix == SUFFIX_LIMIT:
                keys.limit = _memory_bytes(value)
            elif suffix == SUFFIX_MODE:
                keys.mode = _parse_mode(value)
            elif suffix == SUFFIX_DEVICES:
                keys.devices = parse_devices(value)
            else:
                keys.portion = _parse_portion(value)
        except ContractError as exc:
            keys.failed = True
            pod.report(container, key, exc.rule, exc.message)
    for container, keys in sorted(pod.keys.items()):
        if keys.request is not None and keys.limit is not None and keys.request > keys.limit:
            keys.failed = True
            request_key, limit_key = (
                nvidia_key(container, SUFFIX_REQUEST),
                nvidia_key(container, SUFFIX_LIMIT),
            )
            message = f"request {pod.annotations[request_key]!r} exceeds limit {pod.annotations[limit_key]!r}"
            pod.report(container, request_key, "request-exceeds-limit", message)


def _fraction(container: str, keys: _Keys) -> Fraction | None:
    """The enforcement for a fractional container; None when any of its keys failed (fail closed)."""
    if not keys.has_memory or keys.failed:
        return None
    request = keys.request if keys.request is not None else keys.limit
    limit = keys.limit if keys.limit is not None else keys.request
    assert request is not None and limit is not None
    mode = keys.mode or TIME_SLICING
    return Fraction(container, _mib(request), _mib(limit), mode, keys.devices or (), keys.portion)


def _placement_rules(pod: _Pod, fractional: Iterable[str], num_devices: int | None) -> None:
    """A bound Pod's fractional containers: memory, devices and their count, and (a warning) the limit."""
    for container in sorted(set(fractional)):
        keys = pod.keys.get(container, _Keys())
        request_key = nvidia_key(container, SUFFIX_REQUEST)
        devices_key = nvidia_key(container, SUFFIX_DEVICES)
        if not keys.has_memory:
            pod.report(container, request_key, "memory-missing", "bound, but no gpu-memory.request or .limit")
        if SUFFIX_DEVICES not in keys.present:
            message = "bound, but no gpus.devices: the agent applies no per-device limit (unfenced)"
            pod.report(container, devices_key, "devices-missing", message)
        elif keys.devices is not None and num_devices is not None and len(keys.devices) != num_devices:
            message = f"{len(keys.devices)} device(s) assigned; {NUM_DEVICES} asks for {num_devices}"
            pod.report(container, devices_key, "devices-count", message)
        if keys.has_memory and SUFFIX_LIMIT not in keys.present:
            message = "no gpu-memory.limit: the limit defaults to the request (no burst)"
            pod.report(container, nvidia_key(container, SUFFIX_LIMIT), "limit-missing", message)


def _mode_only(pod: _Pod, exempt: str | None) -> None:
    for container, keys in sorted(pod.keys.items()):
        if SUFFIX_MODE in keys.present and not keys.has_memory and container != exempt:
            message = "gpu-compute.mode without gpu-memory.request or .limit does nothing"
            pod.report(container, nvidia_key(container, SUFFIX_MODE), "mode-only", message)


def read_placement(pod: Mapping[str, Any]) -> tuple[dict[str, Fraction], list[Violation]]:
    """The scheduler-written keys, as the node agent reads them; never raises.

    A container is fractional only if it has a request or a limit (a mode alone does nothing);
    keys naming a container the Pod lacks are reported and yield nothing (the real agent ignores
    them); a container with any malformed key yields no ``Fraction`` (fail closed). The Pod is
    judged as a placement whether or not ``spec.nodeName`` is set, so ``devices-missing`` and
    ``limit-missing`` are reported here too. The device *count* is not judged here: the real
    agent never reads the author's ``gpu-fraction-num-devices`` and fences however many devices
    it is given, so a wrong count is the scheduler's failure (``audit_pod`` reports it), not a
    reason for the node to refuse the container.
    """
    parsed = _read_pod(pod)
    fractions = {c: f for c, keys in sorted(parsed.keys.items()) if (f := _fraction(c, keys)) is not None}
    fractional = [c for c, keys in parsed.keys.items() if keys.has_memory]
    _placement_rules(parsed, fractional, None)
    _mode_only(parsed, None)
    return fractions, parsed.found


@dataclass(frozen=True)
class _RequestView:
    """The author side of one Pod, with what the placement rules need even when it is broken."""

    request: FractionRequest | None
    target: str
    """The container the fraction is for (also when the request is malformed)."""
    asks: bool
    """Whether the Pod asks for a fraction at all, in any dialect."""
    num_devices: int | None


def read_request(pod: Mapping[str, Any]) -> tuple[FractionRequest | None, list[Violation]]:
    """The author's request in either dialect (docs/contract.md §3), with every request-side violation.

    The request is None when the Pod asks for no fraction, or when any *error* was found: a
    request with errors is one KAI admission rejects, so there is nothing to schedule. On a bound
    Pod the nvidia.com keys are the scheduler's, so the rules that forbid an *author* from writing
    them (devices, portion, a limit next to gpu-fraction) apply only to unbound Pods.
    """
    parsed = _read_pod(pod)
    view = _request(parsed)
    return view.request, parsed.found


def _request(pod: _Pod) -> _RequestView:
    ann = pod.annotations
    nv_memory = sorted(c for c, k in pod.keys.items() if k.has_memory)
    for extra in nv_memory[1:]:
        suffix = SUFFIX_REQUEST if SUFFIX_REQUEST in pod.keys[extra].present else SUFFIX_LIMIT
        listed = ", ".join(repr(c) for c in nv_memory)
        pod.report(
            extra, nvidia_key(extra, suffix), "multiple-fractional-containers", f"{listed} all ask for memory"
        )

    # The fraction's container: the one in the nvidia.com keys, else gpu-fraction-container-name,
    # else the first container (as KAI resolves it).
    named = ann.get(CONTAINER_NAME)
    if named is not None and named not in pod.containers:
        pod.report(named, CONTAINER_NAME, "unknown-container", f"the Pod has no container {named!r}")
    elif named is not None and nv_memory and named != nv_memory[0]:
        message = f"names {named!r}; the nvidia.com keys name {nv_memory[0]!r}"
        pod.report(named, CONTAINER_NAME, "container-mismatch", message)
    if nv_memory:
        target = nv_memory[0]
    elif named is not None and named in pod.containers:
        target = named
    else:
        target = pod.containers[0] if pod.containers else ""

    fraction, portion_limit = _author_portions(pod, target)
    memory, memory_limit = _author_memory(pod, target)
    num_devices = _num_devices(ann)
    if num_devices is None:
        pod.report(target, NUM_DEVICES, "num-devices-value", f"{ann[NUM_DEVICES]!r} is not an integer >= 1")

    has_fraction, has_memory = bool(ann.get(GPU_FRACTION)), bool(ann.get(GPU_MEMORY))
    asks = bool(nv_memory) or has_fraction or has_memory
    if has_fraction and has_memory:
        pod.report(target, GPU_MEMORY, "dialect-conflict", "gpu-fraction and gpu-memory together")
    keys = pod.keys.get(target, _Keys())
    if (
        not pod.bound
        and SUFFIX_LIMIT in keys.present
        and (has_fraction or (has_memory and GPU_MEMORY_LIMIT not in ann))
    ):
        message = f"an nvidia.com limit next to {GPU_FRACTION if has_fraction else GPU_MEMORY}"
        pod.report(target, nvidia_key(target, SUFFIX_LIMIT), "dialect-conflict", message)
    if memory is not None and keys.request is not None and keys.request != memory * MIB:
        written = ann[nvidia_key(target, SUFFIX_REQUEST)]
        message = f"gpu-memory {memory} MiB differs from the nvidia.com request {written!r}"
        pod.report(target, GPU_MEMORY, "dialect-conflict", message)
    if NUM_DEVICES in ann and not asks:
        pod.report(
            target, NUM_DEVICES, "num-devices-value", "set without gpu-fraction, gpu-memory or a request"
        )
    for container in pod.whole_gpu if asks else ():
        message = "requests whole GPUs while the Pod asks for a fraction"
        pod.report(container, f"resources.{WHOLE_GPU_RESOURCE}", "whole-gpu-conflict", message)
    if not pod.bound:
        for container, ckeys in sorted(pod.keys.items()):
            for suffix, rule_id in (
                (SUFFIX_DEVICES, "devices-set-by-author"),
                (SUFFIX_PORTION, "portion-set-by-author"),
            ):
                if suffix in ckeys.present:
                    pod.report(
                        container, nvidia_key(container, suffix), rule_id, "set on a Pod that is not bound"
                    )
        # a mode next to gpu-fraction/gpu-memory is the author's choice of mode for that fraction
        _mode_only(pod, target if (has_fraction or has_memory) else None)

    request: FractionRequest | None = None
    if asks and not any(v.is_error for v in pod.found):
        mode, count = keys.mode or TIME_SLICING, num_devices or 1
        f = _fraction(target, keys)
        if f is not None:
            limit = f.limit_mib if SUFFIX_LIMIT in keys.present else None
            request = FractionRequest(
                target, "nvidia", f.request_mib, limit, None, portion_limit, count, mode
            )
        elif fraction is not None:
            request = FractionRequest(
                target, "gpu-fraction", None, None, fraction, portion_limit, count, mode
            )
        elif memory is not None:
            request = FractionRequest(target, "gpu-memory", memory, memory_limit, None, None, count, mode)
    return _RequestView(request, target, asks, num_devices)


def _author_portions(pod: _Pod, target: str) -> tuple[float | None, float | None]:
    """gpu-fraction and its limit (either spelling), validated as KAI admission does."""
    ann = pod.annotations
    fraction: float | None = None
    raw = ann.get(GPU_FRACTION)
    if raw is not None:
        try:
            fraction = _parse_number(raw, "fraction-value")
            if not 0 < fraction < 1:
                raise ContractError("fraction-value", f"{raw!r} is not strictly between 0 and 1")
        except ContractError as exc:
            fraction = None
            pod.report(target, GPU_FRACTION, exc.rule, exc.message)

    limits: list[tuple[str, str, str]] = []  # (key, container, value)
    if GPU_FRACTION_LIMIT in ann:
        limits.append((GPU_FRACTION_LIMIT, target, ann[GPU_FRACTION_LIMIT]))
    for key in sorted(k for k in ann if k.startswith(KAI_PREFIX)):
        container = key[len(KAI_PREFIX) : -len(SUFFIX_PORTION_LIMIT)]
        if container not in pod.containers:
            pod.report(container, key, "unknown-container", f"the Pod has no container {container!r}")
            continue
        if container != target:
            pod.report(
                container, key, "container-mismatch", f"names {container!r}; the fraction is for {target!r}"
            )
        limits.append((key, container, ann[key]))

    portion_limit: float | None = None
    chosen = ""
    for key, container, value in limits:
        if not raw:
            pod.report(container, key, "limit-without-request", f"set without {GPU_FRACTION}")
            continue
        try:
            limit = _parse_number(value, "fraction-limit-value")
            if len(value.partition(".")[2]) > 5:
                raise ContractError("fraction-limit-value", f"{value!r} has more than 5 decimals")
            if not 0 < limit < 1:
                raise ContractError("fraction-limit-value", f"{value!r} is not strictly between 0 and 1")
            if fraction is not None and limit <= fraction:
                raise ContractError(
                    "fraction-limit-value", f"{value!r} is not greater than gpu-fraction {raw!r}"
                )
        except ContractError as exc:
            pod.report(container, key, exc.rule, exc.message)
            continue
        if portion_limit is not None and limit != portion_limit:
            pod.report(container, key, "dialect-conflict", f"{value!r} differs from {chosen} {ann[chosen]!r}")
            continue
        portion_limit, chosen = limit, key
    return fraction, portion_limit


def _author_memory(pod: _Pod, target: str) -> tuple[int | None, int | None]:
    """gpu-memory (whole MiB) and gpu-memory.limit (a quantity with a unit, >= gpu-memory), in MiB."""
    ann = pod.annotations
    memory: int | None = None
    raw = ann.get(GPU_MEMORY)
    if raw is not None:
        if re.fullmatch(r"[0-9]{1,19}", raw) and int(raw) > 0:
            memory = int(raw)
        else:
            pod.report(target, GPU_MEMORY, "gpu-memory-value", f"{raw!r} is not a whole number of MiB > 0")
    raw_limit = ann.get(GPU_MEMORY_LIMIT)
    if raw_limit is None:
        return memory, None
    if not raw:
        pod.report(target, GPU_MEMORY_LIMIT, "limit-without-request", f"set without {GPU_MEMORY}")
        return memory, None
    if _NUMBER.fullmatch(raw_limit):  # KAI refuses anything that reads as a plain number
        pod.report(target, GPU_MEMORY_LIMIT, "memory-unit", f"{raw_limit!r} has no unit")
        return memory, None
    try:
        limit = _memory_bytes(raw_limit)
    except ContractError as exc:
        pod.report(target, GPU_MEMORY_LIMIT, exc.rule, exc.message)
        return memory, None
    if memory is not None and limit < memory * MIB:
        message = f"limit {raw_limit!r} is below gpu-memory {memory} MiB"
        pod.report(target, GPU_MEMORY_LIMIT, "request-exceeds-limit", message)
        return memory, None
    return memory, _mib(limit)


# --------------------------------------------------------------------------- audits


def audit_pod(
    pod: Mapping[str, Any], node: Mapping[str, Any] | None = None, *, sm_sharing_enabled: bool = True
) -> list[Violation]:
    """Every violation on one Pod (or Pod template); never raises.

    Always the request rules. For a bound Pod (``spec.nodeName`` set) also the placement rules:
    each fractional container (any with a request or limit, and the one the author's request
    targets) must carry memory and ``gpus.devices``, as many devices as
    ``gpu-fraction-num-devices``; a missing limit is a warning. Given the Pod's ``node``, every
    assigned device must exist there. ``sm_sharing_enabled=False`` reports any sm-sharing use.
    """
    parsed = _read_pod(pod)
    view = _request(parsed)
    if parsed.bound:
        fractional = {c for c, k in parsed.keys.items() if k.has_memory}
        if view.asks and view.target:
            fractional.add(view.target)
        _placement_rules(parsed, fractional, view.num_devices)
        _mode_only(parsed, view.target if view.asks else None)
        if node is not None:
            _devices_exist(parsed, fractional, node)
    if not sm_sharing_enabled:
        for container, keys in sorted(parsed.keys.items()):
            if keys.mode == SM_SHARING:
                key = nvidia_key(container, SUFFIX_MODE)
                parsed.report(container, key, "mode-disabled", "sm-sharing is disabled on this cluster")
    return list(dict.fromkeys(parsed.found))  # drop repeats, keep finding order


def _devices_exist(pod: _Pod, fractional: Iterable[str], node: Mapping[str, Any]) -> None:
    uuids, count = node_gpu_uuids(node), node_gpu_count(node)
    node_name = str(_dig(node, "metadata", "name") or "")
    has = f"it has {count} GPU(s)" if count is not None else "it has no GPU record"
    for container in sorted(fractional):
        key = nvidia_key(container, SUFFIX_DEVICES)
        seen: dict[str, str] = {}
        for device in pod.keys.get(container, _Keys()).devices or ():
            cdi = _CDI.fullmatch(device)
            inner = cdi.group("device") if cdi else device
            if _INDEX.fullmatch(inner):
                missing = count is not None and int(inner) >= count
            else:
                missing = bool(uuids) and inner not in uuids  # without the UUID list a UUID cannot be checked
            if missing:
                pod.report(
                    container,
                    key,
                    "devices-unknown",
                    f"{device!r} is not a GPU of node {node_name!r} ({has})",
                )
                continue
            same = resolve_device(device, node)
            if same in seen:
                message = f"{seen[same]!r} and {device!r} are the same GPU of node {node_name!r}"
                pod.report(container, key, "devices-format", message)
            seen[same] = device


def _nodes_by_name(nodes: Iterable[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    return {str(_dig(n, "metadata", "name")): n for n in nodes if isinstance(n, Mapping)}


def gpu_loads(
    pods: Iterable[Mapping[str, Any]], nodes: Iterable[Mapping[str, Any]] = ()
) -> dict[tuple[str, str], GpuLoad]:
    """What each physical GPU holds: per ``(node, gpu)``, every container placed on it.

    Counts bound Pods that have not finished (phase not Succeeded/Failed) and whose placement
    parses; a request applies to each of the container's devices. GPU identity is resolved
    through the node's UUID list when known, so index ``0`` and its UUID are one GPU.
    """
    by_name = _nodes_by_name(nodes)
    shares: dict[tuple[str, str], list[GpuShare]] = {}
    for pod in pods:
        node_name = _dig(pod, "spec", "nodeName")
        if (
            not isinstance(node_name, str)
            or not node_name
            or _dig(pod, "status", "phase") in ("Succeeded", "Failed")
        ):
            continue
        ident, node = _ident(pod), by_name.get(node_name)
        for fraction in read_placement(pod)[0].values():
            share = GpuShare(
                ident.namespace, ident.name, fraction.container, fraction.request_mib, fraction.mode
            )
            for gpu in dict.fromkeys(resolve_device(d, node) for d in fraction.devices):
                shares.setdefault((node_name, gpu), []).append(share)
    return {key: GpuLoad(key[0], key[1], tuple(s)) for key, s in sorted(shares.items())}


def audit_gpus(
    pods: Iterable[Mapping[str, Any]], nodes: Iterable[Mapping[str, Any]], reserve_mib: int = 0
) -> list[Violation]:
    """Per-GPU rules across all Pods: no mixed compute modes, requests within usable memory.

    Each finding names the Node, with the GPU as ``key`` and the Pods involved in the message.
    Overcommit is judged against label ``nvidia.com/gpu.memory`` minus ``reserve_mib``, and only
    where that label is present.
    """
    node_list = list(nodes)
    by_name = _nodes_by_name(node_list)
    out: list[Violation] = []
    for (node_name, gpu), load in gpu_loads(pods, node_list).items():
        ident = _Ident("Node", "", node_name)
        if load.mixed:
            parts = "; ".join(f"{m}: {_who(s for s in load.shares if s.mode == m)}" for m in MODES)
            out.append(ident.violation("", gpu, "mode-mixing", f"GPU {gpu} holds both modes ({parts})"))
        capacity = node_gpu_memory_mib(by_name.get(node_name))
        if capacity is not None and load.request_mib > capacity - reserve_mib:
            usable = capacity - reserve_mib
            message = (
                f"GPU {gpu}: {load.request_mib} MiB requested, {usable} MiB usable ({_who(load.shares)})"
            )
            out.append(ident.violation("", gpu, "gpu-overcommit", message))
    return out


def _who(shares: Iterable[GpuShare]) -> str:
    return ", ".join(f"{s.namespace + '/' if s.namespace else ''}{s.pod}[{s.container}]" for s in shares)

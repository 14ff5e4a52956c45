"""The allocation workload's plan: what to do, step by step, parsed strictly into frozen dataclasses.

A plan is JSON, ``{"name": "...", "steps": [{"op": "alloc", "bytes": "1Gi"}, ...]}`` or just the
list of steps. It is written by the conformance checks, so every mistake in it is a bug in a check:
unknown ops, unknown keys (``"byte"`` for ``"bytes"``), wrong types and impossible values are all
refused up front with the path of the offending value, before the workload touches a GPU, and the
workload exits with its plan-error code instead of running half a plan.

Sizes are byte counts or Kubernetes-style quantities (``"512Mi"``, ``"1Gi"``, ``"1G"``).

Ops (see ``STEP_TYPES``): ``alloc``, ``alloc-until-oom``, ``touch``, ``verify``, ``hold``, ``free``,
``meminfo``, ``cuda-devices``, ``smi``, ``compute``, ``calibrate``, ``fault``, ``heartbeat``, ``ready``,
``env``.
Every step takes ``expect``: ``ok`` (the default) or ``any`` (record a failure and go on);
``alloc`` also takes ``oom`` and ``pressure``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, ClassVar

MiB = 1 << 20
"""One mebibyte: the unit every size in gpuconf is counted in (the one definition of it)."""

_UNITS = {
    "": 1,
    "Ki": 1 << 10,
    "Mi": 1 << 20,
    "Gi": 1 << 30,
    "Ti": 1 << 40,
    "Pi": 1 << 50,
    "k": 10**3,
    "K": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
}
_QUANTITY = re.compile(r"^(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|Pi|k|K|M|G|T|P)?$")

SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1", "SIGUSR2")
EXPECT_ANY_STEP = ("ok", "any")
EXPECT_ALLOC = ("ok", "oom", "pressure", "any")


class PlanError(ValueError):
    """The plan cannot be run as written; the message names where."""


def parse_bytes(value: Any, where: str) -> int:
    """A byte count: a non-negative integer or a quantity string (``1Gi``, ``512Mi``, ``1G``)."""
    if isinstance(value, bool):
        raise PlanError(f"{where}: expected a size, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise PlanError(f"{where}: size must not be negative, got {value}")
        return value
    if isinstance(value, str):
        m = _QUANTITY.match(value)
        if m:
            try:
                return int(Decimal(m.group(1)) * _UNITS[m.group(2) or ""])
            except InvalidOperation:  # pragma: no cover - the regex admits only decimals
                pass
    raise PlanError(f"{where}: {value!r} is not a size (bytes, or a quantity such as 512Mi, 1Gi, 1G)")


class _Fields:
    """One step's raw mapping, read key by key; ``done()`` refuses whatever was not read."""

    def __init__(self, raw: Mapping[str, Any], where: str) -> None:
        self._raw = raw
        self._seen = {"op"}
        self.where = where

    def _get(self, key: str) -> Any:
        self._seen.add(key)
        return self._raw.get(key)

    def size(self, key: str, default: int | None = None, minimum: int = 1) -> int:
        value = self._get(key)
        if value is None:
            if default is None:
                raise PlanError(f"{self.where}.{key}: required")
            return default
        n = parse_bytes(value, f"{self.where}.{key}")
        if n < minimum:
            raise PlanError(f"{self.where}.{key}: must be at least {minimum} bytes, got {n}")
        return n

    def optional_size(self, key: str) -> int | None:
        return None if self._raw.get(key) is None else self.size(key)

    def integer(self, key: str, default: int, minimum: int = 0) -> int:
        value = self._get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise PlanError(f"{self.where}.{key}: expected an integer >= {minimum}, got {value!r}")
        return value

    def seconds(self, key: str, default: float | None, minimum: float = 0.0) -> float | None:
        value = self._get(key)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float) or value < minimum:
            raise PlanError(f"{self.where}.{key}: expected a number of seconds >= {minimum:g}, got {value!r}")
        return float(value)

    def text(
        self, key: str, default: str | None = None, choices: tuple[str, ...] | None = None
    ) -> str | None:
        value = self._get(key)
        if value is None:
            return default
        if not isinstance(value, str) or (choices is not None and value not in choices):
            allowed = f" (one of {', '.join(choices)})" if choices else ""
            raise PlanError(f"{self.where}.{key}: expected a string{allowed}, got {value!r}")
        return value

    def expect(self, choices: tuple[str, ...] = EXPECT_ANY_STEP) -> str:
        value = self.text("expect", "ok", choices)
        assert value is not None
        return value

    def until(self, *, required: bool) -> Until:
        until = Until(
            seconds=self.seconds("seconds", None),
            file=self.text("until_file"),
            signal=self.text("until_signal", None, SIGNALS),
            count=self.integer("count", 0, 0) or None,
        )
        if (
            required
            and until.seconds is None
            and until.file is None
            and until.signal is None
            and not until.count
        ):
            raise PlanError(f"{self.where}: give at least one of seconds, until_file, until_signal, count")
        return until

    def done(self) -> None:
        unknown = sorted(set(self._raw) - self._seen)
        if unknown:
            raise PlanError(f"{self.where}: unknown key(s) {', '.join(unknown)}")


@dataclass(frozen=True)
class Until:
    """When a hold or a heartbeat ends: whichever of its conditions happens first."""

    seconds: float | None = None
    file: str | None = None  # ends once this path exists
    signal: str | None = None  # ends once this signal arrives (also if it arrived earlier)
    count: int | None = None  # heartbeats only: after this many beats


@dataclass(frozen=True)
class AllocStep:
    """Allocate ``nbytes`` in pieces of ``chunk`` (default: one piece); keep it under ``label``."""

    OP: ClassVar[str] = "alloc"
    nbytes: int
    chunk: int
    device: int = 0
    label: str = ""
    expect: str = "ok"
    retry_on_pressure_s: float = 0.0  # keep retrying a pressure refusal this long (evictions take time)
    retry_interval_s: float = 0.2
    retry_on_oom_s: float = 0.0
    """Keep retrying an out-of-memory this long: on a real GPU (and the simulated H200) a guaranteed
    claimant's allocation fails with out-of-memory until the eviction it waits for has landed."""

    @classmethod
    def parse(cls, f: _Fields) -> AllocStep:
        nbytes = f.size("bytes")
        return cls(
            nbytes=nbytes,
            chunk=min(f.size("chunk", nbytes), nbytes),
            device=f.integer("device", 0),
            label=f.text("label", "") or "",
            expect=f.expect(EXPECT_ALLOC),
            retry_on_pressure_s=f.seconds("retry_on_pressure", 0.0) or 0.0,
            retry_interval_s=f.seconds("retry_interval", 0.2, 0.001) or 0.2,
            retry_on_oom_s=f.seconds("retry_on_oom", 0.0) or 0.0,
        )


@dataclass(frozen=True)
class AllocUntilOomStep:
    """Find the most this client can allocate on a device, to ``granularity``; keep it allocated.

    Grows the piece size by doubling from ``granularity`` until an allocation fails, then halves it
    down to ``granularity``, never growing again: at most about 2·log2(max/granularity) calls (80 GiB
    at 1 MiB: 35), where one granule at a time would take 81,920. ``limit`` caps the total tried;
    without it the search stops once it holds more than the device reports as its total memory
    (``stopped_by: above-total``): no allocation past that can be charged, so a node that grants
    them for nothing (sub-page allocations free) cannot keep the search going for ever.
    """

    OP: ClassVar[str] = "alloc-until-oom"
    granularity: int = MiB
    device: int = 0
    limit: int | None = None
    label: str = ""
    expect: str = "ok"

    @classmethod
    def parse(cls, f: _Fields) -> AllocUntilOomStep:
        return cls(
            granularity=f.size("granularity", MiB),
            device=f.integer("device", 0),
            limit=f.optional_size("limit"),
            label=f.text("label", "") or "",
            expect=f.expect(),
        )


@dataclass(frozen=True)
class TouchStep:
    """Write every byte of the held memory (all of it, or one label's) so it is really resident."""

    OP: ClassVar[str] = "touch"
    label: str | None = None
    expect: str = "ok"

    @classmethod
    def parse(cls, f: _Fields) -> TouchStep:
        return cls(label=f.text("label"), expect=f.expect())


@dataclass(frozen=True)
class VerifyStep:
    """Read back every byte of the held memory (all of it, or one label's) and compare it with what
    the plan's ``touch`` wrote there: memory a neighbour or the device took or scrubbed shows here,
    where a usage counter would not. Every piece read must have been touched before."""

    OP: ClassVar[str] = "verify"
    label: str | None = None
    expect: str = "ok"

    @classmethod
    def parse(cls, f: _Fields) -> VerifyStep:
        return cls(label=f.text("label"), expect=f.expect())


@dataclass(frozen=True)
class FreeStep:
    OP: ClassVar[str] = "free"
    label: str | None = None  # None: everything held
    expect: str = "ok"

    @classmethod
    def parse(cls, f: _Fields) -> FreeStep:
        return cls(label=f.text("label"), expect=f.expect())


@dataclass(frozen=True)
class HoldStep:
    """Keep what is held until ``until`` says stop."""

    OP: ClassVar[str] = "hold"
    until: Until
    expect: str = "ok"

    @classmethod
    def parse(cls, f: _Fields) -> HoldStep:
        until = f.until(required=True)
        if until.count:
            raise PlanError(f"{f.where}.count: only heartbeat counts beats")
        return cls(until=until, expect=f.expect())


@dataclass(frozen=True)
class HeartbeatStep:
    """A progress line every ``interval_s``, each proving the device still answers, until ``until``."""

    OP: ClassVar[str] = "heartbeat"
    until: Until
    interval_s: float = 1.0
    expect: str = "ok"

    @classmethod
    def parse(cls, f: _Fields) -> HeartbeatStep:
        return cls(
            until=f.until(required=True),
            interval_s=f.seconds("interval", 1.0, 0.001) or 1.0,
            expect=f.expect(),
        )


@dataclass(frozen=True)
class MemInfoStep:
    OP: ClassVar[str] = "meminfo"
    expect: str = "ok"

    @classmethod
    def parse(cls, f: _Fields) -> MemInfoStep:
        return cls(expect=f.expect())


@dataclass(frozen=True)
class CudaDevicesStep:
    """Record the devices CUDA enumerates (``cudaGetDeviceCount``, each one's properties): their
    count, and each one's UUID, name and total memory (``totalGlobalMem``)."""

    OP: ClassVar[str] = "cuda-devices"
    expect: str = "ok"

    @classmethod
    def parse(cls, f: _Fields) -> CudaDevicesStep:
        return cls(expect=f.expect())


@dataclass(frozen=True)
class SmiStep:
    """Run ``nvidia-smi --query-gpu=index,uuid,memory.total,memory.used`` and record what it says."""

    OP: ClassVar[str] = "smi"
    timeout_s: float = 30.0
    expect: str = "ok"

    @classmethod
    def parse(cls, f: _Fields) -> SmiStep:
        return cls(timeout_s=f.seconds("timeout", 30.0, 0.1) or 30.0, expect=f.expect())


CALIBRATED = 0
"""``matrix: "calibrated"``: the size an earlier ``calibrate`` step of the plan picked."""


def _matrix(f: _Fields, default: int) -> int:
    if f._raw.get("matrix") == "calibrated":
        f._seen.add("matrix")
        return CALIBRATED
    return f.integer("matrix", default, 16)


@dataclass(frozen=True)
class ComputeStep:
    """Run busy kernels back to back for ``seconds``; record a summary (counters, digest of the spans).

    The result keeps what a judgement needs: kernels, work and its rate (the workload's own
    counters), the first start and the last end, and on the simulated device the time shared with
    another client's kernels; each kernel's span goes to the log, with a digest in the result.
    """

    OP: ClassVar[str] = "compute"
    seconds: float
    device: int = 0
    kernel_s: float = 0.05  # sim: each kernel's duration alone; cupy: ignored (a batch of matmuls)
    matrix: int = 4096  # n of the n×n float32 matmul each kernel runs (sim: sets its SM share)
    expect: str = "ok"

    @classmethod
    def parse(cls, f: _Fields) -> ComputeStep:
        seconds = f.seconds("seconds", None, 0.001)
        if seconds is None:
            raise PlanError(f"{f.where}.seconds: required")
        kernel_ms = f.seconds("kernel_ms", 50.0, 0.1)
        assert kernel_ms is not None
        return cls(
            seconds=seconds,
            device=f.integer("device", 0),
            kernel_s=kernel_ms / 1000.0,
            matrix=_matrix(f, 4096),
            expect=f.expect(),
        )


CALIBRATION_SIZES = (4096, 2048, 1024, 512)
CALIBRATION_SPEEDUP = 1.6
"""Two streams of a kernel that does not fill the GPU do nearly twice the work of one."""


@dataclass(frozen=True)
class CalibrateStep:
    """Pick a kernel size that does not fill the GPU alone (docs/contract.md §7).

    For each size, largest first, run kernels on one stream, then on two at once, ``seconds``
    each; a kernel that fills the GPU gains nothing from a second stream, a smaller one nearly
    doubles its work. The largest size with a gain of ``CALIBRATION_SPEEDUP`` is picked (the
    smallest if none gains), and a later ``compute`` with ``matrix: "calibrated"`` uses it.
    """

    OP: ClassVar[str] = "calibrate"
    seconds: float = 0.15
    device: int = 0
    kernel_s: float = 0.02
    sizes: tuple[int, ...] = CALIBRATION_SIZES
    expect: str = "ok"

    @classmethod
    def parse(cls, f: _Fields) -> CalibrateStep:
        kernel_ms = f.seconds("kernel_ms", 20.0, 0.1)
        assert kernel_ms is not None
        raw = f._get("sizes")
        sizes = CALIBRATION_SIZES
        if raw is not None:
            if not isinstance(raw, list) or not raw or not all(isinstance(n, int) and n >= 16 for n in raw):
                raise PlanError(f"{f.where}.sizes: expected a non-empty list of matrix sizes >= 16")
            sizes = tuple(sorted(set(raw), reverse=True))
        return cls(
            seconds=f.seconds("seconds", 0.15, 0.001) or 0.15,
            device=f.integer("device", 0),
            kernel_s=kernel_ms / 1000.0,
            sizes=sizes,
            expect=f.expect(),
        )


@dataclass(frozen=True)
class FaultStep:
    """Fault the device on purpose (an illegal-address kernel). The context is lost: the plan ends."""

    OP: ClassVar[str] = "fault"
    device: int = 0
    expect: str = "ok"

    @classmethod
    def parse(cls, f: _Fields) -> FaultStep:
        return cls(device=f.integer("device", 0), expect=f.expect(("ok",)))


READY_PATH_ENV = "GPUCONF_READY_PATH"
DEFAULT_READY_PATH = "/tmp/gpuconf-ready"
"""Where ``ready`` marks the container ready: the runtime's convention (``GPUCONF_READY_PATH``, the
sandbox's simulated kubelet sets it) or this file, which a readiness probe tests for."""
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class ReadyStep:
    """Mark the container ready (a file its readiness probe looks for): "what came before is done".

    A check waits for the Pod's Ready condition instead of guessing how long the steps before it
    take: the only way to order one Pod's steps against another's on any cluster, logs or not.
    """

    OP: ClassVar[str] = "ready"
    path: str | None = None  # None: $GPUCONF_READY_PATH, else DEFAULT_READY_PATH
    expect: str = "ok"

    @classmethod
    def parse(cls, f: _Fields) -> ReadyStep:
        return cls(path=f.text("path"), expect=f.expect())


@dataclass(frozen=True)
class EnvStep:
    """Record the values of the named environment variables (null for an unset one)."""

    OP: ClassVar[str] = "env"
    names: tuple[str, ...] = ()
    expect: str = "ok"

    @classmethod
    def parse(cls, f: _Fields) -> EnvStep:
        raw = f._get("names")
        if not isinstance(raw, list) or not raw:
            raise PlanError(f"{f.where}.names: expected a non-empty list of variable names, got {raw!r}")
        for i, name in enumerate(raw):
            if not isinstance(name, str) or not _ENV_NAME.fullmatch(name):
                raise PlanError(f"{f.where}.names[{i}]: {name!r} is not an environment variable name")
        return cls(names=tuple(raw), expect=f.expect())


Step = (
    AllocStep
    | AllocUntilOomStep
    | TouchStep
    | VerifyStep
    | FreeStep
    | HoldStep
    | HeartbeatStep
    | MemInfoStep
    | CudaDevicesStep
    | SmiStep
    | ComputeStep
    | CalibrateStep
    | FaultStep
    | ReadyStep
    | EnvStep
)
STEP_TYPES: tuple[type[Step], ...] = (
    AllocStep,
    AllocUntilOomStep,
    TouchStep,
    VerifyStep,
    HoldStep,
    FreeStep,
    MemInfoStep,
    CudaDevicesStep,
    SmiStep,
    ComputeStep,
    CalibrateStep,
    FaultStep,
    HeartbeatStep,
    ReadyStep,
    EnvStep,
)
_BY_OP: dict[str, type[Step]] = {t.OP: t for t in STEP_TYPES}


@dataclass(frozen=True)
class Plan:
    name: str
    steps: tuple[Step, ...]

    @property
    def awaited_signals(self) -> frozenset[str]:
        """Signals some step waits for: these are latched, not treated as a request to terminate."""
        out = set()
        for step in self.steps:
            until = getattr(step, "until", None)
            if until is not None and until.signal:
                out.add(until.signal)
        return frozenset(out)


def parse_plan(raw: str | bytes | Mapping[str, Any] | list[Any]) -> Plan:
    """A plan from JSON text, or from the already-decoded object."""
    data: Any = raw
    if isinstance(raw, str | bytes):
        try:
            data = json.loads(raw)
        except ValueError as exc:
            raise PlanError(f"plan is not JSON: {exc}") from None
    name = "plan"
    if isinstance(data, Mapping):
        unknown = sorted(set(data) - {"name", "steps"})
        if unknown:
            raise PlanError(f"plan: unknown key(s) {', '.join(unknown)}")
        name = data.get("name", name)
        if not isinstance(name, str):
            raise PlanError(f"plan.name: expected a string, got {name!r}")
        data = data.get("steps")
    if not isinstance(data, list) or not data:
        raise PlanError("plan: steps must be a non-empty list")
    steps = []
    for i, raw_step in enumerate(data):
        where = f"steps[{i}]"
        if not isinstance(raw_step, Mapping):
            raise PlanError(f"{where}: expected an object with an op")
        op = raw_step.get("op")
        cls = _BY_OP.get(op) if isinstance(op, str) else None
        if cls is None:
            raise PlanError(f"{where}.op: {op!r} is not one of {', '.join(_BY_OP)}")
        fields = _Fields(raw_step, f"{where}({op})")
        step = cls.parse(fields)
        fields.done()
        steps.append(step)
    return Plan(name=name, steps=tuple(steps))


# ---- the other way: typed steps to the plan's JSON, and the builders checks write plans with


def _until_wire(until: Until) -> dict[str, Any]:
    wire: dict[str, Any] = {}
    if until.seconds is not None:
        wire["seconds"] = until.seconds
    if until.file is not None:
        wire["until_file"] = until.file
    if until.signal is not None:
        wire["until_signal"] = until.signal
    if until.count:
        wire["count"] = until.count
    return wire


def _ms(seconds: float) -> float:
    return round(seconds * 1000.0, 6)


def step_wire(step: Step) -> dict[str, Any]:
    """``step`` as the plan's JSON writes it: the inverse of parsing (``parse_plan`` reads back the
    same step). Values equal to their defaults are left out, so a plan reads as a person writes it."""
    wire: dict[str, Any] = {"op": step.OP}
    if isinstance(step, AllocStep):
        wire["bytes"] = step.nbytes
        if step.chunk != step.nbytes:
            wire["chunk"] = step.chunk
        if step.retry_on_pressure_s:
            wire["retry_on_pressure"] = step.retry_on_pressure_s
        if step.retry_interval_s != 0.2:
            wire["retry_interval"] = step.retry_interval_s
        if step.retry_on_oom_s:
            wire["retry_on_oom"] = step.retry_on_oom_s
    elif isinstance(step, AllocUntilOomStep):
        if step.granularity != MiB:
            wire["granularity"] = step.granularity
        if step.limit is not None:
            wire["limit"] = step.limit
    elif isinstance(step, HoldStep | HeartbeatStep):
        wire.update(_until_wire(step.until))
        if isinstance(step, HeartbeatStep) and step.interval_s != 1.0:
            wire["interval"] = step.interval_s
    elif isinstance(step, SmiStep):
        if step.timeout_s != 30.0:
            wire["timeout"] = step.timeout_s
    elif isinstance(step, ComputeStep):
        wire["seconds"] = step.seconds
        if step.kernel_s != 0.05:
            wire["kernel_ms"] = _ms(step.kernel_s)
        if step.matrix != 4096:
            wire["matrix"] = "calibrated" if step.matrix == CALIBRATED else step.matrix
    elif isinstance(step, CalibrateStep):
        if step.seconds != 0.15:
            wire["seconds"] = step.seconds
        if step.kernel_s != 0.02:
            wire["kernel_ms"] = _ms(step.kernel_s)
        if step.sizes != CALIBRATION_SIZES:
            wire["sizes"] = list(step.sizes)
    elif isinstance(step, ReadyStep):
        if step.path is not None:
            wire["path"] = step.path
    elif isinstance(step, EnvStep):
        wire["names"] = list(step.names)
    device = getattr(step, "device", 0)
    if device:
        wire["device"] = device
    label = getattr(step, "label", None)
    if label:
        wire["label"] = label
    if step.expect != "ok":
        wire["expect"] = step.expect
    return wire


def plan_wire(name: str, *steps: Step) -> dict[str, Any]:
    """A plan's JSON from typed steps, checked as the workload will read it: a step that the workload
    would refuse (an impossible value, a count on a hold) raises ``PlanError`` here, where the check
    builds it, not in a Pod minutes later."""
    wire = {"name": name, "steps": [step_wire(s) for s in steps]}
    parsed = parse_plan(wire)
    if parsed.steps != tuple(steps):
        raise PlanError(
            f"plan {name}: a step does not survive its own JSON: {list(steps)} != {list(parsed.steps)}"
        )
    return wire


# The builders: one per op, in the words a check reads (sizes in MiB, as checks think of them).


def alloc(
    mib: int,
    *,
    label: str = "",
    chunk_mib: int | None = None,
    device: int = 0,
    expect: str = "ok",
    retry_on_pressure_s: float = 0.0,
    retry_on_oom_s: float = 0.0,
    retry_interval_s: float = 0.2,
) -> AllocStep:
    """Allocate ``mib`` MiB (in pieces of ``chunk_mib``), held under ``label``; while refused under
    pressure (or out of memory) keep retrying, every ``retry_interval_s``, for so long."""
    nbytes = mib * MiB
    return AllocStep(
        nbytes=nbytes,
        chunk=nbytes if chunk_mib is None else min(chunk_mib * MiB, nbytes),
        device=device,
        label=label,
        expect=expect,
        retry_on_pressure_s=retry_on_pressure_s,
        retry_on_oom_s=retry_on_oom_s,
        retry_interval_s=retry_interval_s,
    )


def search_boundary(
    *, granularity_mib: int = 1, device: int = 0, label: str = "", limit_mib: int | None = None
) -> AllocUntilOomStep:
    """Allocate until out-of-memory, to ``granularity_mib``, and keep it (``alloc-until-oom``)."""
    return AllocUntilOomStep(
        granularity=granularity_mib * MiB,
        device=device,
        label=label,
        limit=None if limit_mib is None else limit_mib * MiB,
    )


def touch(label: str | None = None) -> TouchStep:
    return TouchStep(label=label)


def verify(label: str | None = None) -> VerifyStep:
    return VerifyStep(label=label)


def free(label: str | None = None, *, expect: str = "ok") -> FreeStep:
    return FreeStep(label=label, expect=expect)


def meminfo(*, expect: str = "ok") -> MemInfoStep:
    return MemInfoStep(expect=expect)


def cuda_devices() -> CudaDevicesStep:
    return CudaDevicesStep()


def smi(*, expect: str = "ok") -> SmiStep:
    return SmiStep(expect=expect)


def ready() -> ReadyStep:
    return ReadyStep()


def read_env(*names: str) -> EnvStep:
    """Record the values of ``names`` in the container's environment (the ``env`` op)."""
    return EnvStep(names=tuple(names))


def fault(device: int = 0) -> FaultStep:
    return FaultStep(device=device)


def hold(
    *, until_signal: str | None = None, seconds: float | None = None, until_file: str | None = None
) -> HoldStep:
    """Keep what is held until the signal, the file or the seconds, whichever comes first."""
    return HoldStep(until=Until(seconds=seconds, file=until_file, signal=until_signal))


def heartbeat(
    every_s: float, *, until_signal: str | None = None, seconds: float | None = None, count: int | None = None
) -> HeartbeatStep:
    """A progress line every ``every_s`` (each one asks the device), until the signal, the seconds or
    the count of beats."""
    return HeartbeatStep(until=Until(seconds=seconds, signal=until_signal, count=count), interval_s=every_s)


def compute(
    seconds: float, *, kernel_ms: float = 50.0, matrix: int | str = 4096, device: int = 0
) -> ComputeStep:
    """Busy kernels back to back for ``seconds`` (``matrix="calibrated"``: an earlier calibrate's pick)."""
    return ComputeStep(
        seconds=seconds,
        device=device,
        kernel_s=kernel_ms / 1000.0,
        matrix=CALIBRATED if matrix == "calibrated" else int(matrix),
    )


def calibrate(*, seconds: float = 0.15, kernel_ms: float = 20.0, device: int = 0) -> CalibrateStep:
    return CalibrateStep(seconds=seconds, device=device, kernel_s=kernel_ms / 1000.0)

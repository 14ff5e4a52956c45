"""Where the workload's memory and kernels come from: CuPy on a real GPU, or the simulated device.

The runner (``workloads.allocate``) speaks only to the ``Backend`` protocol and catches only the
backend-neutral errors below, so everything it decides (what is an OOM, what is expected, what the
result says) is the same code on both backends and is unit-tested with a fake backend. Each backend
is small and maps its own failures onto those errors:

* ``SimBackend``: the simulated device over its Unix socket (``workloads.simclient``);
* ``CupyBackend``: CuPy with its memory pool disabled (``cupy.cuda.set_allocator(None)``), so each
  allocation is one ``cudaMalloc`` of exactly the requested size and each free is immediate; with
  the pool on, freed memory would stay cached and neither ``nvidia-smi`` nor the OOM boundary would
  match what the workload holds. ``cupy`` is imported only when this backend is built.

Selection (``select_backend``): ``sim`` when ``GPUCONF_SIM_SOCKET`` is set, else ``cupy`` when it
is importable, else a clear ``BackendUnavailable``; ``--backend`` overrides.
"""

from __future__ import annotations

import importlib.util
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from . import simclient, simwire
from .simwire import TOUCH_PATTERN

BACKEND_NAMES = ("auto", "sim", "cupy")
VERIFY_SLICE_BYTES = 8 << 20
"""How much of an allocation a real GPU's read-back compares at once (its temporary's size)."""


# ---- backend-neutral errors


class BackendError(Exception):
    """A backend failure that is none of the specific kinds below."""

    error_type = "error"


class BackendUnavailable(BackendError):
    error_type = "backend-unavailable"


class OutOfMemory(BackendError):
    """An allocation failed for want of memory: a result to record, not a crash."""

    def __init__(self, requested: int, error_type: str, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        self.requested = requested
        self.error_type = error_type  # the backend's own error class, e.g. cupy.cuda.memory.OutOfMemoryError
        self.reason = reason  # simulated device: hard-limit, device-full, guarantee-unsatisfiable


class PressureRefused(BackendError):
    """Simulated device only: refused because the GPU is full and others must be evicted first."""

    error_type = "pressure"

    def __init__(self, requested: int, candidates: tuple[str, ...], shortfall: int, message: str) -> None:
        super().__init__(message)
        self.requested = requested
        self.candidates = candidates
        self.shortfall = shortfall


class DeviceFault(BackendError):
    """A sticky device error: the context is unusable from now on."""

    def __init__(self, message: str, error_type: str = "device-fault") -> None:
        super().__init__(message)
        self.error_type = error_type


class ClientGone(BackendError):
    """The simulated device detached or evicted this client."""

    error_type = "client-gone"

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


# ---- the protocol


@dataclass(frozen=True)
class DeviceInfo:
    ordinal: int
    uuid: str
    name: str
    total_bytes: int


@dataclass(frozen=True)
class MemState:
    ordinal: int
    total_bytes: int
    used_bytes: int
    free_bytes: int


@dataclass(frozen=True)
class KernelSpan:
    start: float  # wall clock (time.time), so spans of different processes compare
    end: float
    work: float  # in the backend's work_unit
    shared_s: float | None = None  # simulated device: time another client's kernel ran beside it


SM_COUNT = 132
"""SMs of an H200 SXM (docs/contract.md §10)."""
MATMUL_TILE = 128
"""The output tile one thread block of a large float32 matmul computes (docs/contract.md §10)."""


def sm_fraction(matrix: int, sms: int = SM_COUNT) -> float:
    """The share of the GPU's SMs an n×n matmul occupies: one block per 128×128 output tile."""
    tiles = (-(-matrix // MATMUL_TILE)) ** 2
    return min(1.0, tiles / sms)


class Backend(Protocol):
    name: str
    simulated: bool
    work_unit: str

    def describe(self) -> dict[str, Any]: ...
    def devices(self) -> list[DeviceInfo]: ...
    def alloc(self, device: int, nbytes: int) -> Any: ...
    def free(self, handle: Any) -> None: ...
    def touch(self, handle: Any, pattern: int = TOUCH_PATTERN) -> None: ...
    def verify(self, handle: Any, pattern: int) -> int: ...
    def meminfo(self) -> list[MemState]: ...
    def kernel(self, device: int, seconds: float, matrix: int, streams: int = 1) -> KernelSpan: ...
    def fault(self, device: int) -> str: ...
    def close(self) -> None: ...


# ---- simulated device


class SimBackend:
    """The simulated GPU device of the node, as this container's token entitles it."""

    name = "sim"
    simulated = True
    work_unit = "kernel-seconds"

    def __init__(self, client: simclient.DeviceClient) -> None:
        self._client = client

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> SimBackend:
        try:
            return cls(simclient.DeviceClient.from_env(environ))
        except (simclient.SimConfigError, simwire.SimConnectionError, simwire.SimError) as exc:
            raise BackendUnavailable(f"simulated GPU device: {exc}") from None

    @staticmethod
    def _translate(exc: Exception, requested: int = 0) -> BackendError:
        if isinstance(exc, simwire.SimOutOfMemory):
            oom = exc.reply
            return OutOfMemory(
                requested or oom.requested_bytes, f"simulated-oom/{oom.reason}", oom.message, oom.reason
            )
        if isinstance(exc, simwire.SimPressure):
            p = exc.reply
            return PressureRefused(requested or p.requested_bytes, p.candidates, p.shortfall_bytes, p.message)
        if isinstance(exc, simwire.SimFault):
            if exc.reply.origin == "memory-manager":  # evicted by a CUDA-style error (h200 agent option)
                return DeviceFault(exc.reply.message, "simulated-cuda-error/memory-reclaimed")
            return DeviceFault(exc.reply.message, "simulated-fault/illegal-address")
        if isinstance(exc, simwire.SimGone):
            return ClientGone(exc.reply.reason, exc.reply.message)
        return BackendError(f"simulated GPU device: {exc}")

    def _call(self, fn: Any, *args: Any, requested: int = 0) -> Any:
        try:
            return fn(*args)
        except (simwire.SimError, simwire.SimConnectionError, simwire.WireError) as exc:
            raise self._translate(exc, requested) from None

    @property
    def label(self) -> str:
        """How the device is named in logs and results: "simulated GPU", "simulated H200"."""
        return "simulated H200" if self.fidelity == "h200" else "simulated GPU"

    @property
    def fidelity(self) -> str:
        return str(getattr(self._client.hello, "fidelity", "ideal") or "ideal")

    def describe(self) -> dict[str, Any]:
        h = self._client.hello
        out: dict[str, Any] = {
            "node": h.node,
            "client": h.client,
            "mode": h.mode,
            "fidelity": self.fidelity,
            "device": self.label,
        }
        if h.context_bytes:
            out["context_bytes"] = h.context_bytes
        if h.granularity_bytes > 1:
            out["granularity_bytes"] = h.granularity_bytes
        return out

    def devices(self) -> list[DeviceInfo]:
        return [DeviceInfo(d.ordinal, d.uuid, d.name, d.total_bytes) for d in self._client.hello.devices]

    def alloc(self, device: int, nbytes: int) -> Any:
        return self._call(self._client.alloc, device, nbytes, requested=nbytes).handle

    def free(self, handle: Any) -> None:
        self._call(self._client.free, handle)

    def touch(self, handle: Any, pattern: int = TOUCH_PATTERN) -> None:
        self._call(self._client.touch, handle, pattern)

    def verify(self, handle: Any, pattern: int) -> int:
        return int(self._call(self._client.verify, handle, pattern).mismatched_bytes)

    def meminfo(self) -> list[MemState]:
        reply = self._call(self._client.meminfo)
        return [MemState(d.ordinal, d.total_bytes, d.used_bytes, d.free_bytes) for d in reply.devices]

    def kernel(self, device: int, seconds: float, matrix: int, streams: int = 1) -> KernelSpan:
        reply = self._call(self._client.kernel, device, seconds, sm_fraction(matrix), streams)
        # The work is what the kernel did (its solo seconds, per stream), not how long it took:
        # a throughput from it drops when neighbours slow the kernel down.
        return KernelSpan(reply.start, reply.end, reply.work_s or seconds * streams, reply.shared_s)

    def fault(self, device: int) -> str:
        return str(self._call(self._client.fault, device).message)

    def close(self) -> None:
        self._client.close()


# ---- CuPy on a real GPU


def gpu_uuid(raw: Any) -> str:
    """A device UUID as CUDA's properties give it (16 raw bytes, or a string) in the form nvidia-smi
    and the device plugin name it: ``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx``."""
    if isinstance(raw, bytes | bytearray):
        if len(raw) != 16:
            return raw.hex()
        h = bytes(raw).hex()
        return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}"
    text = str(raw)
    return text if text.startswith(("GPU-", "MIG-")) or not text else f"GPU-{text}"


# CUDA runtime error codes that leave the context unusable (cudaErrorHardwareStackError 714 ..
# cudaErrorLaunchFailure 719, cudaErrorIllegalAddress 700, cudaErrorAssert 710) and the MPS ones a
# client sees when its shared server died with a neighbour's fault (805..812).
_STICKY = {700, 710, *range(714, 720), *range(805, 813)}


class CupyBackend:
    """A real GPU through CuPy. Runs only where CuPy and a CUDA device exist (the GPU CI tier)."""

    name = "cupy"
    simulated = False
    work_unit = "flop"

    def __init__(self) -> None:
        try:
            import cupy  # deferred: only this backend needs it, and images without a GPU lack it
        except ImportError as exc:
            raise BackendUnavailable(f"cupy is not importable: {exc}") from None
        self._cp = cupy
        try:
            cupy.cuda.set_allocator(None)  # no pool: exact sizes, immediate frees
            cupy.cuda.set_pinned_memory_allocator(None)
            self._count = int(cupy.cuda.runtime.getDeviceCount())
        except Exception as exc:  # noqa: BLE001 - whatever CUDA says here, the backend is unusable
            raise BackendUnavailable(f"no usable CUDA device: {exc}") from None
        if self._count < 1:
            raise BackendUnavailable("CUDA reports no device")
        self._matrices: dict[tuple[int, int], tuple[Any, Any]] = {}
        self._streams: dict[int, list[Any]] = {}

    def _fail(self, exc: Exception) -> BackendError:
        status = getattr(exc, "status", None)
        if type(exc).__name__ in ("CUDARuntimeError", "CUDADriverError") and status in _STICKY:
            return DeviceFault(str(exc), f"{type(exc).__module__}.{type(exc).__name__}({status})")
        return BackendError(f"{type(exc).__name__}: {exc}")

    def describe(self) -> dict[str, Any]:
        return {"cupy": str(self._cp.__version__), "devices": self._count}

    def devices(self) -> list[DeviceInfo]:
        out = []
        for d in range(self._count):
            props = self._cp.cuda.runtime.getDeviceProperties(d)
            name = props.get("name", b"")
            uuid = props.get("uuid", b"")
            out.append(
                DeviceInfo(
                    ordinal=d,
                    uuid=gpu_uuid(uuid),
                    name=name.decode(errors="replace") if isinstance(name, bytes) else str(name),
                    total_bytes=int(props.get("totalGlobalMem", 0)),
                )
            )
        return out

    def alloc(self, device: int, nbytes: int) -> Any:
        cp = self._cp
        try:
            with cp.cuda.Device(device):
                return cp.empty(nbytes, dtype=cp.uint8)
        except cp.cuda.memory.OutOfMemoryError as exc:
            raise OutOfMemory(nbytes, "cupy.cuda.memory.OutOfMemoryError", str(exc)) from None
        except Exception as exc:  # noqa: BLE001 - CuPy's errors share no base class; _fail sorts them
            raise self._fail(exc) from None

    def free(self, handle: Any) -> None:
        # With the pool disabled the array's memory is cudaFree'd when its last reference goes; the
        # runner drops its reference right after this call. Synchronise so the free is not deferred
        # behind queued work that still uses the array.
        try:
            with self._cp.cuda.Device(handle.device.id):
                self._cp.cuda.Device().synchronize()
        except Exception as exc:  # noqa: BLE001 - CuPy's errors share no base class; _fail sorts them
            raise self._fail(exc) from None

    def touch(self, handle: Any, pattern: int = TOUCH_PATTERN) -> None:
        try:
            with self._cp.cuda.Device(handle.device.id):
                handle.fill(pattern)
                self._cp.cuda.Device().synchronize()
        except Exception as exc:  # noqa: BLE001 - CuPy's errors share no base class; _fail sorts them
            raise self._fail(exc) from None

    def verify(self, handle: Any, pattern: int) -> int:
        # In slices: the comparison's temporary is as large as what it compares, and a workload
        # that holds nearly its whole limit has no room for a copy of it.
        cp = self._cp
        try:
            with cp.cuda.Device(handle.device.id):
                bad = 0
                for start in range(0, int(handle.size), VERIFY_SLICE_BYTES):
                    piece = handle[start : start + VERIFY_SLICE_BYTES]
                    bad += int(cp.count_nonzero(piece != pattern))
                return bad
        except Exception as exc:  # noqa: BLE001 - CuPy's errors share no base class; _fail sorts them
            raise self._fail(exc) from None

    def meminfo(self) -> list[MemState]:
        out = []
        try:
            for d in range(self._count):
                with self._cp.cuda.Device(d):
                    free, total = self._cp.cuda.runtime.memGetInfo()
                out.append(MemState(d, int(total), int(total) - int(free), int(free)))
        except Exception as exc:  # noqa: BLE001 - CuPy's errors share no base class; _fail sorts them
            raise self._fail(exc) from None
        return out

    def kernel(self, device: int, seconds: float, matrix: int, streams: int = 1) -> KernelSpan:
        # One "kernel" is a batch of matmuls on each of ``streams`` CUDA streams, long enough that
        # launch overhead does not decide the throughput; ``seconds`` is ignored (the size decides).
        cp = self._cp
        reps = max(1, min(64, (4096 // max(matrix, 1)) ** 2))
        try:
            with cp.cuda.Device(device):
                key = (device, matrix)
                if key not in self._matrices:
                    self._matrices[key] = (
                        cp.random.random((matrix, matrix), dtype=cp.float32),
                        cp.random.random((matrix, matrix), dtype=cp.float32),
                    )
                    cp.cuda.Device().synchronize()
                a, b = self._matrices[key]
                pool = self._streams.setdefault(device, [])
                while len(pool) < streams:
                    pool.append(cp.cuda.Stream(non_blocking=True))
                start = time.time()
                for stream in pool[:streams]:
                    with stream:
                        for _ in range(reps):
                            cp.matmul(a, b)
                for stream in pool[:streams]:
                    stream.synchronize()
                end = time.time()
        except cp.cuda.memory.OutOfMemoryError as exc:
            raise OutOfMemory(
                2 * matrix * matrix * 4, "cupy.cuda.memory.OutOfMemoryError", str(exc)
            ) from None
        except Exception as exc:  # noqa: BLE001 - CuPy's errors share no base class; _fail sorts them
            raise self._fail(exc) from None
        return KernelSpan(start, end, 2.0 * matrix**3 * reps * streams)

    def fault(self, device: int) -> str:
        cp = self._cp
        source = r"""
        extern "C" __global__ void gpuconf_fault() {
            // A store through an address no allocation owns: cudaErrorIllegalAddress, sticky.
            *(volatile int*)(0x10) = 1;
        }
        """
        try:
            with cp.cuda.Device(device):
                cp.RawKernel(source, "gpuconf_fault")((1,), (1,), ())
                cp.cuda.Device().synchronize()
        except Exception as exc:  # noqa: BLE001 - CuPy's errors share no base class; _fail sorts them
            fault = self._fail(exc)
            if isinstance(fault, DeviceFault):
                return str(fault)
            raise fault from None
        raise BackendError("the out-of-bounds kernel ran without a device fault")

    def close(self) -> None:
        self._matrices.clear()
        self._streams.clear()


class NoDevice:
    """No GPU at all (a container the node gave none): for plans of device-free steps only."""

    name = "none"
    simulated = False
    work_unit = "none"

    def __init__(self, why: str) -> None:
        self._why = why

    def describe(self) -> dict[str, Any]:
        return {"device": "none", "no_device": self._why}

    def devices(self) -> list[DeviceInfo]:
        return []

    def _none(self, *args: Any, **kwargs: Any) -> Any:
        raise BackendUnavailable(f"no GPU in this container: {self._why}")

    alloc = free = touch = verify = meminfo = kernel = fault = _none

    def close(self) -> None:
        pass


def select_backend(name: str, environ: Mapping[str, str]) -> Backend:
    """The backend ``name`` asks for; ``auto``: sim if configured, else cupy if importable."""
    if name == "auto":
        if environ.get(simwire.SIM_SOCKET_ENV):
            name = "sim"
        elif importlib.util.find_spec("cupy") is not None:
            name = "cupy"
        else:
            raise BackendUnavailable(
                f"no GPU backend: {simwire.SIM_SOCKET_ENV} is unset (no simulated device) and cupy is "
                "not installed (no real GPU support in this image)"
            )
    if name == "sim":
        return SimBackend.from_env(environ)
    if name == "cupy":
        return CupyBackend()
    raise BackendUnavailable(f"unknown backend {name!r}; choose one of {', '.join(BACKEND_NAMES)}")

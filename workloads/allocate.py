"""The allocation workload: run a plan of GPU memory and compute steps, report what happened.

Run as a container's command::

    python -m workloads.allocate --plan '{"steps": [{"op": "alloc", "bytes": "1Gi"}, {"op": "smi"}]}'
    python -m workloads.allocate --plan @/plans/holder.json    # or the plan in env GPUCONF_PLAN

It prints human progress lines on stdout (flushed, so ``kubectl logs`` follows along), then one
result JSON of at most 4096 bytes, written to the termination-message path (``/dev/termination-log``,
or ``GPUCONF_TERMINATION_PATH``, or ``--termination-path``) and echoed as the last stdout line. The
exit code (``workloads.report.ExitCode``, listed by ``--help``) tells the verdict at a glance; the
result tells the details: per step its outcome and measurements, and for an out-of-memory the size
requested, what was held at that moment and the error type. An OOM is a result, never a crash.

The workload imports nothing outside the standard library and its own package (CuPy only when the
cupy backend runs), so the ``workloads`` directory alone is a complete program.

Design: ``Runner`` executes parsed steps against a ``Backend`` and owns the decisions (expected or
not, continue or stop, which exit code); step handlers measure and return records; backends only
translate their errors. Signals are latched into an event rather than acted on in the handler,
except the terminating ones no step waits for, which end the run with a result still written.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from types import FrameType
from typing import Any, TextIO

from .backends import (
    BACKEND_NAMES,
    Backend,
    BackendError,
    BackendUnavailable,
    ClientGone,
    DeviceFault,
    NoDevice,
    OutOfMemory,
    PressureRefused,
    select_backend,
)
from .plan import (
    CALIBRATED,
    CALIBRATION_SPEEDUP,
    DEFAULT_READY_PATH,
    READY_PATH_ENV,
    AllocStep,
    AllocUntilOomStep,
    CalibrateStep,
    ComputeStep,
    CudaDevicesStep,
    EnvStep,
    FaultStep,
    FreeStep,
    HeartbeatStep,
    HoldStep,
    MemInfoStep,
    Plan,
    PlanError,
    ReadyStep,
    SmiStep,
    Step,
    TouchStep,
    Until,
    VerifyStep,
    parse_plan,
)
from .report import (
    RESULT_SCHEMA,
    ExitCode,
    render_result,
    termination_path,
    write_termination_message,
)

PLAN_ENV = "GPUCONF_PLAN"
DEVICE_FREE_STEPS = (EnvStep, ReadyStep, HoldStep)
"""Steps that touch no device: a plan of only these runs where no GPU backend is (``NoDevice``)."""
SMI_COMMAND = (
    "nvidia-smi",
    "--query-gpu=index,uuid,memory.total,memory.used",
    "--format=csv,noheader,nounits",
)
# Signals that end the run unless a step waits for them (then they are latched for that step).
TERMINATING_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP")


class Terminated(Exception):
    def __init__(self, signame: str) -> None:
        super().__init__(f"received {signame}")
        self.signame = signame


class StepError(Exception):
    """A step could not do its job for a reason of its own (not a backend error)."""


@dataclass
class _Held:
    label: str
    device: int
    handle: Any
    nbytes: int
    pattern: int | None = None
    """The byte ``touch`` wrote into all of it; None until then."""


def touch_pattern(piece: int) -> int:
    """The byte the ``touch`` of held piece number ``piece`` writes: never zero (scrubbed memory
    reads zero), and different for neighbouring pieces (one piece's bytes found in another's place
    do not read back as its own)."""
    return 1 + (0xA4 + 37 * piece) % 255


@dataclass
class _Failure:
    code: ExitCode
    error: dict[str, Any]


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB" if n % (1 << 20) else f"{n >> 20} MiB"


class Runner:
    """Runs one plan on one backend; ``run()`` returns the exit code and the full result."""

    def __init__(
        self,
        plan: Plan,
        backend: Backend,
        out: TextIO = sys.stdout,
        *,
        poll_s: float = 0.02,
        install_signal_handlers: bool = True,
        environ: Mapping[str, str] | None = None,
        ending: bool = False,
    ) -> None:
        self.plan = plan
        self.backend = backend
        self._out = out
        self._poll_s = poll_s
        self._environ = os.environ if environ is None else environ
        self._held: list[_Held] = []
        self._signals: set[str] = set()  # latched awaited signals, consumed by the step awaiting them
        self._wake: tuple[int, int] | None = None
        """A pipe the signal handler writes a byte to, so a wait in ``_sleep`` wakes for a latched
        signal. Not a ``threading.Event``: a terminating signal raises out of the handler, and raised
        inside ``Event.wait`` it left the event's lock half-released ('release unlocked lock'), which
        lost the result of a run stopped during a hold. ``select`` on a pipe holds no Python lock, so
        an exception from the handler leaves it cleanly."""
        self._install = install_signal_handlers
        self._ending = ending
        """The process ends after this run (the CLI): a terminating signal after the plan is ignored."""
        self._expected_oom = False
        self._calibrated: int | None = None
        tag = str(getattr(backend, "label", "simulated GPU")) if backend.simulated else backend.name
        self._prefix = f"gpuconf-workload ({tag}):"
        self._handlers: dict[type[Step], Callable[[Any], tuple[str, dict[str, Any]]]] = {
            AllocStep: self._alloc,
            AllocUntilOomStep: self._alloc_until_oom,
            TouchStep: self._touch,
            VerifyStep: self._verify,
            FreeStep: self._free,
            HoldStep: self._hold,
            HeartbeatStep: self._heartbeat,
            MemInfoStep: self._meminfo,
            CudaDevicesStep: self._cuda_devices,
            SmiStep: self._smi,
            ComputeStep: self._compute,
            CalibrateStep: self._calibrate,
            FaultStep: self._fault,
            ReadyStep: self._ready,
            EnvStep: self._env,
        }

    # ---- output

    def say(self, text: str) -> None:
        print(f"{self._prefix} {text}", file=self._out, flush=True)

    # ---- signals

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if name in self.plan.awaited_signals:
            self._signals.add(name)
            if self._wake is not None:
                with contextlib.suppress(OSError):  # full (a wake-up is already pending) or closed
                    os.write(self._wake[1], b"s")
        elif name in TERMINATING_SIGNALS:
            raise Terminated(name)

    def _install_signals(self) -> Callable[[], None]:
        if not self._install or threading.current_thread() is not threading.main_thread():
            return lambda: None
        names = set(TERMINATING_SIGNALS) | set(self.plan.awaited_signals)
        previous = {name: signal.signal(getattr(signal, name), self._on_signal) for name in names}

        def restore() -> None:
            # When the process is about to write its result and exit, a second SIGTERM (a kubelet
            # repeating its stop) must not kill it with the default action in between: that lost the
            # termination message once, under load. So terminating signals stay ignored then.
            for name, handler in previous.items():
                ignore = self._ending and name in TERMINATING_SIGNALS
                signal.signal(getattr(signal, name), signal.SIG_IGN if ignore else handler)

        return restore

    # ---- bookkeeping

    def held_bytes(self, device: int | None = None) -> int:
        return sum(h.nbytes for h in self._held if device is None or h.device == device)

    def _select(self, label: str | None) -> list[_Held]:
        return [h for h in self._held if label is None or h.label == label]

    def _oom_record(self, exc: OutOfMemory, device: int) -> dict[str, Any]:
        record: dict[str, Any] = {
            "requested": exc.requested,
            "held": self.held_bytes(device),
            "held_total": self.held_bytes(),
            "error_type": exc.error_type,
            "message": str(exc),
        }
        if exc.reason:
            record["reason"] = exc.reason
        return record

    @staticmethod
    def _pressure_record(exc: PressureRefused) -> dict[str, Any]:
        return {
            "requested": exc.requested,
            "shortfall": exc.shortfall,
            "candidates": list(exc.candidates),
            "message": str(exc),
        }

    # ---- the run

    def run(self) -> tuple[ExitCode, dict[str, Any]]:
        started = time.time()
        result: dict[str, Any] = {
            "gpuconf_workload": RESULT_SCHEMA,
            "status": None,
            "exit_code": None,
            "simulated": self.backend.simulated,
            "backend": self.backend.name,
            "plan": self.plan.name,
        }
        records: list[dict[str, Any]] = []
        failure: _Failure | None = None
        self._open_wake()
        restore = self._install_signals()
        try:
            try:
                result.update(self.backend.describe())
                result["devices"] = [
                    {"i": d.ordinal, "uuid": d.uuid, "name": d.name, "total": d.total_bytes}
                    for d in self.backend.devices()
                ]
                self.say(self._banner(result))
            except BackendError as exc:
                failure = self._failure_for(exc, -1, "start")
            for index, step in enumerate(self.plan.steps if failure is None else ()):
                record, failure = self._run_step(index, step)
                records.append(record)
                if failure is not None:
                    break
        except Terminated as exc:
            failure = _Failure(ExitCode.TERMINATED, {"type": "terminated", "message": str(exc)})
            self.say(f"terminated by {exc.signame}")
        finally:
            restore()
            self._close_wake()
        if failure is not None:
            code = failure.code
            result["error"] = failure.error
        else:
            code = ExitCode.EXPECTED_OOM if self._expected_oom else ExitCode.OK
        result.update(
            status=code.status,
            exit_code=int(code),
            steps_run=len(records),
            steps_total=len(self.plan.steps),
            held_bytes=self.held_bytes(),
            started_at=round(started, 3),
            wall_s=round(time.time() - started, 3),
            steps=records,
        )
        return code, result

    def _banner(self, result: dict[str, Any]) -> str:
        devices = ", ".join(f"{d['i']}: {d['name']} {_mib(d['total'])}" for d in result["devices"])
        where = ""
        if self.backend.simulated:
            label = result.get("device") or "simulated GPU"
            where = f" SIMULATED device ({label}) on node {result.get('node')},"
            where += f" client {result.get('client')}, {result.get('mode')};"
        return f"plan {self.plan.name!r}, {len(self.plan.steps)} step(s);{where} devices [{devices}]"

    def _run_step(self, index: int, step: Step) -> tuple[dict[str, Any], _Failure | None]:
        self.say(f"step {index + 1}/{len(self.plan.steps)}: {step.OP} ...")
        t0 = time.monotonic()
        try:
            outcome, details = self._handlers[type(step)](step)
            failure = self._judge(index, step, outcome, details)
        except BackendError as exc:
            outcome, details = self._outcome_of(exc), {"message": str(exc)}
            failure = (
                None
                if step.expect == "any" and outcome == "error"
                else self._failure_for(exc, index, step.OP)
            )
        except StepError as exc:
            outcome, details = "error", {"message": str(exc)}
            failure = (
                None if step.expect == "any" else _Failure(ExitCode.ERROR, self._error(index, step.OP, exc))
            )
        except Terminated as exc:
            # Recorded as this step's outcome: a check wants to see the hold that was cut short.
            outcome, details = "terminated", {"held": self.held_bytes()}
            failure = _Failure(ExitCode.TERMINATED, self._error(index, step.OP, exc, "terminated"))
            self.say(f"terminated by {exc.signame}")
        except Exception as exc:  # noqa: BLE001 - see below
            # A bug or an environment problem: still a result with exit code 1, never a traceback exit.
            outcome, details = "error", {"message": f"{type(exc).__name__}: {exc}"}
            failure = _Failure(ExitCode.ERROR, self._error(index, step.OP, exc, type(exc).__name__))
        record = {
            "i": index,
            "op": step.OP,
            "outcome": outcome,
            "ms": round((time.monotonic() - t0) * 1000, 2),
        }
        record.update(details)
        verdict = "as expected" if failure is None else f"-> {failure.code.status}"
        self.say(
            f"step {index + 1}: {step.OP} {outcome} {verdict} ({record['ms']} ms){self._summary(details)}"
        )
        return record, failure

    @staticmethod
    def _summary(details: dict[str, Any]) -> str:
        keys = ("bytes", "max_bytes", "held", "kernels", "matrix", "beats", "ended_by", "message")
        parts = [f"{k}={details[k]}" for k in keys if k in details]
        return (": " + ", ".join(parts))[:400] if parts else ""

    @staticmethod
    def _outcome_of(exc: BackendError) -> str:
        if isinstance(exc, DeviceFault):
            return "fault"
        if isinstance(exc, ClientGone):
            return "gone"
        if isinstance(exc, OutOfMemory):
            return "oom"
        if isinstance(exc, PressureRefused):
            return "pressure"
        return "error"

    @staticmethod
    def _error(index: int, op: str, exc: BaseException, error_type: str | None = None) -> dict[str, Any]:
        return {
            "step": index,
            "op": op,
            "type": error_type or getattr(exc, "error_type", type(exc).__name__),
            "message": str(exc),
        }

    def _failure_for(self, exc: BackendError, index: int, op: str) -> _Failure:
        error = self._error(index, op, exc)
        if isinstance(exc, DeviceFault):
            return _Failure(ExitCode.DEVICE_FAULT, error)
        if isinstance(exc, ClientGone):
            error["reason"] = exc.reason
            return _Failure(ExitCode.CLIENT_GONE, error)
        if isinstance(exc, OutOfMemory):
            error.update(self._oom_record(exc, -1))
            return _Failure(ExitCode.UNEXPECTED_OOM, error)
        if isinstance(exc, PressureRefused):
            return _Failure(ExitCode.PRESSURE, error)
        if isinstance(exc, BackendUnavailable):
            return _Failure(ExitCode.BACKEND_UNAVAILABLE, error)
        return _Failure(ExitCode.ERROR, error)

    def _judge(self, index: int, step: Step, outcome: str, details: dict[str, Any]) -> _Failure | None:
        """Decide whether a step's outcome is what the plan expected; None if so."""
        if outcome == "fault-injected":
            return _Failure(ExitCode.FAULT_INJECTED, {"step": index, "op": step.OP, **details})
        if outcome == step.expect or step.expect == "any":
            if outcome == "oom" and step.expect == "oom":
                self._expected_oom = True
            return None
        error = {"step": index, "op": step.OP, "expected": step.expect, "outcome": outcome}
        if outcome == "oom":
            return _Failure(ExitCode.UNEXPECTED_OOM, {**error, **details.get("oom", {})})
        if outcome == "pressure":
            return _Failure(ExitCode.PRESSURE, {**error, **details.get("pressure", {})})
        if outcome == "corrupted":
            return _Failure(ExitCode.CORRUPTED, {**error, "mismatched": details.get("mismatched")})
        return _Failure(ExitCode.EXPECTATION_NOT_MET, error)

    # ---- steps: each returns (outcome, details)

    def _alloc_once(self, step: AllocStep, size: int) -> tuple[Any, dict[str, Any] | None]:
        """One allocation, retried while refused under pressure (or out of memory, where the step
        says so: how a real GPU answers a claimant whose eviction is pending) for up to the step's
        retry times."""
        began = time.monotonic()
        attempts = 0
        first: PressureRefused | OutOfMemory | None = None
        while True:
            attempts += 1
            try:
                handle = self.backend.alloc(step.device, size)
            except PressureRefused as exc:
                first = first or exc
                if time.monotonic() + step.retry_interval_s > began + step.retry_on_pressure_s:
                    raise
                self._sleep(step.retry_interval_s)
                continue
            except OutOfMemory as exc:
                if exc.reason == "hard-limit":
                    raise  # past its own limit: no eviction will change that
                first = first or exc
                if time.monotonic() + step.retry_interval_s > began + step.retry_on_oom_s:
                    raise
                self._sleep(step.retry_interval_s)
                continue
            if first is None:
                return handle, None
            kind = "under pressure" if isinstance(first, PressureRefused) else "out of memory"
            self.say(f"allocation of {_mib(size)} granted after {attempts} attempts {kind}")
            resolved: dict[str, Any] = {
                "attempts": attempts,
                "refused_as": "pressure" if isinstance(first, PressureRefused) else "oom",
                "waited_s": round(time.monotonic() - began, 3),
            }
            if isinstance(first, PressureRefused):
                resolved.update(candidates=list(first.candidates), shortfall=first.shortfall)
            return handle, resolved

    def _alloc(self, step: AllocStep) -> tuple[str, dict[str, Any]]:
        done = pieces = 0
        details: dict[str, Any] = {"device": step.device, "requested": step.nbytes}
        while done < step.nbytes:
            size = min(step.chunk, step.nbytes - done)
            try:
                handle, pressure = self._alloc_once(step, size)
            except OutOfMemory as exc:
                details.update(bytes=done, pieces=pieces, oom=self._oom_record(exc, step.device))
                return "oom", details
            except PressureRefused as exc:
                details.update(bytes=done, pieces=pieces, pressure=self._pressure_record(exc))
                return "pressure", details
            if pressure is not None:
                details["pressure_resolved"] = pressure
            self._held.append(_Held(step.label, step.device, handle, size))
            done += size
            pieces += 1
        details.update(bytes=done, pieces=pieces, held=self.held_bytes(step.device))
        return "ok", details

    def _device_total(self, device: int) -> int | None:
        """What the device reports as this container's total memory on ``device`` (None: unknown)."""
        try:
            listed = [d for d in self.backend.devices() if d.ordinal == device]
        except BackendError:
            return None
        return listed[0].total_bytes if listed and listed[0].total_bytes > 0 else None

    def _alloc_until_oom(self, step: AllocUntilOomStep) -> tuple[str, dict[str, Any]]:
        gran = step.granularity
        chunk = gran
        total = allocs = failures = 0
        growing = True
        last: BackendError | None = None
        stopped_by = "oom"
        # Without a limit of its own, the search holds at most one granule more than the device's
        # total: past that, allocations cannot be charged, and the search would never meet an OOM.
        device_total = self._device_total(step.device) if step.limit is None else None
        ceiling = step.limit if device_total is None else device_total + gran
        while True:
            if ceiling is not None and total + chunk > ceiling:
                # Halve down to what still fits under the ceiling: the pieces stay powers of two of the
                # granule, as in the rest of the search. A piece cut to the exact remainder (an odd
                # number of granules) costs a whole page more where the device rounds up to pages, so
                # the search found less than the device allows (4 MiB less on the simulated H200).
                growing = False
                while chunk >= gran and total + chunk > ceiling:
                    chunk = chunk // 2 // gran * gran
                if chunk < gran:
                    stopped_by = "limit" if device_total is None or total <= device_total else "above-total"
                    break
            try:
                handle = self.backend.alloc(step.device, chunk)
            except (OutOfMemory, PressureRefused) as exc:
                failures += 1
                last = exc
                if chunk == gran:
                    stopped_by = "oom" if isinstance(exc, OutOfMemory) else "pressure"
                    break
                # Halve, and never grow again: what is left is now known to be less than this chunk.
                chunk = max(gran, chunk // 2 // gran * gran)
                growing = False
                continue
            allocs += 1
            total += chunk
            self._held.append(_Held(step.label, step.device, handle, chunk))
            if growing:
                chunk *= 2
        details: dict[str, Any] = {
            "device": step.device,
            "max_bytes": total,
            "granularity": gran,
            "allocs": allocs,
            "failures": failures,
            "stopped_by": stopped_by,
        }
        if stopped_by == "above-total":
            details["device_total"] = device_total
            self.say(
                f"alloc-until-oom: holds {_mib(total)}, more than the {_mib(device_total or 0)} the device "
                "reports as its total, without an out-of-memory: stopped"
            )
        if isinstance(last, OutOfMemory) and stopped_by == "oom":
            details["oom"] = self._oom_record(last, step.device)
            details["oom"]["requested"] = gran
        elif isinstance(last, PressureRefused) and stopped_by == "pressure":
            details["pressure"] = self._pressure_record(last)
        return "ok", details

    def _touch(self, step: TouchStep) -> tuple[str, dict[str, Any]]:
        chosen = self._select(step.label)
        # By identity: a CuPy array compares element-wise, so list.index could not find it.
        for piece, h in enumerate(self._held):
            if any(h is c for c in chosen):
                h.pattern = touch_pattern(piece)
                self.backend.touch(h.handle, h.pattern)
        return "ok", {"bytes": sum(h.nbytes for h in chosen), "pieces": len(chosen)}

    def _verify(self, step: VerifyStep) -> tuple[str, dict[str, Any]]:
        chosen = self._select(step.label)
        unwritten = [h for h in chosen if h.pattern is None]
        if unwritten or not chosen:
            what = f"label {step.label!r}" if step.label is not None else "the held memory"
            raise StepError(
                f"verify reads back what a touch wrote, but {len(unwritten)} of the {len(chosen)} piece(s) "
                f"of {what} were never touched"
            )
        bad: list[dict[str, Any]] = []
        for h in chosen:
            assert h.pattern is not None
            mismatched = self.backend.verify(h.handle, h.pattern)
            if mismatched:
                bad.append(
                    {"label": h.label, "device": h.device, "bytes": h.nbytes, "mismatched": mismatched}
                )
        details = {
            "bytes": sum(h.nbytes for h in chosen),
            "pieces": len(chosen),
            "mismatched": sum(b["mismatched"] for b in bad),
            "bad": bad,
        }
        return ("corrupted" if bad else "ok"), details

    def _free(self, step: FreeStep) -> tuple[str, dict[str, Any]]:
        chosen = self._select(step.label)
        freed = 0
        for h in chosen:
            self.backend.free(h.handle)
            self._held.remove(h)  # drop our reference: with CuPy, that is what releases the memory
            freed += h.nbytes
        return "ok", {"bytes": freed, "held": self.held_bytes()}

    def _sleep(self, seconds: float) -> None:
        # Wakes early for a latched signal; the caller re-checks its own conditions.
        seconds = max(0.0, seconds)
        if self._wake is None:
            time.sleep(seconds)
            return
        ready, _, _ = select.select([self._wake[0]], [], [], seconds)
        if ready:
            with contextlib.suppress(OSError):
                os.read(self._wake[0], 4096)  # drain: the latched set, not the bytes, says what came

    def _open_wake(self) -> None:
        read_end, write_end = os.pipe()
        os.set_blocking(read_end, False)
        os.set_blocking(write_end, False)
        self._wake = (read_end, write_end)

    def _close_wake(self) -> None:
        wake, self._wake = self._wake, None
        for fd in wake or ():
            with contextlib.suppress(OSError):
                os.close(fd)

    def _until_reached(self, until: Until, started: float, beats: int) -> str | None:
        if until.signal and until.signal in self._signals:
            self._signals.discard(until.signal)
            return "signal"
        if until.file and os.path.exists(until.file):
            return "file"
        if until.count and beats >= until.count:
            return "count"
        if until.seconds is not None and time.monotonic() - started >= until.seconds:
            return "seconds"
        return None

    def _next_wait(self, until: Until, started: float, cap: float) -> float:
        wait = cap
        if until.file:
            wait = min(wait, self._poll_s)
        if until.seconds is not None:
            wait = min(wait, max(0.0, started + until.seconds - time.monotonic()))
        return wait

    def _hold(self, step: HoldStep) -> tuple[str, dict[str, Any]]:
        started = time.monotonic()
        self.say(f"holding {_mib(self.held_bytes())} until {self._describe_until(step.until)}")
        while (ended_by := self._until_reached(step.until, started, 0)) is None:
            # A signal latched after the check still wakes the sleep: its byte waits in the pipe.
            self._sleep(self._next_wait(step.until, started, 1.0))
        return "ok", {
            "ended_by": ended_by,
            "held": self.held_bytes(),
            "s": round(time.monotonic() - started, 3),
        }

    @staticmethod
    def _describe_until(until: Until) -> str:
        parts = []
        if until.seconds is not None:
            parts.append(f"{until.seconds:g}s passed")
        if until.file:
            parts.append(f"{until.file} exists")
        if until.signal:
            parts.append(f"{until.signal} arrives")
        if until.count:
            parts.append(f"{until.count} beats")
        return " or ".join(parts)

    def _heartbeat(self, step: HeartbeatStep) -> tuple[str, dict[str, Any]]:
        started = time.monotonic()
        started_at = time.time()
        beats = 0
        last = started
        max_gap = 0.0
        used_min: dict[int, int] = {}
        while True:
            mem = self.backend.meminfo()  # proves the device still answers; a fault or eviction ends here
            now = time.monotonic()
            beats += 1
            max_gap = max(max_gap, now - last) if beats > 1 else 0.0
            last = now
            for m in mem:
                used_min[m.ordinal] = min(used_min.get(m.ordinal, m.used_bytes), m.used_bytes)
            used = ", ".join(f"{m.ordinal}:{_mib(m.used_bytes)}" for m in mem)
            held = _mib(self.held_bytes())
            self.say(f"heartbeat {beats} at {now - started:.2f}s, held {held}, device used [{used}]")
            next_beat = started + beats * step.interval_s
            while (ended_by := self._until_reached(step.until, started, beats)) is None:
                left = next_beat - time.monotonic()
                if left <= 0:
                    break
                self._sleep(self._next_wait(step.until, started, left))
            if ended_by is not None:
                break
        return "ok", {
            "beats": beats,
            "ended_by": ended_by,
            "max_gap_s": round(max_gap, 3),
            "s": round(time.monotonic() - started, 3),
            # Wall-clock epoch of the first and the last beat: what happened beside this workload
            # in between (a neighbour's out-of-memory, a fault) happened while it was alive.
            "first_at": round(started_at, 3),
            "last_at": round(started_at + (last - started), 3),
            # The least the device counted as this client's, per device, over every beat: memory a
            # neighbour took from it would show here.
            "used_min": [used_min[i] for i in sorted(used_min)],
        }

    def _ready(self, step: ReadyStep) -> tuple[str, dict[str, Any]]:
        path = step.path or self._environ.get(READY_PATH_ENV) or DEFAULT_READY_PATH
        try:
            with open(path, "w") as f:
                f.write(f"{os.getpid()}\n")
        except OSError as exc:
            raise StepError(f"cannot write the ready file {path}: {exc}") from None
        self.say(f"ready ({path})")
        return "ok", {"path": path, "at": round(time.time(), 3)}

    def _env(self, step: EnvStep) -> tuple[str, dict[str, Any]]:
        values = {name: self._environ.get(name) for name in step.names}
        return "ok", {"env": values}

    def _meminfo(self, step: MemInfoStep) -> tuple[str, dict[str, Any]]:
        mem = self.backend.meminfo()
        devices = [
            {"i": m.ordinal, "total": m.total_bytes, "used": m.used_bytes, "free": m.free_bytes} for m in mem
        ]
        for d in devices:
            self.say(
                f"device {d['i']}: total {_mib(d['total'])}, used {_mib(d['used'])}, free {_mib(d['free'])}"
            )
        return "ok", {"devices": devices, "held": self.held_bytes()}

    def _cuda_devices(self, step: CudaDevicesStep) -> tuple[str, dict[str, Any]]:
        listed = self.backend.devices()
        for d in listed:
            self.say(f"CUDA device {d.ordinal}: {d.name} {d.uuid} {_mib(d.total_bytes)}")
        devices = [{"i": d.ordinal, "uuid": d.uuid, "name": d.name, "total": d.total_bytes} for d in listed]
        return "ok", {"count": len(devices), "devices": devices}

    def _smi(self, step: SmiStep) -> tuple[str, dict[str, Any]]:
        path = shutil.which(SMI_COMMAND[0], path=self._environ.get("PATH"))
        if path is None:
            raise StepError("nvidia-smi is not on PATH")
        try:
            proc = subprocess.run(
                [path, *SMI_COMMAND[1:]],
                capture_output=True,
                text=True,
                timeout=step.timeout_s,
                env=dict(self._environ),
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise StepError(f"nvidia-smi failed to run: {exc}") from None
        if proc.returncode != 0:
            raise StepError(
                f"nvidia-smi exited {proc.returncode}: {(proc.stderr or proc.stdout).strip()[:300]}"
            )
        gpus = []
        for line in proc.stdout.splitlines():
            if not line.strip():
                continue
            cells = [c.strip() for c in line.split(",")]
            try:
                index, uuid, total, used = cells
                gpus.append(
                    {"index": int(index), "uuid": uuid, "total_mib": int(total), "used_mib": int(used)}
                )
            except ValueError:
                raise StepError(f"unexpected nvidia-smi line: {line[:200]!r}") from None
        for g in gpus:
            self.say(f"nvidia-smi: GPU {g['index']} {g['uuid']} {g['used_mib']} MiB / {g['total_mib']} MiB")
        return "ok", {"gpus": gpus, "command": " ".join(SMI_COMMAND)}

    def _run_kernels(
        self, device: int, seconds: float, kernel_s: float, matrix: int, streams: int = 1
    ) -> tuple[list[Any], float]:
        spans = []
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            spans.append(self.backend.kernel(device, kernel_s, matrix, streams))
        return spans, time.monotonic() - started

    def _compute(self, step: ComputeStep) -> tuple[str, dict[str, Any]]:
        matrix = step.matrix
        if matrix == CALIBRATED:
            if self._calibrated is None:
                raise StepError('compute: matrix "calibrated" needs an earlier calibrate step')
            matrix = self._calibrated
        spans, wall = self._run_kernels(step.device, step.seconds, step.kernel_s, matrix)
        work = sum(s.work for s in spans)
        t0 = spans[0].start if spans else time.time()
        t_end = spans[-1].end if spans else t0
        busy = sum(s.end - s.start for s in spans)
        shared = [s.shared_s for s in spans if s.shared_s is not None]
        # Every span goes to the log (the details); the result keeps counters and a digest, so a
        # judgement never depends on what the 4 KiB termination message had room for.
        rel = [[round((s.start - t0) * 1000, 2), round((s.end - t0) * 1000, 2)] for s in spans]
        text = json.dumps(rel, separators=(",", ":"))
        digest = hashlib.sha256(text.encode()).hexdigest()[:16]
        self.say(f"compute: {len(spans)} kernels in {wall:.2f}s, busy {busy:.2f}s, matrix {matrix}")
        self.say(f"compute spans (ms after t0={t0:.6f}; sha256 {digest}): {text}")
        details: dict[str, Any] = {
            "device": step.device,
            "matrix": matrix,
            "kernels": len(spans),
            "wall_s": round(wall, 4),
            "busy_s": round(busy, 4),
            "kernels_per_s": round(len(spans) / wall, 3) if wall > 0 else 0.0,
            "work_unit": self.backend.work_unit,
            "work": round(work, 6),
            "work_per_s": round(work / wall, 6) if wall > 0 else 0.0,
            # Wall-clock epoch of the first kernel's start and the last one's end: neighbours'
            # windows compare on the same clock.
            "t0": round(t0, 6),
            "t_end": round(t_end, 6),
            "spans_digest": digest,
        }
        if shared:
            details["shared_s"] = round(sum(shared), 4)
        return "ok", details

    def _calibrate(self, step: CalibrateStep) -> tuple[str, dict[str, Any]]:
        table = []
        picked = None
        for matrix in step.sizes:
            row: dict[str, Any] = {"matrix": matrix}
            for streams in (1, 2):
                spans, _wall = self._run_kernels(step.device, step.seconds, step.kernel_s, matrix, streams)
                # Work per second of the device's own kernel time, not of the wall clock: the gaps
                # between launches (this process waiting for a CPU) would otherwise count as idle
                # device time that a second stream fills, and a kernel that fills the GPU read as one
                # that does not (seen under load: two streams of the 4096 matrix "1.6x" one).
                busy = sum(s.end - s.start for s in spans)
                rate = sum(s.work for s in spans) / busy if busy > 0 else 0.0
                row[f"work_per_s_{streams}"] = round(rate, 6)
            one = row["work_per_s_1"]
            row["speedup"] = round(row["work_per_s_2"] / one, 3) if one else 0.0
            table.append(row)
            self.say(f"calibrate: matrix {matrix}: two streams do {row['speedup']}x the work of one")
            if row["speedup"] >= CALIBRATION_SPEEDUP:
                picked = matrix
                break
        if picked is None:
            picked = step.sizes[-1]
        self._calibrated = picked
        self.say(f"calibrate: picked matrix {picked}")
        return "ok", {"device": step.device, "matrix": picked, "table": table}

    def _fault(self, step: FaultStep) -> tuple[str, dict[str, Any]]:
        message = self.backend.fault(step.device)
        self.say(f"device fault injected on device {step.device}: {message}")
        return "fault-injected", {"device": step.device, "message": message}


# ---- command line


def _epilog() -> str:
    lines = ["exit codes:"]
    for code in ExitCode:
        lines.append(f"  {int(code):>3}  {code.status}")
    lines.append("")
    lines.append("see workloads/README.md for the plan format and the result JSON")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m workloads.allocate",
        description="gpuconf allocation workload: run a plan of GPU memory/compute steps and report.",
        epilog=_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--plan", help=f"plan JSON, or @FILE; default: env {PLAN_ENV}")
    p.add_argument("--backend", choices=BACKEND_NAMES, default="auto")
    p.add_argument(
        "--termination-path", help="where to write the result (default: env or /dev/termination-log)"
    )
    p.add_argument("--full-result", help="also write the untruncated result JSON to this file")
    return p


def _load_plan(arg: str | None, environ: Mapping[str, str]) -> Plan:
    text = arg if arg is not None else environ.get(PLAN_ENV)
    if not text:
        raise PlanError(f"no plan: pass --plan JSON|@FILE or set {PLAN_ENV}")
    if text.startswith("@"):
        try:
            with open(text[1:], encoding="utf-8") as f:
                text = f.read()
        except OSError as exc:
            raise PlanError(f"cannot read plan file {text[1:]}: {exc}") from None
    return parse_plan(text)


@contextlib.contextmanager
def _termination_deferred() -> Iterator[None]:
    """Ignore terminating signals while the result is written: the process is about to end anyway,
    and a SIGTERM landing here must not cost the termination message."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {name: signal.signal(getattr(signal, name), signal.SIG_IGN) for name in TERMINATING_SIGNALS}
    try:
        yield
    finally:
        for name, handler in previous.items():
            signal.signal(getattr(signal, name), handler)


def _finish(
    code: ExitCode, result: dict[str, Any], args: argparse.Namespace, environ: Mapping[str, str], out: TextIO
) -> int:
    with _termination_deferred():
        return _write_result(code, result, args, environ, out)


def _write_result(
    code: ExitCode, result: dict[str, Any], args: argparse.Namespace, environ: Mapping[str, str], out: TextIO
) -> int:
    if args.full_result:
        try:
            with open(args.full_result, "w", encoding="utf-8") as f:
                json.dump(result, f, indent=1, default=str)
        except OSError as exc:
            print(f"gpuconf-workload: cannot write full result: {exc}", file=sys.stderr)
    text = render_result(result)
    problem = write_termination_message(termination_path(args.termination_path, environ), text)
    if problem:
        print(f"gpuconf-workload: {problem}", file=sys.stderr)
    print(text, file=out, flush=True)
    return int(code)


def main(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None, out: TextIO | None = None
) -> int:
    env = os.environ if environ is None else environ
    stream = sys.stdout if out is None else out
    args = build_parser().parse_args(argv)
    bare: dict[str, Any] = {"gpuconf_workload": RESULT_SCHEMA, "simulated": None, "backend": args.backend}
    try:
        plan = _load_plan(args.plan, env)
    except PlanError as exc:
        print(f"gpuconf-workload: plan error: {exc}", file=sys.stderr)
        error = {"type": "plan-error", "message": str(exc)}
        return _finish(
            ExitCode.PLAN_ERROR, {**bare, **_verdict(ExitCode.PLAN_ERROR), "error": error}, args, env, stream
        )
    bare["plan"] = plan.name
    try:
        backend = select_backend(args.backend, env)
    except BackendUnavailable as exc:
        if args.backend == "auto" and all(isinstance(s, DEVICE_FREE_STEPS) for s in plan.steps):
            # A container without a GPU (a sidecar) still reports what it was given.
            code, result = Runner(plan, NoDevice(str(exc)), stream, environ=env, ending=True).run()
            return _finish(code, result, args, env, stream)
        print(f"gpuconf-workload: {exc}", file=sys.stderr)
        code = ExitCode.BACKEND_UNAVAILABLE
        return _finish(
            code,
            {**bare, **_verdict(code), "error": {"type": exc.error_type, "message": str(exc)}},
            args,
            env,
            stream,
        )
    try:
        code, result = Runner(plan, backend, stream, environ=env, ending=True).run()
    finally:
        backend.close()
    return _finish(code, result, args, env, stream)


def _verdict(code: ExitCode) -> dict[str, Any]:
    return {"status": code.status, "exit_code": int(code)}


if __name__ == "__main__":
    sys.exit(main())

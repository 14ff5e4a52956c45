"""The workload's verdict: exit codes, and a result JSON that always fits a termination message.

A Pod's termination message holds at most 4096 bytes and is the one channel that survives the
container (docs/architecture.md §5: checks judge from it, on any cluster, logs or not). So the
result is shaped to fit: if the full JSON is larger, long lists are cut to their first items
(their length kept beside them as ``<key>_total``), long strings are shortened, then the oldest
steps are reduced to their op and outcome, then dropped, and as a last resort only the verdict
remains. The last steps
keep their detail longest, because a run stops at the step that failed. Every stage re-serialises
and measures, so the output is always one valid JSON object of at most the limit, never a JSON
text cut in the middle. ``truncated`` says whether anything was left out.

Exit codes are part of the workload's contract with the checks; ``ExitCode`` documents each.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from enum import IntEnum
from typing import Any

TERMINATION_MESSAGE_LIMIT = 4096
DEFAULT_TERMINATION_PATH = "/dev/termination-log"
TERMINATION_PATH_ENV = "GPUCONF_TERMINATION_PATH"
RESULT_SCHEMA = 1


class ExitCode(IntEnum):
    """How the workload ended. Any code but 0 and 10 means the plan did not go as written."""

    OK = 0  # every step went as expected and none expected an out-of-memory
    ERROR = 1  # an unexpected error (not an OOM, pressure, fault or eviction): see result.error
    PLAN_ERROR = 2  # the plan (or the command line) is invalid; nothing was run
    BACKEND_UNAVAILABLE = 3  # no GPU backend: no simulated device configured/reachable and no CuPy
    EXPECTED_OOM = 10  # every step went as expected, and at least one expected out-of-memory happened
    UNEXPECTED_OOM = 11  # an allocation failed with out-of-memory where the plan did not expect it
    EXPECTATION_NOT_MET = 12  # a step expected to fail (oom, pressure, a fault) succeeded
    PRESSURE = 13  # an allocation was refused under memory pressure (simulated device) and stayed refused
    DEVICE_FAULT = 14  # a device fault hit this workload (a sticky error such as illegal address)
    FAULT_INJECTED = 15  # the plan's fault step faulted the device as asked; the plan ends there
    CLIENT_GONE = 16  # the device detached or evicted this client while it ran
    CORRUPTED = 17  # memory read back (verify) differs from what this workload wrote there
    TERMINATED = 143  # SIGTERM/SIGINT/SIGHUP that no step waited for (128 + 15, as a shell reports it)

    @property
    def status(self) -> str:
        return self.name.lower().replace("_", "-")


def _shrink(value: Any, max_items: int, max_chars: int) -> Any:
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if isinstance(item, list) and len(item) > max_items:
                out[key] = [_shrink(v, max_items, max_chars) for v in item[:max_items]]
                out.setdefault(f"{key}_total", len(item))
            else:
                out[key] = _shrink(item, max_items, max_chars)
        return out
    if isinstance(value, list):
        return [_shrink(v, max_items, max_chars) for v in value[:max_items]]
    if isinstance(value, str) and len(value) > max_chars:
        return value[: max(0, max_chars - 3)] + "..."
    return value


def _clean(value: Any) -> Any:
    """JSON has no NaN or infinity: a measurement gone wrong becomes null rather than invalid JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_clean(v) for v in value]
    return value


def _dump(value: Any) -> str:
    # ensure_ascii: the limit is in bytes, and an escaped text has as many bytes as characters.
    return json.dumps(value, separators=(",", ":"), ensure_ascii=True, allow_nan=False, default=str)


# (items kept per list, characters kept per string), gentlest first.
_SHRINK_STAGES = ((32, 512), (16, 256), (8, 160), (4, 96), (2, 64), (1, 48), (0, 32))
_VERDICT_KEYS = ("gpuconf_workload", "status", "exit_code", "simulated", "backend", "plan")


def _brief(step: Any) -> Any:
    if isinstance(step, dict):
        return {k: _shrink(step[k], 0, 32) for k in ("i", "op", "outcome") if k in step}
    return _shrink(step, 0, 16)


def render_result(result: dict[str, Any], limit: int = TERMINATION_MESSAGE_LIMIT) -> str:
    """``result`` as compact JSON of at most ``limit`` bytes, shrunk deliberately if need be."""
    result = _clean(result)
    text = _dump({**result, "truncated": False})
    if len(text) <= limit:
        return text
    base = {k: v for k, v in result.items() if k != "steps"}
    base["truncated"] = True
    steps = result.get("steps")
    if not isinstance(steps, list):
        steps = None if "steps" not in result else _shrink(steps, 0, 16)
    # 1. Shorten lists and strings everywhere, keeping every step.
    for max_items, max_chars in _SHRINK_STAGES:
        candidate = _shrink(base, max_items, max_chars)
        if isinstance(steps, list):
            candidate["steps"] = [_shrink(s, max_items, max_chars) for s in steps]
        text = _dump(candidate)
        if len(text) <= limit:
            return text
    head = _shrink(base, 2, 48)
    if isinstance(steps, list) and steps:
        # 2. Reduce the oldest steps to op and outcome; the last ones (where a failure is) stay detailed.
        detailed = [_shrink(s, 2, 48) for s in steps]
        briefs = [_brief(s) for s in steps]
        for keep in range(min(len(steps), 16), -1, -1):
            text = _dump({**head, "steps": briefs[: len(steps) - keep] + detailed[len(steps) - keep :]})
            if len(text) <= limit:
                return text
        # 3. Drop the oldest steps altogether, the last one still in detail if it fits.
        for keep in (64, 16, 4, 1):
            if keep < len(steps):
                for last in (detailed[-1], briefs[-1]):
                    kept = [*briefs[len(steps) - keep : -1], last]
                    text = _dump({**head, "steps_omitted": len(steps) - keep, "steps": kept})
                    if len(text) <= limit:
                        return text
    # 4. The verdict alone, with as much of the error as fits.
    minimal = {k: _shrink(base[k], 0, 64) for k in _VERDICT_KEYS if k in base}
    minimal["truncated"] = True
    error = base.get("error")
    if isinstance(error, dict):
        minimal["error"] = _shrink(error, 0, 200)
        text = _dump(minimal)
        if len(text) <= limit:
            return text
        minimal.pop("error")
    text = _dump(minimal)
    if len(text) <= limit:
        return text
    status = str(base.get("status"))[:32]
    return _dump({"status": status, "exit_code": base.get("exit_code"), "truncated": True})


def termination_path(flag: str | None, environ: Mapping[str, str]) -> str:
    return flag or environ.get(TERMINATION_PATH_ENV) or DEFAULT_TERMINATION_PATH


def write_termination_message(path: str, text: str) -> str | None:
    """Write the message; return why not if it could not be written (never raises).

    The default path exists only inside a Kubernetes container (the kubelet mounts it); elsewhere it
    is skipped rather than created, so a local run never litters /dev.
    """
    if path == DEFAULT_TERMINATION_PATH and not os.path.exists(path):
        return f"{path} does not exist (not running under a kubelet); termination message not written"
    try:
        with open(path, "w", encoding="ascii") as f:
            f.write(text)
    except OSError as exc:
        return f"cannot write termination message to {path}: {exc}"
    return None

"""Which process, on which machine: the identity a hook announced on a Node is checked against.

A test hook a node component announces on its Node (the agent's restart hook,
``enforcement.agent.restart``; the simulated device's outage hook, ``enforcement.sim.outage``)
names a process by pid. A pid alone means nothing on another machine, after a reboot, or once the
process has ended and the pid was reused, so the announcement carries the host name, the kernel's
boot id and the process's start time too, and whoever signals it first makes sure all four match
(``LocalProcess.signalable``). Written once here, for every hook.
"""

from __future__ import annotations

import json
import os
import signal
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

BOOT_ID_FILE: Final = "/proc/sys/kernel/random/boot_id"
STOPPED_STATES: Final = frozenset("Tt")
"""``/proc/<pid>/stat`` field 3 of a process stopped by a signal (T) or a tracer (t)."""


@dataclass(frozen=True)
class LocalProcess:
    """One process on one boot of one machine."""

    pid: int
    start_ticks: int
    """Field 22 of ``/proc/<pid>/stat``: with the pid, identifies the process (pids are reused)."""
    host: str
    boot_id: str

    @classmethod
    def current(cls) -> LocalProcess:
        pid = os.getpid()
        return cls(pid, process_start_ticks(pid) or 0, socket.gethostname(), boot_id())

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> LocalProcess:
        """The identity fields of an announcement; raises ``ValueError`` if one is missing or malformed."""
        try:
            return cls(
                pid=int(data["pid"]),
                start_ticks=int(data["start_ticks"]),
                host=str(data["host"]),
                boot_id=str(data["boot_id"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"missing or malformed field: {exc}") from None

    def on_this_machine(self) -> bool:
        return self.boot_id == boot_id() and self.host == socket.gethostname()

    def alive(self) -> bool:
        """The announced process still runs (same pid, same start): safe to signal."""
        return process_start_ticks(self.pid) == self.start_ticks

    def stopped(self) -> bool:
        """The announced process runs and is stopped (SIGSTOP): it answers nothing until SIGCONT."""
        return self.alive() and process_state(self.pid) in STOPPED_STATES

    def signalable(self) -> str | None:
        """Why this process must not be signalled from here, or None when it may: it is on this
        machine (host and boot) and still the process announced (pid and start time)."""
        if not self.on_this_machine():
            return f"it runs on host {self.host!r} (boot {self.boot_id[:8]}), not on this machine"
        if not self.alive():
            return (
                f"pid {self.pid} no longer runs here as announced (the process ended, or the pid was reused)"
            )
        return None


def announcement(text: str) -> tuple[Mapping[str, Any], LocalProcess]:
    """A hook document's JSON object and the process it names; raises ``ValueError`` for anything
    that is not one (the hook's own fields are its reader's to check)."""
    data: Any = json.loads(text)
    if not isinstance(data, Mapping):
        raise ValueError("not a JSON object")
    return data, LocalProcess.from_mapping(data)


def known_signals(*names: str) -> None:
    """Raises ``ValueError`` naming the first of ``names`` that is no signal's name."""
    for name in names:
        if name not in signal.Signals.__members__:
            raise ValueError(f"unknown signal {name!r}")


def boot_id() -> str:
    try:
        with open(BOOT_ID_FILE) as f:
            return f.read().strip()
    except OSError:
        return ""


def _stat_fields(pid: int) -> list[str] | None:
    """``/proc/<pid>/stat`` from field 3 on; None if no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after its end.
    return stat[stat.rfind(")") + 2 :].split()


def process_start_ticks(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks since boot; None if no such process."""
    fields = _stat_fields(pid)
    try:
        return int(fields[19]) if fields is not None else None  # field 22 overall
    except (IndexError, ValueError):
        return None


def process_state(pid: int) -> str | None:
    """``pid``'s state letter (R, S, T, Z, ...); None if no such process."""
    fields = _stat_fields(pid)
    return fields[0] if fields else None

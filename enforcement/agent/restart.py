"""How a node agent that runs as a local process, not as a Pod, can be restarted from outside.

On a real cluster the agent is a DaemonSet Pod: restarting it means deleting the Pod and letting
the DaemonSet bring a new one (``fixtures.suite.agentcontrol`` does exactly that). An agent that runs
as a plain process on the node (a systemd unit, or the embedded sandbox's node component) has no
Pod to delete, so with ``--announce-restart-hook`` it says on its own Node how to restart it:

- the Node annotation ``gpuconf.io/agent-restart`` holds a small JSON document (``RestartHook``):
  the signal to send (``SIGHUP``), the process (pid, and its kernel start time so that a reused
  pid is never signalled), the machine (hostname and boot id: a pid means nothing on another
  machine or after a reboot) and the *incarnation*, a token new with every start;
- on that signal the agent stops exactly as on SIGTERM (hook socket closed, loops stopped,
  containers and their fences left running) and re-executes itself with the same command line:
  a fresh interpreter with no memory of its containers, which must adopt them again from the
  backend like any restarted agent. This is the daemon convention (sshd re-executes itself on
  SIGHUP), and it keeps the pid, so whatever supervises the process sees nothing change;
- once the new incarnation serves its hook, it writes the annotation again: a new incarnation
  on the Node is the signal that the restart is complete.

The annotation is written through ``nodes/status`` (the only Node write the agent's role has; a
status update may carry metadata, as the kubelet's own do), so no further rights are needed. The
signal itself is the permission check: only the agent's user (or root) on that machine can send it.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any, Final

ANNOTATION: Final = "gpuconf.io/agent-restart"
SIGNAL: Final = "SIGHUP"
BOOT_ID_FILE: Final = "/proc/sys/kernel/random/boot_id"


@dataclass(frozen=True)
class RestartHook:
    """What the annotation says: how to restart this agent, and which start of it is running."""

    signal: str
    pid: int
    start_ticks: int
    """Field 22 of ``/proc/<pid>/stat``: with the pid, identifies the process (pids are reused)."""
    host: str
    boot_id: str
    incarnation: str
    """New on every start (a re-execution included): a changed value means a restart happened."""
    started_at: str

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RestartHook:
        """Raises ``ValueError`` for anything that is not a complete hook document."""
        data: Any = json.loads(text)
        if not isinstance(data, Mapping):
            raise ValueError("not a JSON object")
        try:
            hook = cls(
                signal=str(data["signal"]),
                pid=int(data["pid"]),
                start_ticks=int(data["start_ticks"]),
                host=str(data["host"]),
                boot_id=str(data["boot_id"]),
                incarnation=str(data["incarnation"]),
                started_at=str(data["started_at"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"missing or malformed field: {exc}") from None
        if hook.signal not in signal.Signals.__members__:
            raise ValueError(f"unknown signal {hook.signal!r}")
        return hook

    @classmethod
    def of_node(cls, node: Mapping[str, Any] | None) -> RestartHook | None:
        """The hook a Node announces; None when it announces none. Raises ``ValueError`` if malformed."""
        annotations = ((node or {}).get("metadata") or {}).get("annotations") or {}
        text = annotations.get(ANNOTATION)
        return None if not text else cls.from_json(text)

    def on_this_machine(self) -> bool:
        return self.boot_id == boot_id() and self.host == socket.gethostname()

    def process_alive(self) -> bool:
        """The announced process still runs (same pid, same start): safe to signal."""
        return process_start_ticks(self.pid) == self.start_ticks


def boot_id() -> str:
    try:
        with open(BOOT_ID_FILE) as f:
            return f.read().strip()
    except OSError:
        return ""


def process_start_ticks(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks since boot; None if no such process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces: split after its end.
    fields = stat[stat.rfind(")") + 2 :].split()
    try:
        return int(fields[19])  # field 22 overall
    except (IndexError, ValueError):
        return None


def this_process() -> RestartHook:
    """The hook for the calling process, with a new incarnation."""
    pid = os.getpid()
    return RestartHook(
        signal=SIGNAL,
        pid=pid,
        start_ticks=process_start_ticks(pid) or 0,
        host=socket.gethostname(),
        boot_id=boot_id(),
        incarnation=secrets.token_hex(6),
        started_at=datetime.now(UTC).isoformat(timespec="milliseconds"),
    )

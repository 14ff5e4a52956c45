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
import secrets
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any, Final

from enforcement.localprocess import LocalProcess, announcement, boot_id, known_signals, process_start_ticks

ANNOTATION: Final = "gpuconf.io/agent-restart"
SIGNAL: Final = "SIGHUP"

__all__ = ["ANNOTATION", "SIGNAL", "RestartHook", "boot_id", "process_start_ticks", "this_process"]


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
        data, process = announcement(text)
        try:
            hook = cls(
                signal=str(data["signal"]),
                pid=process.pid,
                start_ticks=process.start_ticks,
                host=process.host,
                boot_id=process.boot_id,
                incarnation=str(data["incarnation"]),
                started_at=str(data["started_at"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"missing or malformed field: {exc}") from None
        known_signals(hook.signal)
        return hook

    @classmethod
    def of_node(cls, node: Mapping[str, Any] | None) -> RestartHook | None:
        """The hook a Node announces; None when it announces none. Raises ``ValueError`` if malformed."""
        annotations = ((node or {}).get("metadata") or {}).get("annotations") or {}
        text = annotations.get(ANNOTATION)
        return None if not text else cls.from_json(text)

    @property
    def process(self) -> LocalProcess:
        """The announced process's identity (``enforcement.localprocess``), checked before a signal."""
        return LocalProcess(self.pid, self.start_ticks, self.host, self.boot_id)

    def on_this_machine(self) -> bool:
        return self.process.on_this_machine()

    def process_alive(self) -> bool:
        """The announced process still runs (same pid, same start): safe to signal."""
        return self.process.alive()


def this_process() -> RestartHook:
    """The hook for the calling process, with a new incarnation."""
    me = LocalProcess.current()
    return RestartHook(
        signal=SIGNAL,
        pid=me.pid,
        start_ticks=me.start_ticks,
        host=me.host,
        boot_id=me.boot_id,
        incarnation=secrets.token_hex(6),
        started_at=datetime.now(UTC).isoformat(timespec="milliseconds"),
    )

"""The simulated GPU's outage hook: how a test may take a node's simulated device away, and give it back.

A node agent that cannot fence (its backend gone) must say so on its Node and must not start
containers unfenced (the suite's ``agent-readiness`` check). A real GPU's driver cannot be taken
away by a test, but the sandbox's simulated device can: its server process is frozen with
``SIGSTOP`` (it accepts no request and answers none, as a hung driver) and resumed with
``SIGCONT`` (everything it held is still there, as after a driver that recovered).

- The device server writes the hook (``SimulatedOutageHook``: the two signals and the process's
  identity, ``enforcement.localprocess``) to ``outage-hook.json`` in its socket directory at start.
- The node's simulated kubelet, which has a Kubernetes identity (the device server has none),
  announces it on its Node as the annotation ``gpuconf.io/simulated-backend-outage``, and again
  whenever the file changes (a restarted device server).
- The suite (``fixtures.suite.simoutage``) sends the signals only after checking that identity, as
  for the agent's restart hook; a Node without the annotation has no outage the suite can cause.

Every name here says *simulated*: a real node never announces this hook.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

from enforcement.localprocess import LocalProcess, announcement, known_signals

ANNOTATION: Final = "gpuconf.io/simulated-backend-outage"
HOOK_FILE_NAME: Final = "outage-hook.json"
STOP: Final = "SIGSTOP"
RESUME: Final = "SIGCONT"


@dataclass(frozen=True)
class SimulatedOutageHook:
    """What the annotation says: which signals freeze and resume the simulated device, and its process."""

    stop: str
    resume: str
    pid: int
    start_ticks: int
    host: str
    boot_id: str
    started_at: str

    @property
    def process(self) -> LocalProcess:
        return LocalProcess(self.pid, self.start_ticks, self.host, self.boot_id)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> SimulatedOutageHook:
        """Raises ``ValueError`` for anything that is not a complete hook document."""
        data, process = announcement(text)
        try:
            hook = cls(
                stop=str(data["stop"]),
                resume=str(data["resume"]),
                pid=process.pid,
                start_ticks=process.start_ticks,
                host=process.host,
                boot_id=process.boot_id,
                started_at=str(data["started_at"]),
            )
        except KeyError as exc:
            raise ValueError(f"missing field: {exc}") from None
        known_signals(hook.stop, hook.resume)
        return hook

    @classmethod
    def of_node(cls, node: Mapping[str, Any] | None) -> SimulatedOutageHook | None:
        """The hook a Node announces; None when it announces none. Raises ``ValueError`` if malformed."""
        annotations = ((node or {}).get("metadata") or {}).get("annotations") or {}
        text = annotations.get(ANNOTATION)
        return None if not text else cls.from_json(text)


def this_process() -> SimulatedOutageHook:
    me = LocalProcess.current()
    return SimulatedOutageHook(
        stop=STOP,
        resume=RESUME,
        pid=me.pid,
        start_ticks=me.start_ticks,
        host=me.host,
        boot_id=me.boot_id,
        started_at=datetime.now(UTC).isoformat(timespec="milliseconds"),
    )


def write_hook_file(socket_dir: str | Path) -> Path:
    """The device server's part: its hook, beside its sockets (replaced atomically)."""
    path = Path(socket_dir) / HOOK_FILE_NAME
    tmp = path.with_suffix(".tmp")
    tmp.write_text(this_process().to_json() + "\n")
    os.replace(tmp, path)
    return path


def read_hook_file(socket_dir: str | Path) -> str | None:
    """The hook document the node's device server wrote (None: none, or unreadable)."""
    try:
        text = (Path(socket_dir) / HOOK_FILE_NAME).read_text().strip()
        SimulatedOutageHook.from_json(text)
    except (OSError, ValueError):
        return None
    return text

"""The Pods bound to the agent's node, reduced to the two things the agent acts on.

The agent needs the Pods for one thing the runtime cannot be relied on to tell it: that a Pod is
*gone* (deleted while the agent was down, a StopContainer that never arrived), so its GPU memory
and guarantee are released. It keeps no copy of the Pods: the hook hands it the Pod it decides
on, and the backend's attach labels identify the rest, which is what keeps the agent small on a
node with a thousand Pods.

The list/watch itself is ``enforcement.reflector`` (list, watch from its version with bookmarks,
resume, relist on 410 Gone, backoff), with ``fieldSelector=spec.nodeName=<node>`` and a full
relist every ``resync_s``. What is agent-specific is what each event becomes: each list goes to
``on_list(uids, started_at)`` (the consumer releases what belongs to Pods not in it, taken on
before ``started_at``); each deletion to ``on_deleted(uid)``; additions and changes are dropped.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from enforcement.reflector import Event, Listed, Reflector, pods_on_node


class PodWatcher(Reflector):
    """A reflector of the node's Pods that hands over UIDs: every list's, and each deleted one."""

    def __init__(
        self,
        core_v1: Any,
        node: str,
        on_list: Callable[[set[str], float], None],
        on_deleted: Callable[[str], None],
        stop: threading.Event,
        log: Callable[[str], None],
        resync_s: float = 300.0,
    ) -> None:
        super().__init__("pods", pods_on_node(core_v1, node), self._hand_over, stop, log, resync_s=resync_s)
        self._on_list = on_list
        self._on_deleted = on_deleted

    def _hand_over(self, event: Event) -> None:
        if isinstance(event, Listed):
            uids = {str(p["metadata"]["uid"]) for p in event.items if (p.get("metadata") or {}).get("uid")}
            self._on_list(uids, event.started)
        elif event.type == "DELETED":
            uid = (event.obj.get("metadata") or {}).get("uid")
            if uid:
                self._on_deleted(str(uid))

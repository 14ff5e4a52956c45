"""Bound Pods as the runtime hands them to the agent's CreateContainer, for the agent's unit tests.

The builder is ``fixtures.suite.manifests.pod`` (the one Pod builder of the suite, the probe and these
tests); this only sets what every agent test shares: namespace ``ns``, node ``node-a``, a fresh
UID, containers by name. ``placement`` is ``fixtures.suite.manifests.placement_annotations``: the four
annotations (and the portion) a correct scheduler writes. Modules in this folder import these
directly (pytest puts the folder on ``sys.path``).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from fixtures.suite import manifests
from fixtures.suite.manifests import placement_annotations as placement

__all__ = ["make_pod", "placement"]


def make_pod(
    name: str,
    annotations: Mapping[str, Any] | None = None,
    *,
    namespace: str = "ns",
    containers: Sequence[str] = ("main",),
    node: str = "node-a",
    uid: str | None = None,
    env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    return manifests.pod(
        name,
        [manifests.container(c, image="gpuconf-workload:test", env=env) for c in containers],
        namespace=namespace,
        annotations=annotations,
        node_name=node,
        uid=uid or str(uuid.uuid4()),
    )

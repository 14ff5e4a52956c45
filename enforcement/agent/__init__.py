"""The reference node agent: makes every container on its node obey its GPU-fraction annotations.

It stands where NVIDIA's GPU Fractioning Operator stands on a real node (docs/contract.md §1, §5): the
runtime asks it before each container starts (``enforcement.hook``: CreateContainer, StopContainer,
Synchronize), it reads the scheduler's annotations through ``enforcement.contract`` (the one
parser), fences the container in a backend (``enforcement.backends``: the simulated device, or
MPS on real GPUs), and answers with the environment the container must run with. Around that:

- an **evictor** keeps each GPU's guarantees: under pressure it evicts borrowers (usage above
  request), largest overage first, through the Kubernetes Eviction API, never a container within
  its guarantee (``evictor``);
- a **mode guard** refuses a container whose compute mode conflicts with what its GPU already
  runs: that is a scheduler's contract violation the node must report, not hide (``handler``);
- the **node condition** ``gpu-fractioning.nvidia.com/Ready`` follows the backend's health, and
  **metrics** per fraction are served as Prometheus text (``condition``, ``metrics``);
- **restart recovery**: a restarted agent re-adopts what the backend still holds (the attach
  labels name namespace, Pod, UID and container) and resumes eviction within seconds (``handler``).

Modules, one concept each: ``options`` (settings and seeded faults), ``environment`` (the env a
fenced container gets), ``registry`` (the containers the agent fences), ``handler`` (the hook
handler: admission, mode guard, stop, synchronize, adoption), ``evictor``, ``kube`` (the few
Kubernetes calls, behind a Protocol), ``watching`` (the node's Pods), ``condition``, ``metrics``,
``rbac`` (the agent's ClusterRole as data), ``agent`` (the process: wiring and CLI).
"""

from __future__ import annotations

from enforcement.agent.options import FAULTS, AgentOptions

__all__ = ["FAULTS", "AgentOptions"]

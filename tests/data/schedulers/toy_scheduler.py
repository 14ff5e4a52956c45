"""A small GPU-fraction scheduler that is not the reference one: a test double for gpuconf's own tests.

It stands for a vendor's scheduler in the sandbox: another process, started by
``gpuconf sandbox up --scheduler-command``, that knows the cluster only through the Kubernetes API
(a kubeconfig). It shares no code with ``fixtures.sandbox.scheduler``: it polls (no watch), lists the
whole cluster each round, and packs first-fit. The contract module parses requests and renders
the four annotations, as any scheduler may use a library for that.

What it does, per round, for each unbound Pod with its ``schedulerName``, oldest first:

- the nodes it may use: Ready, not cordoned, every NoSchedule/NoExecute taint tolerated, the
  Pod's ``nodeSelector`` and required node affinity matched;
- a Pod that asks for no fraction goes to the first such node;
- a fractional Pod goes to the first node that has ``num_devices`` GPUs, each with the request
  free and no Pod of the other compute mode, on a node whose agent condition
  ``gpu-fractioning.nvidia.com/Ready`` is True; the annotations are patched on first, then the
  Pod is bound;
- a Pod that fits nowhere gets ``PodScheduled=False`` (reason ``Unschedulable``) saying why.

``--greedy`` is its one flaw, for the suite to catch: it ignores the memory already placed on a
GPU (every GPU looks empty), so it overcommits.

``--kai-like`` makes it behave as KAI Scheduler's binder does where the suite can tell (docs/contract.md
§9.3): it places only Pods that carry a queue label (``kai.scheduler/queue``), writes GPU UUIDs,
never the mode, quantities in canonical form (``4Gi``), with no reserve.

    python tests/data/schedulers/toy_scheduler.py --kubeconfig K --name gpuconf-toy [--greedy]
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from kubernetes import client
from kubernetes import config as kconfig
from kubernetes.client.rest import ApiException

from enforcement.contract import (
    Fraction,
    gpu_loads,
    node_gpu_count,
    node_gpu_memory_mib,
    node_gpu_uuids,
    read_request,
    render_placement,
    to_absolute,
)

AGENT_READY = "gpu-fractioning.nvidia.com/Ready"
QUEUE_LABEL = "kai.scheduler/queue"


def canonical(mib: int) -> str:
    value, unit = mib, "Mi"
    for bigger in ("Gi", "Ti"):
        if value % 1024:
            break
        value, unit = value // 1024, bigger
    return f"{value}{unit}"


def kai_placement(placement: Mapping[str, str]) -> dict[str, str]:
    """As KAI's binder writes it: no mode, canonical quantities."""
    out = {}
    for key, value in placement.items():
        if key.endswith(".gpu-compute.mode"):
            continue
        if key.endswith((".gpu-memory.request", ".gpu-memory.limit")) and value.endswith("Mi"):
            value = canonical(int(value[:-2]))
        out[key] = value
    return out


def _json(resp: Any) -> Any:
    return json.loads(resp.data)


def _conditions(node: Mapping[str, Any]) -> dict[str, str]:
    return {c.get("type"): c.get("status") for c in (node.get("status") or {}).get("conditions") or []}


def _matches(expression: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, op, values = expression.get("key"), expression.get("operator"), expression.get("values") or []
    if op == "In":
        return key in labels and labels[key] in values
    if op == "NotIn":
        return key not in labels or labels[key] not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    return False  # Gt, Lt: not needed by anything this double schedules


def _tolerated(taint: Mapping[str, Any], tolerations: list[Mapping[str, Any]]) -> bool:
    for tol in tolerations:
        if tol.get("effect") and tol.get("effect") != taint.get("effect"):
            continue
        if tol.get("operator") == "Exists" and (not tol.get("key") or tol.get("key") == taint.get("key")):
            return True
        if tol.get("key") == taint.get("key") and tol.get("value", "") == taint.get("value", ""):
            return True
    return False


def allowed(pod: Mapping[str, Any], node: Mapping[str, Any]) -> str | None:
    """Why ``pod`` may not go to ``node`` (None: it may)."""
    spec = pod.get("spec") or {}
    labels = (node.get("metadata") or {}).get("labels") or {}
    if _conditions(node).get("Ready") != "True":
        return "not Ready"
    if (node.get("spec") or {}).get("unschedulable"):
        return "cordoned"
    for taint in (node.get("spec") or {}).get("taints") or []:
        if taint.get("effect") in ("NoSchedule", "NoExecute") and not _tolerated(
            taint, spec.get("tolerations") or []
        ):
            return f"taint {taint.get('key')} not tolerated"
    for key, value in (spec.get("nodeSelector") or {}).items():
        if labels.get(key) != value:
            return "nodeSelector does not match"
    required = (
        ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
        or {}
    ).get("nodeSelectorTerms") or []
    if required and not any(
        all(_matches(e, labels) for e in term.get("matchExpressions") or []) for term in required
    ):
        return "node affinity does not match"
    return None


class Toy:
    def __init__(self, core: Any, name: str, greedy: bool, kai_like: bool = False) -> None:
        self.core = core
        self.name = name
        self.greedy = greedy
        self.kai_like = kai_like
        self.reported: dict[str, str] = {}

    def round(self) -> None:
        nodes = sorted(
            _json(self.core.list_node(_preload_content=False))["items"], key=lambda n: n["metadata"]["name"]
        )
        pods = _json(self.core.list_pod_for_all_namespaces(_preload_content=False))["items"]
        used: dict[tuple[str, str], int] = {}
        modes: dict[tuple[str, str], set[str]] = {}
        for (node, gpu), load in gpu_loads(pods, nodes).items():
            used[(node, gpu)] = load.request_mib
            modes[(node, gpu)] = set(load.modes)
        pending = [
            p
            for p in pods
            if (p.get("spec") or {}).get("schedulerName") == self.name
            and not (p.get("spec") or {}).get("nodeName")
            and not (p.get("metadata") or {}).get("deletionTimestamp")
            and (p.get("status") or {}).get("phase") in (None, "Pending")
        ]
        pending.sort(key=lambda p: (p["metadata"].get("creationTimestamp") or "", p["metadata"]["name"]))
        for pod in pending:
            self.place(pod, nodes, used, modes)

    def place(
        self,
        pod: dict[str, Any],
        nodes: list[dict[str, Any]],
        used: dict[tuple[str, str], int],
        modes: dict[tuple[str, str], set[str]],
    ) -> None:
        if self.kai_like and QUEUE_LABEL not in ((pod.get("metadata") or {}).get("labels") or {}):
            self.unschedulable(pod, f"no {QUEUE_LABEL} label: the Pod belongs to no queue")
            return
        request, violations = read_request(pod)
        errors = [v for v in violations if v.is_error]
        if errors:
            self.unschedulable(pod, f"the request breaks the contract: {errors[0].message}")
            return
        why: list[str] = []
        for node in nodes:
            node_name = node["metadata"]["name"]
            refused = allowed(pod, node)
            if refused is None and request is not None:
                refused = self.fraction_refused(node)
            if refused is not None:
                why.append(f"{node_name}: {refused}")
                continue
            if request is None:
                self.bind(pod, node_name, {})
                return
            memory = node_gpu_memory_mib(node) or 0
            count = node_gpu_count(node) or 0
            uuids = node_gpu_uuids(node)
            gpus = list(uuids) if len(uuids) == count else [str(i) for i in range(count)]
            try:
                req, lim = to_absolute(request, memory)
            except ValueError as exc:
                why.append(f"{node_name}: {exc}")
                continue
            fitting = [
                g
                for g in gpus
                if (self.greedy or used.get((node_name, g), 0) + req <= memory)
                and modes.get((node_name, g), set()) <= {request.mode}
            ]
            if len(fitting) < request.num_devices:
                why.append(f"{node_name}: {len(fitting)} GPU(s) with {req} MiB free in {request.mode}")
                continue
            chosen = tuple(fitting[: request.num_devices])
            fraction = Fraction(request.container, req, lim, request.mode, chosen, request.portion)
            placement = render_placement(request.container, fraction)
            if self.kai_like:
                placement = kai_placement(placement)
            if self.bind(pod, node_name, placement):
                for g in chosen:
                    used[(node_name, g)] = used.get((node_name, g), 0) + req
                    modes.setdefault((node_name, g), set()).add(request.mode)
            return
        self.unschedulable(pod, f"0/{len(nodes)} nodes fit: " + "; ".join(why))

    @staticmethod
    def fraction_refused(node: Mapping[str, Any]) -> str | None:
        if not node_gpu_count(node) or not node_gpu_memory_mib(node):
            return "no GPU labels"
        if _conditions(node).get(AGENT_READY) != "True":
            return f"{AGENT_READY} is not True"
        return None

    def bind(self, pod: Mapping[str, Any], node: str, annotations: Mapping[str, str]) -> bool:
        ns, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
        try:
            if annotations:
                self.core.patch_namespaced_pod(name, ns, {"metadata": {"annotations": dict(annotations)}})
            body = {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": name, "namespace": ns},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node},
            }
            self.core.create_namespaced_binding(ns, body, _preload_content=False)
        except ApiException as exc:
            print(f"toy: binding {ns}/{name} to {node} failed: {exc.status} {exc.reason}", flush=True)
            return False
        print(f"toy: bound {ns}/{name} to {node} {dict(annotations)}", flush=True)
        return True

    def unschedulable(self, pod: Mapping[str, Any], message: str) -> None:
        uid = pod["metadata"]["uid"]
        if self.reported.get(uid) == message:
            return
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        condition = {
            "type": "PodScheduled",
            "status": "False",
            "reason": "Unschedulable",
            "message": message[:1000],
            "lastTransitionTime": now,
        }
        try:
            self.core.patch_namespaced_pod_status(
                pod["metadata"]["name"], pod["metadata"]["namespace"], {"status": {"conditions": [condition]}}
            )
            self.reported[uid] = message
        except ApiException as exc:
            print(f"toy: could not mark {pod['metadata']['name']} unschedulable: {exc.status}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--name", default="gpuconf-toy", help="the spec.schedulerName it serves")
    parser.add_argument("--greedy", action="store_true", help="ignore memory already placed (overcommit)")
    parser.add_argument("--interval", type=float, default=0.2)
    parser.add_argument(
        "--kai-like", action="store_true", help="queue label required, no mode, canonical quantities"
    )
    parser.add_argument(
        "--queue",
        default=None,
        metavar="NAMESPACE/NAME",
        help="a ToyQueue (toy.gpuconf.io/v1) that must exist when it starts, as a vendor's CRDs must",
    )
    args = parser.parse_args(argv)
    api = kconfig.new_client_from_config(config_file=args.kubeconfig)
    core = client.CoreV1Api(api)
    if args.queue:
        namespace, _, queue = args.queue.partition("/")
        try:
            client.CustomObjectsApi(api).get_namespaced_custom_object(
                "toy.gpuconf.io", "v1", namespace, "toyqueues", queue
            )
        except ApiException as exc:
            print(f"toy: my ToyQueue {args.queue} is missing ({exc.status}); exiting", flush=True)
            return 1
    toy = Toy(core, args.name, args.greedy, args.kai_like)
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    print(f"toy: serving schedulerName {args.name}{' (greedy)' if args.greedy else ''}", flush=True)
    while not stop:
        try:
            toy.round()
        except (ApiException, OSError, ValueError) as exc:
            print(f"toy: round failed, retrying: {exc}", flush=True)
        time.sleep(args.interval)
    return 0


if __name__ == "__main__":
    sys.exit(main())

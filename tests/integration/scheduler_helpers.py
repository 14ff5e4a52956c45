"""Helpers for the reference scheduler's integration tests, named as what they wait for.

Not a conftest: the shared ``tests/integration/conftest.py`` belongs to the sandbox. Test
modules import these directly (pytest puts this folder on ``sys.path``).

Every wait polls with its own timeout and says what it waited for; nothing sleeps a fixed time.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from enforcement.contract import gpu_loads
from fixtures.sandbox.controlplane import Sandbox
from fixtures.sandbox.scheduler import rbac
from fixtures.suite.waiting import WaitTimeout, wait_until

START_TIMEOUT_S = 60.0
EMPTY_TIMEOUT_S = 60.0
PLACE_TIMEOUT_S = 30.0
PREFIX = "nvidia.com/container."


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def nv(container: str, suffix: str) -> str:
    return f"{PREFIX}{container}.{suffix}"


def manifest(
    name: str,
    annotations: Mapping[str, str] | None = None,
    scheduler: str = "default-scheduler",
    containers: Sequence[str] = ("main",),
    spec: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    # Long-running: where a simulated kubelet runs the Pod, it keeps holding its share until deleted.
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": dict(annotations or {})},
        "spec": {
            "schedulerName": scheduler,
            "containers": [
                {"name": c, "image": "gpuconf/workload:test", "command": ["sleep", "3600"]}
                for c in containers
            ],
            **(spec or {}),
        },
    }


def read_pod(core: client.CoreV1Api, namespace: str, name: str) -> dict[str, Any]:
    """The Pod as the API serves it, as a plain dict (what the contract module reads)."""
    resp = core.read_namespaced_pod(name, namespace, _preload_content=False)
    return json.loads(resp.data)


def gpu_annotations(pod: Mapping[str, Any]) -> dict[str, str]:
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    return {k: v for k, v in annotations.items() if k.startswith(PREFIX)}


def node_uuids(core: client.CoreV1Api, node: str) -> list[str]:
    return core.read_node(node).metadata.annotations["gpuconf.io/gpu-uuids"].split(",")


class Pods:
    """Creates Pods in one namespace and force-deletes them all at the end.

    Without a kubelet a bound Pod never finishes a graceful deletion, and a terminating Pod still
    holds its GPU share; so every Pod a test made is deleted with grace period 0.
    """

    def __init__(self, core: client.CoreV1Api, namespace: str, scheduler: str) -> None:
        self.core = core
        self.namespace = namespace
        self.scheduler = scheduler
        self.names: list[str] = []

    def create(
        self,
        name: str,
        annotations: Mapping[str, str] | None = None,
        containers: Sequence[str] = ("main",),
        scheduler: str | None = None,
        spec: Mapping[str, Any] | None = None,
    ) -> str:
        body = manifest(name, annotations, scheduler or self.scheduler, containers, spec)
        self.core.create_namespaced_pod(self.namespace, body, _preload_content=False)
        self.names.append(name)
        return name

    def read(self, name: str) -> dict[str, Any]:
        return read_pod(self.core, self.namespace, name)

    def bound(self, name: str, timeout: float = PLACE_TIMEOUT_S) -> dict[str, Any]:
        """Wait until the Pod is bound; the Pod as then served."""

        def probe() -> dict[str, Any] | None:
            pod = self.read(name)
            return pod if pod["spec"].get("nodeName") else None

        return wait_until(probe, f"Pod {self.namespace}/{name} to be bound", timeout=timeout)

    def unschedulable(self, name: str, containing: str = "", timeout: float = PLACE_TIMEOUT_S) -> str:
        """Wait for ``PodScheduled=False`` (reason Unschedulable) whose message contains ``containing``."""

        def probe() -> str | None:
            pod = self.read(name)
            assert not pod["spec"].get("nodeName"), f"{name} was bound to {pod['spec']['nodeName']}"
            for c in pod.get("status", {}).get("conditions") or ():
                if (
                    c["type"] == "PodScheduled"
                    and c["status"] == "False"
                    and c.get("reason") == "Unschedulable"
                ):
                    if containing in c.get("message", ""):
                        return c["message"]
            return None

        return wait_until(
            probe, f"Pod {self.namespace}/{name} to be Unschedulable ({containing!r})", timeout=timeout
        )

    def events(self, name: str, reason: str) -> list[client.CoreV1Event]:
        found = self.core.list_namespaced_event(
            self.namespace, field_selector=f"involvedObject.name={name},reason={reason}"
        ).items
        return sorted(found, key=lambda e: e.metadata.creation_timestamp)

    def event(self, name: str, reason: str, timeout: float = PLACE_TIMEOUT_S) -> client.CoreV1Event:
        found = wait_until(lambda: self.events(name, reason), f"a {reason} Event for {name}", timeout=timeout)
        return found[0]

    def finish(self, name: str, phase: str = "Succeeded") -> None:
        """What a kubelet would do when the container exits: phase Succeeded (exit 0) or Failed."""
        self.core.patch_namespaced_pod_status(
            name, self.namespace, {"status": {"phase": phase}}, _preload_content=False
        )

    def delete(self, name: str) -> None:
        try:
            self.core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=0)
        except ApiException as exc:
            if exc.status != 404:
                raise

    def delete_all(self) -> None:
        for name in self.names:
            self.delete(name)
        wait_until(
            lambda: not self.core.list_namespaced_pod(self.namespace).items,
            f"the Pods of {self.namespace} to be gone",
            timeout=PLACE_TIMEOUT_S,
        )
        self.names.clear()


def bound_fraction_pods(core: client.CoreV1Api) -> dict[tuple[str, str], Any]:
    """Every GPU that holds something, cluster-wide (to check a test starts from empty GPUs)."""
    pods = json.loads(core.list_pod_for_all_namespaces(_preload_content=False).data)["items"]
    nodes = json.loads(core.list_node(_preload_content=False).data)["items"]
    return gpu_loads(pods, nodes)


def wait_for_empty_gpus(core: client.CoreV1Api) -> None:
    """Until no GPU holds anything. The module before may have just ended: its namespace is deleted,
    but its Pods go only as the namespace controller and their grace periods let them (seconds, on
    a busy machine). What is still there after that was left behind: the test cannot start."""
    left: dict[tuple[str, str], Any] = {}

    def empty() -> bool:
        left.clear()
        left.update(bound_fraction_pods(core))
        return not left

    try:
        wait_until(empty, "every GPU to be empty", timeout=EMPTY_TIMEOUT_S)
    except WaitTimeout:
        raise AssertionError(
            f"the test needs empty GPUs; another test left fractions bound: {left}"
        ) from None


@contextmanager
def pods_on_empty_gpus(core: client.CoreV1Api, namespace: str, scheduler: str) -> Iterator[Pods]:
    """A ``Pods`` factory for one test, which needs every GPU empty; its Pods are deleted afterwards."""
    wait_for_empty_gpus(core)
    made = Pods(core, namespace, scheduler)
    try:
        yield made
    finally:
        made.delete_all()


def uuids_by_node(
    core: client.CoreV1Api, nodes: Sequence[str] = ("gpu-a-0", "gpu-a-1")
) -> dict[str, list[str]]:
    return {n: node_uuids(core, n) for n in nodes}


@contextmanager
def node_condition(core: client.CoreV1Api, node: str, kind: str, status: str) -> Iterator[None]:
    """Set one condition of a Node for the duration (what a node agent or kubelet would report)."""

    def put(value: str) -> None:
        current = core.read_node_status(node).status.conditions
        conditions = [
            {
                "type": c.type,
                "status": value if c.type == kind else c.status,
                "reason": c.reason or "Test",
                "message": c.message or "",
            }
            for c in current
        ]
        core.patch_node_status(node, {"status": {"conditions": conditions}}, _preload_content=False)

    before = next(c.status for c in core.read_node_status(node).status.conditions if c.type == kind)
    put(status)
    try:
        yield
    finally:
        put(before)


class SchedulerProcess:
    """``python -m fixtures.sandbox.scheduler`` against the sandbox, as its own user with its own RBAC."""

    def __init__(self, sandbox: Sandbox, name: str, workdir: Path, args: Sequence[str] = ()) -> None:
        self.sandbox = sandbox
        self.name = name
        self.args = tuple(args)
        self.log = workdir / f"{name}.log"
        self.ready = workdir / f"{name}.ready"
        user = rbac.user_for(name)
        rbac.ensure(client.RbacAuthorizationV1Api(sandbox.api_client()), name, user)
        self.kubeconfig = sandbox.issue_kubeconfig(f"scheduler-{name}", user)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> SchedulerProcess:
        self.ready.unlink(missing_ok=True)
        argv = [
            sys.executable,
            "-m",
            "fixtures.sandbox.scheduler",
            "--kubeconfig",
            str(self.kubeconfig),
            "--name",
            self.name,
            "--ready-file",
            str(self.ready),
            "--retry-seconds",
            "1",
            *self.args,
        ]
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONUNBUFFERED="1")
            )
        return self

    def wait_ready(self, timeout: float = START_TIMEOUT_S) -> SchedulerProcess:
        def probe() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"scheduler {self.name} exited {self.proc.returncode}:\n{self.text()[-3000:]}"
                )
            return self.ready.exists()

        wait_until(probe, f"scheduler {self.name} to be ready", timeout=timeout)
        return self

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def lines(self, containing: str) -> list[str]:
        return [line for line in self.text().splitlines() if containing in line]

    def kill(self) -> None:
        """SIGKILL: a crash, nothing flushed, nothing cleaned up."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()

    def remove_rbac(self) -> None:
        api = client.RbacAuthorizationV1Api(self.sandbox.api_client())
        for delete in (api.delete_cluster_role_binding, api.delete_cluster_role):
            try:
                delete(rbac.role_name(self.name))
            except ApiException as exc:
                if exc.status != 404:
                    raise
        self.kubeconfig.unlink(missing_ok=True)


@contextmanager
def running_schedulers(
    sandbox: Sandbox, workdir: Path, specs: Mapping[str, Sequence[str]]
) -> Iterator[dict[str, SchedulerProcess]]:
    """Start several schedulers at once (name -> extra args), stop them and remove their RBAC after."""
    procs = {name: SchedulerProcess(sandbox, name, workdir, args) for name, args in specs.items()}
    try:
        for p in procs.values():
            p.start()
        # Started together, they share the CPUs while they import and list: each one's start costs
        # about 2 s of CPU, so the last is ready only after all of them, on 2 busy cores well past
        # the one-scheduler timeout. The waits overlap: one budget for the group.
        budget = START_TIMEOUT_S + 3.0 * len(procs)
        for p in procs.values():
            p.wait_ready(timeout=budget)
        yield procs
    finally:
        for p in procs.values():
            p.stop()
        for p in procs.values():
            p.remove_rbac()

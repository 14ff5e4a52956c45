"""A real node joins the sandbox: kubelet v1.36.3, containerd 2.x and runc run a Pod (issue #31).

Real: the kubelet (built from the control plane's pinned module, ``fixtures.sandbox.realnode``), its
containerd and Debian's runc, the sandbox's API server with the Node authorizer and NodeRestriction.
The node registers itself as ``system:node:<name>``; the test only binds a Pod to it
(``spec.nodeName``) and reads what the kubelet reports: the Pod's phase, its container's exit code
and termination message, its output through the pods/log API (the API server asks the kubelet), the
kubelet's Events, and the end of a graceful deletion, which only a kubelet confirms. Then ``stop``
must leave no process, mount, cgroup or folder behind.

Host networking only (no CNI yet), so the Pod is ``hostNetwork: true``. The only skip: a machine
where containers cannot run at all (``runtime.cannot_run_containers``).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from kubernetes.client.rest import ApiException

from fixtures.sandbox import processes, runtime
from fixtures.sandbox.binaries import KUBERNETES_VERSION
from fixtures.sandbox.controlplane import Sandbox
from fixtures.sandbox.realnode import NODE_GROUP, TAINT_KEY, RealNode, node_user
from fixtures.sandbox.realnode.host import CGROUP_FS
from fixtures.sandbox.realnode.node import (
    CONTAINER_LOGS,
    DEVICE_PLUGINS,
    NO_POD_NETWORK_PLUGIN,
    _other_kubelets,
    stop_recorded,
)

pytestmark = pytest.mark.sandbox

T = TypeVar("T")
WAIT_S = 90.0
MESSAGE = "result: 42"


def wait_for(
    what: str, probe: Callable[[], T | None], seen: Callable[[], str], timeout_s: float = WAIT_S
) -> T:
    """``probe()`` once truthy; else an AssertionError saying what was seen last."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s:g} s waiting for {what}; last seen: {seen()}")
        time.sleep(0.3)


@pytest.fixture(scope="module")
def node(sandbox: Sandbox) -> Iterator[RealNode]:
    if (reason := runtime.cannot_run_containers()) is not None:
        pytest.skip(f"containerd and runc cannot run containers on this machine: {reason}")
    real = RealNode(sandbox, f"real-{uuid.uuid4().hex[:6]}", log=lambda m: print(m, flush=True))
    real.start()
    try:
        yield real
    finally:
        real.stop(check=False)  # idempotent; test_stop_leaves_nothing judges the stop itself
        for path in (real.kubelet_log, real.containerd_log):
            text = path.read_text(errors="replace") if path.exists() else ""
            print(f"--- {path.name} (tail) ---\n{text[-3000:]}")


def raw(call: Callable[..., Any], *args: Any, **kwargs: Any) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(call(*args, _preload_content=False, **kwargs).data)
    return data


def test_the_kubelet_registers_its_node(sandbox: Sandbox, node: RealNode) -> None:
    core = sandbox.core_v1()
    got = raw(core.read_node, node.name)
    ready = next(c for c in got["status"]["conditions"] if c["type"] == "Ready")
    assert ready["status"] == "True", ready
    info = got["status"]["nodeInfo"]
    assert info["kubeletVersion"] == KUBERNETES_VERSION
    assert info["containerRuntimeVersion"].startswith("containerd://"), info
    assert runtime.CONTAINERD_VERSION.lstrip("v") in info["containerRuntimeVersion"], info
    # Registered by the kubelet itself (no one else wrote the Node), with its own labels and taint.
    managers = {entry["manager"] for entry in got["metadata"].get("managedFields") or ()}
    assert managers == {"kubelet"}, managers
    assert got["metadata"]["labels"]["kubernetes.io/hostname"] == node.name
    assert {"key": TAINT_KEY, "value": "true", "effect": "NoSchedule"} in got["spec"]["taints"]
    addresses = {a["type"]: a["address"] for a in got["status"]["addresses"]}
    assert addresses.get("Hostname") == node.name and "InternalIP" in addresses, addresses
    # Its heartbeat: the Lease the kubelet creates (just after the Node) and renews in kube-node-lease.
    from kubernetes import client

    leases = client.CoordinationV1Api(sandbox.api_client())

    def lease() -> Any:
        try:
            return leases.read_namespaced_lease(node.name, "kube-node-lease")
        except ApiException as exc:
            if exc.status != 404:
                raise
            return None

    held = wait_for("the node's Lease", lease, lambda: "no Lease", timeout_s=30)
    assert held.spec.holder_identity == node.name


def test_the_node_identity_is_held_to_its_own_node(sandbox: Sandbox, node: RealNode) -> None:
    """The Node authorizer and NodeRestriction decide for system:node:<name>, as on a real cluster."""
    assert node.kubeconfig is not None
    as_node = sandbox.core_v1(node.kubeconfig)
    assert as_node.read_node(node.name).metadata.name == node.name
    other = f"other-{uuid.uuid4().hex[:6]}"
    sandbox.core_v1().create_node({"metadata": {"name": other}})
    try:
        with pytest.raises(ApiException) as denied:
            as_node.patch_node(other, {"metadata": {"labels": {"gpuconf.io/touched": "yes"}}})
        assert denied.value.status == 403, denied.value
        with pytest.raises(ApiException) as secrets:
            as_node.list_secret_for_all_namespaces()
        assert secrets.value.status == 403, secrets.value
    finally:
        sandbox.core_v1().delete_node(other)
    assert node_user(node.name) == f"system:node:{node.name}" and NODE_GROUP == "system:nodes"


def test_a_bound_pod_runs_to_completion(sandbox: Sandbox, node: RealNode, namespace: str) -> None:
    core = sandbox.core_v1()
    script = f"echo hello from $(hostname); echo '{MESSAGE}' > /dev/termination-log"
    core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": "hello"},
            "spec": {
                "nodeName": node.name,
                "hostNetwork": True,  # no CNI yet: host networking only
                "restartPolicy": "Never",
                "tolerations": [{"key": TAINT_KEY, "operator": "Exists"}],
                "containers": [
                    {
                        "name": "main",
                        "image": runtime.IMAGE,
                        "imagePullPolicy": "Never",
                        "command": ["sh", "-c", script],
                    }
                ],
            },
        },
    )
    last: dict[str, Any] = {}

    def finished() -> dict[str, Any] | None:
        last.update(raw(core.read_namespaced_pod, "hello", namespace))
        return last if last["status"].get("phase") in ("Succeeded", "Failed") else None

    def seen() -> str:
        status = last.get("status", {})
        return f"phase {status.get('phase')}, containers {status.get('containerStatuses')}; kubelet:\n" + (
            node.kubelet_errors()
        )

    pod = wait_for("the Pod to finish", finished, seen)
    status = pod["status"]
    assert status["phase"] == "Succeeded", seen()
    (container,) = status["containerStatuses"]
    terminated = container["state"]["terminated"]
    assert terminated["exitCode"] == 0 and terminated["reason"] == "Completed", terminated
    assert terminated["message"].strip() == MESSAGE, terminated
    assert container["containerID"].startswith("containerd://"), container
    host_ip = {a["type"]: a["address"] for a in raw(core.read_node, node.name)["status"]["addresses"]}
    assert status["hostIP"] == host_ip["InternalIP"] == status["podIP"], status
    # The pods/log API: the API server asks the node's kubelet, as on any cluster.
    log = core.read_namespaced_pod_log("hello", namespace, container="main")
    assert "hello from" in log, log

    def started_event() -> list[dict[str, Any]]:
        events = raw(core.list_namespaced_event, namespace, field_selector="involvedObject.name=hello")
        return [e for e in events["items"] if e.get("reason") == "Started"]

    (event,) = wait_for("the kubelet's Started Event", started_event, lambda: "none", timeout_s=30)
    assert event["source"].get("component") == "kubelet" and event["source"].get("host") == node.name, event

    # A graceful deletion ends only when the kubelet confirms it: the Pod goes away.
    core.delete_namespaced_pod("hello", namespace)

    def gone() -> bool:
        try:
            core.read_namespaced_pod("hello", namespace)
        except ApiException as exc:
            return exc.status == 404
        return False

    wait_for("the kubelet to finish the Pod's deletion", gone, seen, timeout_s=60)


def test_a_pod_without_host_network_fails_and_says_why(
    sandbox: Sandbox, node: RealNode, namespace: str
) -> None:
    """No pod network yet: its sandbox's creation fails with containerd's error naming a missing CNI
    plugin, as a Pod's Event, and the Pod never runs (no network that pretends)."""
    core = sandbox.core_v1()
    core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": "networked"},
            "spec": {
                "nodeName": node.name,
                "restartPolicy": "Never",
                "tolerations": [{"key": TAINT_KEY, "operator": "Exists"}],
                "containers": [
                    {"name": "main", "image": runtime.IMAGE, "imagePullPolicy": "Never", "command": ["true"]}
                ],
            },
        },
    )

    def refused() -> list[dict[str, Any]]:
        events = raw(core.list_namespaced_event, namespace, field_selector="involvedObject.name=networked")
        return [e for e in events["items"] if e.get("reason") == "FailedCreatePodSandBox"]

    (event, *_) = wait_for("a FailedCreatePodSandBox Event", refused, lambda: "none", timeout_s=60)
    # containerd sets up its own loopback network too, whose plugin is missing as well: either is named.
    message = event["message"]
    assert "failed to find plugin" in message and (NO_POD_NETWORK_PLUGIN in message or "loopback" in message)
    status = raw(core.read_namespaced_pod, "networked", namespace)["status"]
    assert status["phase"] == "Pending", status


def test_stop_leaves_nothing_behind(sandbox: Sandbox, node: RealNode) -> None:
    assert node.folder is not None
    folder, cgroup = node.folder, node.cgroups.name
    pids = dict(node.pids)
    running = node.leftovers()
    assert any(line.startswith("kubelet") for line in running), running
    assert f"folder {folder}" in running and any(line.startswith("cgroup") for line in running), running
    assert node.record.exists()
    problems = node.stop()
    assert problems == []
    assert_nothing_left(folder, cgroup, pids)
    assert not node.record.exists()
    with pytest.raises(ApiException) as absent:
        sandbox.core_v1().read_node(node.name)
    assert absent.value.status == 404


def test_a_node_whose_caller_died_is_cleaned_by_its_record(sandbox: Sandbox, namespace: str) -> None:
    """A caller killed with its node running (a Pod in it): the sandbox's `down` finds the node's record
    and removes it all (here called directly: the sandbox is shared). Its containers outlive containerd,
    as on any node, so they, their mounts and cgroups are taken away by the record."""
    if (reason := runtime.cannot_run_containers()) is not None:
        pytest.skip(f"containerd and runc cannot run containers on this machine: {reason}")
    orphan = RealNode(sandbox, f"orphan-{uuid.uuid4().hex[:6]}", log=lambda m: print(m, flush=True))
    orphan.start()
    try:
        core = sandbox.core_v1()
        core.create_namespaced_pod(
            namespace,
            {
                "metadata": {"name": "sleeper"},
                "spec": {
                    "nodeName": orphan.name,
                    "hostNetwork": True,
                    "tolerations": [{"key": TAINT_KEY, "operator": "Exists"}],
                    "containers": [
                        {
                            "name": "main",
                            "image": runtime.IMAGE,
                            "imagePullPolicy": "Never",
                            "command": ["sleep", "3600"],
                        }
                    ],
                },
            },
        )
        last: dict[str, Any] = {}

        def running() -> bool:
            last.update(raw(core.read_namespaced_pod, "sleeper", namespace))
            return last["status"].get("phase") == "Running"

        wait_for("the sleeper to run", running, lambda: f"{last.get('status')}; {orphan.kubelet_errors()}")
        assert orphan.folder is not None
        folder, cgroup, pids = orphan.folder, orphan.cgroups.name, dict(orphan.pids)
        assert [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if str(folder) in line]
        stopped = stop_recorded(sandbox.dir, log=lambda m: print(m, flush=True))
        assert {line.split(" of ")[0] for line in stopped} == {"kubelet", "containerd"}, stopped
        assert_nothing_left(folder, cgroup, pids)
        assert not orphan.record.exists()
    finally:
        orphan.stop(check=False)


def assert_nothing_left(folder: Path, cgroup: str, pids: dict[str, int]) -> None:
    """Judged from /proc and /sys, not from the module's own view."""
    alive = {what: pid for what, pid in pids.items() if processes.start_ticks(pid) is not None}
    assert alive == {}, alive
    holders = [
        p.name for p in Path("/proc").iterdir() if p.name.isdigit() and str(folder).encode() in _cmdline(p)
    ]
    assert holders == [], f"processes naming {folder}: {holders}"
    mounts = [line for line in Path("/proc/self/mountinfo").read_text().splitlines() if str(folder) in line]
    assert mounts == [], mounts
    cgroups = [str(p) for p in CGROUP_FS.glob(f"*/{cgroup}")] + [str(p) for p in CGROUP_FS.glob(cgroup)]
    assert cgroups == [], cgroups
    assert not folder.exists()
    # The kubelet's two fixed paths (docs: fixtures/sandbox/realnode/node.py, FIXED_PATHS).
    links = [str(p) for p in CONTAINER_LOGS.glob("*.log") if str(folder) in _readlink(p)]
    assert links == [], links
    if not _other_kubelets():
        assert not (DEVICE_PLUGINS / "kubelet.sock").exists()


def _cmdline(proc: Path) -> bytes:
    try:
        return (proc / "cmdline").read_bytes()
    except OSError:
        return b""


def _readlink(path: Path) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""

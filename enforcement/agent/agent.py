"""The agent process: backend, hook server, evictor, node condition, Pod watch and metrics, wired.

``python -m enforcement.agent --node NAME --kubeconfig PATH --backend sim --sim-dir DIR
--hook-socket PATH [--metrics-port PORT] [--fail-open] [--sim-admin-token-env NAME]
[--announce-restart-hook]`` (the sandbox's node wiring starts it so); on a real cluster it runs in
the DaemonSet of ``enforcement/deploy`` with ``--backend mps``, the in-cluster service account and
``--require-nri-plugin``: there the hook's caller is the NRI plugin of ``enforcement/nri``, and the
node condition is False (``NRIPluginNotRegistered``) unless the plugin reported its registration
with containerd within the last ``NRI_PLUGIN_TIMEOUT_S`` seconds.

Run as a plain process (not a Pod), ``--announce-restart-hook`` makes it re-execute itself on
SIGHUP (a full restart that keeps the pid) and say so on its Node (``enforcement.agent.restart``):
that is how the suite's agent-restart check restarts an agent that has no Pod to delete.

Start order, and why:

1. the backend, then **adoption** of what it still holds: a restarted agent knows its containers
   again before it answers anything, so its first Synchronize and its first eviction round see
   them (recovery is measured in seconds: interpreter start plus one snapshot);
2. the **hook server**; then one JSON ready line on stdout (``{"event": "ready", ...}``), the
   signal the sandbox and the tests wait for;
3. the **evictor** (every 100 ms), the **health loop** (node condition, every second; a
   heartbeat every minute), the **Pod watch** and the **metrics** server.

SIGTERM/SIGINT stop the loops and close the hook socket. Containers keep running and their
backend clients stay attached: a stopping agent is most often an agent being upgraded, and the
next one re-adopts them. For the same reason the node condition is left as it was: a minute's
stale heartbeat says more than a Ready=False that would drain the node for a restart.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from enforcement.agent import kube as k
from enforcement.agent import restart
from enforcement.agent.environment import emulated_part
from enforcement.agent.evictor import Evictor
from enforcement.agent.handler import REASON_PLUGIN_MISSING, AgentCore
from enforcement.agent.metrics import Metrics, MetricsServer
from enforcement.agent.options import EVICT_BY, FAULT_ALIASES, FAULTS, AgentOptions, canonical_fault
from enforcement.agent.watching import PodWatcher
from enforcement.backends import Backend, BackendError, BackendUnavailable
from enforcement.contract import NODE_GPU_UUIDS, node_gpu_uuids
from enforcement.hook import HookServer
from enforcement.implementations import builtins

DEFAULT_SIM_TOKEN_ENV = "GPUCONF_SIM_ADMIN_TOKEN"
NRI_PLUGIN_TIMEOUT_S = 5.0
"""The plugin reports every second; after this long without a report it counts as not registered."""
NRI_PLUGIN_READINESS_PERIOD_S = 10.0
"""Declared: the node condition turns False within this long of the plugin stopping (its timeout,
one health interval and the condition's write)."""


def make_log(node: str) -> Callable[[str], None]:
    def log(message: str) -> None:
        stamp = datetime.now(UTC).strftime("%H:%M:%S.%f")[:-3]
        print(f"{stamp} gpuconf-agent[{node}]: {message}", file=sys.stderr, flush=True)

    return log


class HealthLoop:
    """Keeps the node condition ``gpu-fractioning.nvidia.com/Ready`` equal to the backend's health."""

    def __init__(self, core: AgentCore, on_recovered: Callable[[], None]) -> None:
        self.core = core
        self._on_recovered = on_recovered
        self._written: tuple[bool, str] | None = None
        self._written_at = -1e9
        self.ok: bool | None = None
        """The backend's health as last seen."""
        self.plugin_ok: bool | None = None
        """The NRI plugin's registration as last seen (always True when none is expected)."""
        self.ready: bool | None = None
        """The node condition's status as last decided (backend and plugin): what ``/healthz`` says."""

    def run_once(self) -> None:
        core = self.core
        health = core.backend.health()
        core.metrics.set("gpu_fractioning_agent_backend_up", 1 if health.ok else 0)
        if health.ok and self.ok is not True:
            try:
                self._on_recovered()
            except BackendError as exc:
                core.log(f"backend answered, then failed during recovery ({exc}); trying again")
                return
        if health.ok != self.ok:
            core.log(
                f"backend {core.backend.name}: {'ready' if health.ok else 'UNAVAILABLE'}: {health.message}"
            )
        self.ok = health.ok
        core.backend_down = None if health.ok else (health.message or health.reason)
        ok, reason, message = health.ok, health.reason, health.message
        if not ok and core.options.has("ready-without-backend"):
            # Seeded fault: the condition keeps saying Ready while the backend cannot fence.
            ok, reason, message = True, "BackendReady", f"{core.backend.name} backend ready"
        plugin_ok, plugin_message = core.plugin_health()
        if plugin_ok and plugin_message and ok:
            message = f"{message}; {plugin_message}"
        elif not plugin_ok:
            # The condition says which part is missing: the backend's reason wins when both are.
            reason = reason if not ok else REASON_PLUGIN_MISSING
            message = f"{message}; {plugin_message}" if not ok else plugin_message
            ok = False
        if plugin_ok != self.plugin_ok:
            core.log(f"NRI plugin: {'ready' if plugin_ok else 'MISSING'}: {plugin_message}")
            self.plugin_ok = plugin_ok
        self.ready = ok
        now = time.monotonic()
        state = (ok, reason)
        if state != self._written or now - self._written_at >= core.options.heartbeat_s:
            try:
                core.kube.set_condition(ok, reason, message)
            except k.KubeError as exc:
                core.log(f"could not write the node condition: {exc}")
                return
            self._written, self._written_at = state, now

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            try:
                self.run_once()
            except Exception as exc:  # noqa: BLE001 - the loop must outlive any one failure
                self.core.log(f"health loop: {type(exc).__name__}: {exc}")
            stop.wait(self.core.options.health_interval_s)


class Agent:
    """One node's agent, as a set of threads around an ``AgentCore``."""

    def __init__(
        self,
        options: AgentOptions,
        backend: Backend,
        kube: k.Kube,
        hook_socket: str | Path,
        *,
        core_v1: Any | None = None,
        metrics_port: int = 0,
        metrics_bind: str = "0.0.0.0",
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.options = options
        self.log = log or make_log(options.node)
        self.metrics = Metrics()
        self.core = AgentCore(backend, kube, options, metrics=self.metrics, log=self.log)
        self.evictor = Evictor(self.core)
        self.stop_event = threading.Event()
        self.hook_socket = str(hook_socket)
        self._core_v1 = core_v1
        self._metrics_port = metrics_port
        self._metrics_bind = metrics_bind
        self._adopted = False
        self.health = HealthLoop(self.core, self._recovered)
        self._hook: HookServer | None = None
        self.metrics_server: MetricsServer | None = None
        self.watcher: PodWatcher | None = None
        self._threads: list[threading.Thread] = []

    def _recovered(self) -> None:
        """The backend answers (at start, or again after an outage)."""
        if not self._adopted:
            self.core.adopt()
            self._adopted = True
        self.core.reconcile_backend()

    def check_node(self) -> None:
        """Warn when the Node's GPU UUIDs and the backend's disagree: assignments by UUID would fail."""
        try:
            node = self.core.kube.read_node()
            gpus = self.core.backend.gpus()
        except (k.KubeError, BackendError) as exc:
            self.log(f"could not compare the Node's GPUs with the backend's: {exc}")
            return
        if node is None:
            self.log(f"warning: Node {self.options.node} does not exist; serving its Pods anyway")
            return
        listed = node_gpu_uuids(node)
        actual = tuple(g.uuid for g in gpus)
        if listed and listed != actual:
            self.log(
                f"warning: Node {self.options.node} lists GPUs {', '.join(listed)} (annotation "
                f"{NODE_GPU_UUIDS}) but the {self.core.backend.name} backend has {', '.join(actual)}: "
                "devices assigned by UUID will be refused as unknown"
            )

    def start(self) -> dict[str, Any]:
        adopted = 0
        try:
            adopted = self.core.adopt()
            self._adopted = True
        except BackendUnavailable as exc:
            self.log(f"backend unavailable at start ({exc}); will adopt its clients when it answers")
        self._hook = HookServer(self.hook_socket, self.core).start()
        threading.Thread(target=self.check_node, name="check-node", daemon=True).start()
        for name, target in (("evictor", self.evictor.run), ("health", self.health.run)):
            thread = threading.Thread(target=target, args=(self.stop_event,), name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        if self._core_v1 is not None:
            self.watcher = PodWatcher(
                self._core_v1,
                self.options.node,
                self.core.prune,
                self.core.forget_pod,
                self.stop_event,
                self.log,
                self.options.resync_s,
            )
            self.watcher.start()
        if self._metrics_port:
            self.metrics_server = MetricsServer(
                self._metrics_port,
                self.metrics,
                self.core.registry,
                self.core.backend.usage,
                lambda: bool(self.health.ready),
                bind=self._metrics_bind,
            ).start()
        return {
            "event": "ready",
            "node": self.options.node,
            "backend": self.core.backend.name,
            "hook_socket": self.hook_socket,
            "adopted": adopted,
            "metrics_port": self.metrics_server.port if self.metrics_server else 0,
            "fail_open": self.options.fails_open,
            "nri_plugin_timeout_s": self.options.nri_plugin_timeout_s,
            "hook_incarnation": self._hook.incarnation,
            "faults": sorted(self.options.faults),
            "pid": os.getpid(),
        }

    def stop(self) -> None:
        self.stop_event.set()
        if self._hook is not None:
            self._hook.close()
        if self.metrics_server is not None:
            self.metrics_server.close()
        for thread in self._threads:
            thread.join(timeout=5)
        self.core.backend.close()


# ---- command line


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m enforcement.agent",
        description="gpuconf reference node agent: enforces GPU-fraction annotations on one node.",
    )
    p.add_argument("--node", required=True, help="the Node this agent serves")
    p.add_argument("--kubeconfig", help="kubeconfig file (default: the in-cluster service account)")
    p.add_argument("--backend", choices=("sim", "mps"), default="sim")
    p.add_argument("--sim-dir", help="sim backend: the simulated device's socket directory")
    p.add_argument(
        "--sim-admin-token-env",
        default=DEFAULT_SIM_TOKEN_ENV,
        metavar="NAME",
        help="sim backend: environment variable holding the device's admin token "
        f"(default {DEFAULT_SIM_TOKEN_ENV}; else the token file in --sim-dir)",
    )
    p.add_argument(
        "--mps-root", default="/run/gpuconf/mps", help="mps backend: pipe, log and state directory"
    )
    p.add_argument("--hook-socket", required=True, help="Unix socket the node runtime calls (NRI-like hook)")
    p.add_argument(
        "--require-nri-plugin",
        type=float,
        nargs="?",
        const=NRI_PLUGIN_TIMEOUT_S,
        default=None,
        metavar="S",
        help="the node's runtime calls the hook through the NRI plugin (enforcement/nri): the node "
        "condition is False unless the plugin reported its registration within S seconds "
        f"(default {NRI_PLUGIN_TIMEOUT_S:g})",
    )
    p.add_argument("--metrics-port", type=int, default=0, help="Prometheus metrics port (0: off)")
    p.add_argument("--metrics-bind", default="0.0.0.0", help="address the metrics server binds")
    p.add_argument(
        "--fail-open", action="store_true", help="start containers with a malformed contract unfenced"
    )
    p.add_argument(
        "--emulate",
        default="",
        metavar="IMPLEMENTATION",
        help="reproduce a built-in node implementation's mechanisms (its condition, env dialect, the "
        "mechanisms it claims) while enforcing the same effects: "
        + ", ".join(n for n, i in builtins().items() if i.node is not None),
    )
    p.add_argument("--evict-interval", type=float, default=0.1, metavar="S", help="pressure poll interval")
    p.add_argument(
        "--evict-by",
        choices=EVICT_BY,
        default="api",
        help="how a borrower is evicted under pressure: the Eviction API, a CUDA-style error on its next "
        "call (its memory reclaimed), or killing its processes",
    )
    p.add_argument(
        "--reaction-period",
        type=float,
        default=0.0,
        metavar="S",
        help="pressure must last this long before the agent evicts (default 0: at the next poll)",
    )
    p.add_argument(
        "--announce-restart-hook",
        action="store_true",
        help="for an agent run as a local process, not a Pod: re-execute on SIGHUP and announce that on the "
        f"Node (annotation {restart.ANNOTATION})",
    )
    p.add_argument(
        "--fault",
        action="append",
        default=[],
        type=canonical_fault,
        choices=sorted(FAULTS),
        help="seeded fault for self-validation only (repeatable; an earlier name "
        f"({', '.join(FAULT_ALIASES)}) means its new one); never in a real deployment",
    )
    return p


def make_backend(args: argparse.Namespace) -> Backend:
    if args.backend == "sim":
        from enforcement.backends.sim import SimBackend

        if not args.sim_dir:
            raise ValueError("--backend sim needs --sim-dir (the simulated device's socket directory)")
        token = os.environ.get(args.sim_admin_token_env) or None
        return SimBackend.from_dir(args.sim_dir, token)
    from enforcement.backends.mps import MpsBackend

    return MpsBackend.create(args.mps_root)


def announce_restart_hook(kube: k.KubeClient, log: Callable[[str], None]) -> restart.RestartHook | None:
    """Write this start's restart hook on the Node (a few tries: the API may be slow at boot)."""
    hook = restart.this_process()
    for attempt in range(5):
        try:
            kube.annotate_node(restart.ANNOTATION, hook.to_json())
            return hook
        except k.KubeError as exc:
            log(f"could not announce the restart hook ({exc}); attempt {attempt + 1} of 5")
            time.sleep(1.0)
    return None


def reexecute(argv: Sequence[str], log: Callable[[str], None]) -> None:
    """Replace this process with a fresh agent on the same command line (does not return)."""
    command = [sys.executable, "-m", "enforcement.agent", *argv]
    log("restarting: re-executing the agent (" + " ".join(command[:4]) + " ...)")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, command)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    log = make_log(args.node)
    try:
        options = AgentOptions(
            node=args.node,
            fail_open=args.fail_open,
            evict_interval_s=max(0.01, args.evict_interval),
            nri_plugin_timeout_s=args.require_nri_plugin,
            evict_by=args.evict_by,
            reaction_period_s=args.reaction_period,
            faults=frozenset(args.fault),
            emulate=args.emulate,
        )
        condition = emulated_part(args.emulate).condition if args.emulate else k.CONDITION_TYPE
        backend = make_backend(args)
    except (ValueError, BackendError) as exc:
        print(f"gpuconf-agent: {exc}", file=sys.stderr)
        return 2
    from kubernetes import client, config

    try:
        if args.kubeconfig:
            api_client = config.new_client_from_config(config_file=args.kubeconfig)
        else:
            config.load_incluster_config()
            api_client = client.ApiClient()
    except Exception as exc:  # noqa: BLE001 - a bad kubeconfig is a usage error, said plainly
        print(f"gpuconf-agent: cannot load Kubernetes credentials: {exc}", file=sys.stderr)
        return 2
    kube = k.KubeClient(api_client, args.node, log, condition=condition)
    agent = Agent(
        options,
        backend,
        kube,
        args.hook_socket,
        core_v1=kube.core,
        metrics_port=args.metrics_port,
        metrics_bind=args.metrics_bind,
        log=log,
    )
    stopping = threading.Event()
    restarting = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        # Only Events: the main thread may hold a lock a handler would need.
        if signum == signal.SIGHUP:
            restarting.set()
        stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    if args.announce_restart_hook:
        signal.signal(signal.SIGHUP, on_signal)
    try:
        ready = agent.start()
    except OSError as exc:
        print(f"gpuconf-agent: cannot serve the hook socket {args.hook_socket}: {exc}", file=sys.stderr)
        return 2
    if args.announce_restart_hook:
        hook = announce_restart_hook(kube, log)
        ready["incarnation"] = hook.incarnation if hook else None
    print(json.dumps(ready), flush=True)
    log(
        f"serving node {args.node} on {args.hook_socket} ({backend.name} backend, adopted {ready['adopted']})"
    )
    while not stopping.wait(1.0):
        pass
    log("stopping (containers keep running; their fences stay for the next agent to adopt)")
    agent.stop()
    if restarting.is_set():
        reexecute(argv, log)
    return 0

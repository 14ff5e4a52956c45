"""The hook handler: what the agent decides for each container, and how it recovers its state.

``AgentCore`` implements ``enforcement.hook.HookHandler``; it is also what ``gpuconf probe`` drives
directly, with no Kubernetes at all. Its decisions, in order, for one CreateContainer:

1. **Parse** with ``enforcement.contract.read_placement`` (never here): errors naming this container
   make its contract malformed. No annotations for the container: allowed unchanged (not fractional).
2. **Resolve devices** against the backend's GPUs (index, UUID or CDI name -> UUID); a device the
   node lacks is a malformed contract too (rule ``devices-unknown``).
3. Malformed: **fail closed** (refused, ``CreateContainerConfigError``, a ``GPUFractionRejected``
   Event whose message names each key and rule), or with ``--fail-open`` start it unfenced with a
   ``GPUFractionUnfenced`` Warning.
4. **Mode guard**: a GPU already running the other compute mode refuses the container with a
   ``GPUModeConflict`` Event naming both Pods and modes. The scheduler broke the contract; the node
   must say so, not hide it. (The backend checks too; either refusal reads the same.)
5. **Attach** in the backend (hard limit = limit, guarantee = request, mode, devices) and answer
   with the enforcement environment (``environment``) plus what the backend needs (the simulated
   device's socket and token).

One lock (``_admit``) orders mode guard, attach and registry update against each other and against
Synchronize and reconciliation, so two containers racing onto one GPU cannot both pass the guard.

Recovery: ``adopt()`` rebuilds the registry from the backend's clients and their attach labels
(restart); ``synchronize()`` takes the runtime's list of running containers: adopts what it can,
re-attaches a running container whose client the backend lost (reported as ``GPUFenceLost``: its
process holds a stale token, but its guarantee and mode are held again), and releases clients of
containers that no longer run (a StopContainer that was lost while the agent was away).

Nothing here raises into the hook server: every path answers with an ``Adjustment``, an unexpected
error included (refused, fail closed).
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from enforcement.agent import kube as k
from enforcement.agent.environment import dialect_env, emulated_part, enforcement_env
from enforcement.agent.metrics import Metrics
from enforcement.agent.options import DEVICE_FAULTS, AgentOptions
from enforcement.agent.registry import (
    LABEL_AGENT,
    LABEL_PORTION,
    LABEL_UID,
    Registry,
    Tracked,
    client_name,
    labels_for,
    ref_from_labels,
)
from enforcement.backends import (
    AttachRefused,
    Backend,
    BackendError,
    BackendUnavailable,
    ClientRequest,
    ClientUsage,
    DeviceLimit,
    GpuInfo,
    ModeConflict,
)
from enforcement.contract import (
    SUFFIX_DEVICES,
    SUFFIX_LIMIT,
    SUFFIX_MODE,
    SUFFIX_REQUEST,
    TIME_SLICING,
    Fraction,
    nvidia_key,
    read_placement,
    resolve_device,
)
from enforcement.hook import REASON_CONFIG_ERROR, Adjustment, ContainerRef, PluginStatus, RunningContainer
from workloads.plan import MiB

REASON_PLUGIN_MISSING = "NRIPluginNotRegistered"
"""The node condition's reason while the NRI plugin is not registered with the container runtime."""

REASON_CREATE_ERROR = "CreateContainerError"
"""Kubelet's waiting reason for a start that failed for a transient reason (backend unreachable)."""


def _annotations(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    """The Pod's annotations; empty where the document is broken (the parser reports that, not here)."""
    metadata = pod.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    return annotations if isinstance(annotations, Mapping) else {}


def stderr_log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Problem:
    """One reason a container's contract cannot be enforced: the key, the rule, what and how to fix."""

    key: str
    rule: str
    message: str
    fix: str = ""
    value: str | None = None
    """The value written under ``key`` (None: absent); only the ``vague-refusal`` fault shows it alone."""

    def __str__(self) -> str:
        return f"{self.key}: {self.message} [{self.rule}]"


class AgentCore:
    """Admission, release, synchronisation and adoption (see the module docstring). Thread-safe."""

    def __init__(
        self,
        backend: Backend,
        kube: k.Kube,
        options: AgentOptions,
        *,
        metrics: Metrics | None = None,
        log: Callable[[str], None] = stderr_log,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.backend = backend
        self.kube = kube
        self.options = options
        self.metrics = metrics or Metrics()
        self.log = log
        self.clock = clock
        self.registry = Registry()
        self._admit = threading.RLock()
        self._orphans: set[str] = set()
        """Clients to release once the backend answers again (a detach that could not go through)."""
        self._plugin: tuple[PluginStatus, float] | None = None
        self._plugin_lock = threading.Lock()
        self._resumed = False
        """Whether this process re-adopted containers a previous one fenced (it is a restart)."""
        self.backend_down: str | None = None
        """Why the backend was unavailable at the health loop's last look (``HealthLoop``); None:
        it answered, or nobody looked (``gpuconf probe`` drives the core without the loop)."""

    @property
    def node(self) -> str:
        return self.options.node

    # ------------------------------------------------------------------ CreateContainer

    def create_container(self, pod: Mapping[str, Any], container: str) -> Adjustment:
        try:
            return self._create(pod, container)
        except Exception as exc:  # noqa: BLE001 - the hook must always answer; refusing is fail-closed
            self.log(f"internal error deciding container {container!r}: {exc}\n{traceback.format_exc()}")
            self.metrics.inc("gpu_fractioning_agent_rejected_containers_total", reason="internal-error")
            return Adjustment(
                False,
                reason=REASON_CREATE_ERROR,
                message=f"gpuconf node agent: internal error deciding container {container!r} "
                f"({type(exc).__name__}: {exc}); not started (fail closed)",
            )

    def _create(self, pod: Mapping[str, Any], container: str) -> Adjustment:
        ref = k.pod_ref(pod, container)
        pod = self._as_read(pod, container)
        annotations = _annotations(pod)
        fractions, violations = read_placement(pod)
        problems = [
            Problem(v.key, v.rule, v.message, v.fix, annotations.get(v.key))
            for v in violations
            if v.is_error and v.container == container
        ]
        fraction = fractions.get(container)
        if fraction is None and fractions and self.options.has("fence-whole-pod"):
            # Seeded fault: the Pod's fraction fences every container of it, a sidecar included.
            fraction = next(iter(fractions.values()))
        gpus: tuple[str, ...] = ()
        node_gpus: tuple[GpuInfo, ...] = ()
        down = self.backend_down
        if not problems and fraction is not None and down is not None:
            # Known down: refused at once, not after a call to a backend that does not answer (which
            # would hold the admission lock, and the runtime's hook call, for its whole timeout).
            return self._backend_down(ref, BackendUnavailable(down))
        if not problems and fraction is not None:
            try:
                node_gpus = self.backend.gpus()
            except BackendUnavailable as exc:
                return self._backend_down(ref, exc)
            gpus, device_problems = self._resolve(container, fraction, node_gpus)
            problems += device_problems
        if problems:
            return self._malformed(ref, problems)
        if fraction is None:
            self._release_previous(ref)
            return Adjustment(True)
        fraction, gpus = self._with_faults(fraction, gpus, node_gpus)
        name = client_name(ref)
        with self._admit:
            conflict = self._mode_conflict(name, fraction, gpus)
            if conflict is not None:
                gpu, other = conflict
                return self._refuse_mode(ref, fraction.mode, gpu, other.ref, other.mode)
            request = self._client_request(ref, name, fraction, gpus)
            try:
                attachment = self._attach(request)
            except ModeConflict as exc:
                other_ref = self._ref_of(exc.other_client)
                return self._refuse_mode(ref, fraction.mode, exc.gpu, other_ref, exc.other_mode)
            except AttachRefused as exc:
                key = nvidia_key(container, SUFFIX_DEVICES)
                problem = Problem(key, "device-refused", str(exc), value=annotations.get(key))
                self.metrics.inc("gpu_fractioning_agent_rejected_containers_total", reason="device-refused")
                message = self._refusal_text(ref, [problem])
                self.kube.event(ref, k.WARNING, k.REASON_REJECTED, message)
                return Adjustment(False, reason=REASON_CONFIG_ERROR, message=message)
            except BackendUnavailable as exc:
                return self._backend_down(ref, exc)
            self.registry.put(Tracked(ref, name, fraction, gpus, self.clock()))
        self.metrics.inc("gpu_fractioning_agent_admitted_containers_total")
        visible = gpus
        if self.options.has("wrong-visible-devices"):
            visible = self._visible_with_faults(gpus, node_gpus)
        pipe = self.backend.pipe_directory(fraction.mode)
        if self.options.emulate:
            part = emulated_part(self.options.emulate)
            # Its own pipe directories only where no real MPS server is reached through them (sim).
            pipe = pipe if self.backend.name != "sim" else part.env.pipe_directories.get(fraction.mode, pipe)
            annotations = (pod.get("metadata") or {}).get("annotations") or {}
            written = str(annotations.get(nvidia_key(container, SUFFIX_DEVICES)) or "")
            env = dialect_env(part, fraction, visible, written or ",".join(visible), pipe, attachment.env)
        else:
            env = enforcement_env(fraction, visible, pipe, attachment.env)
        mounts = tuple(dict.fromkeys((pipe, *getattr(attachment, "mounts", ()))))
        return Adjustment(True, env=env, mounts=mounts)

    def _client_request(
        self, ref: ContainerRef, name: str, fraction: Fraction, gpus: tuple[str, ...]
    ) -> ClientRequest:
        """What the backend is asked to hold for a container: its limits per GPU, mode and labels."""
        limits = [fraction.limit_mib] * len(gpus)
        if self.options.has("limit-first-device-only") and len(gpus) > 1:
            # Seeded fault: only the first device is fenced; the others get their whole memory.
            capacity = {g.uuid: g.memory_mib for g in self.backend.gpus()}
            limits[1:] = [max(capacity.get(g, 0), fraction.limit_mib) for g in gpus[1:]]
        return ClientRequest(
            name=name,
            gpus=tuple(
                DeviceLimit(g, limit, fraction.request_mib) for g, limit in zip(gpus, limits, strict=True)
            ),
            mode=fraction.mode,
            active_thread_percentage=fraction.active_thread_percentage,
            labels=labels_for(ref, self.node, fraction),
            # Seeded fault: time-slicing clients join their GPU's shared fault domain.
            shared_fault_domain=self.options.has("shared-fault-domain"),
            # Seeded fault: an overrun is fenced by scrubbing the neighbours' pages.
            unprotected_memory=self.options.has("clobber-neighbour"),
            # Seeded fault: the container's NVML view counts its GPUs' whole usage.
            device_usage_view=self.options.has("smi-device-used"),
            # Seeded faults the device commits (the limit's reach, its charge, CUDA's enumeration).
            device_faults=tuple(f for f in DEVICE_FAULTS if self.options.has(f)),
        )

    def _attach(self, request: ClientRequest) -> Any:
        try:
            return self.backend.attach(request)
        except ModeConflict as exc:
            if self._guards(request.mode, self.registry.get(exc.other_client)):
                raise
            # Seeded fault: lie to the device about the mode so it takes the client anyway.
            return self.backend.attach(dataclasses.replace(request, mode=exc.other_mode))

    def _resolve(
        self, container: str, fraction: Fraction, node_gpus: tuple[GpuInfo, ...]
    ) -> tuple[tuple[str, ...], list[Problem]]:
        """The assigned devices as this node's GPU UUIDs, in the order written."""
        key = nvidia_key(container, SUFFIX_DEVICES)
        by_index = {str(g.index): g.uuid for g in node_gpus}
        known = {g.uuid for g in node_gpus}
        out: list[str] = []
        problems: list[Problem] = []
        for device in fraction.devices:
            inner = resolve_device(device)  # a CDI name's device part; an index stays an index
            uuid = by_index.get(inner) or (inner if inner in known else None)
            if uuid is None:
                has = f"indices 0..{len(node_gpus) - 1}" if node_gpus else "no GPUs"
                problems.append(
                    Problem(
                        key,
                        "devices-unknown",
                        f"{device!r} is not a GPU of node {self.node} "
                        f"(it has {len(node_gpus)} GPU(s): {has})",
                        "Assign GPUs of the node the Pod is bound to.",
                        device,
                    )
                )
            elif uuid in out:
                problems.append(Problem(key, "devices-format", f"{device!r} names GPU {uuid} a second time"))
            else:
                out.append(uuid)
        return tuple(out), problems

    def _with_faults(
        self, fraction: Fraction, gpus: tuple[str, ...], node_gpus: tuple[GpuInfo, ...]
    ) -> tuple[Fraction, tuple[str, ...]]:
        opts = self.options
        capacity = {g.uuid: g.memory_mib for g in node_gpus}
        if opts.has("whole-gpu-visibility"):
            gpus = tuple(g.uuid for g in node_gpus)
            fraction = dataclasses.replace(
                fraction, limit_mib=max(capacity.values(), default=fraction.limit_mib)
            )
        if opts.has("full-visibility"):
            gpus = tuple(g.uuid for g in node_gpus)
        if opts.has("no-hard-limit"):
            whole = max((capacity.get(g, 0) for g in gpus), default=0)
            fraction = dataclasses.replace(fraction, limit_mib=max(whole, fraction.request_mib))
        if opts.has("limit-from-request"):
            fraction = dataclasses.replace(fraction, limit_mib=fraction.request_mib)
        if opts.has("ignore-mode"):
            fraction = dataclasses.replace(fraction, mode="time-slicing")
        return fraction, gpus

    def _visible_with_faults(self, gpus: tuple[str, ...], node_gpus: tuple[GpuInfo, ...]) -> tuple[str, ...]:
        """Seeded fault ``wrong-visible-devices``: name the node's other GPUs (or the same ones
        in another order), so the environment disagrees with the fence."""
        others = tuple(g.uuid for g in node_gpus if g.uuid not in gpus)
        return others[: len(gpus)] if len(others) >= len(gpus) else tuple(reversed(gpus))

    def _mode_conflict(
        self, name: str, fraction: Fraction, gpus: Iterable[str]
    ) -> tuple[str, Tracked] | None:
        for gpu, other in self.registry.on_gpus(gpus):
            if other.client != name and other.mode != fraction.mode and self._guards(fraction.mode, other):
                return gpu, other
        return None

    def _guards(self, mode: str, other: Tracked | None) -> bool:
        """Whether the mode guard keeps a ``mode`` container off a GPU that ``other`` holds in the
        other mode (None: a client the registry does not know). Always, but for the seeded faults
        that break the guard, each in its own way."""
        opts = self.options
        if opts.has("no-mode-guard"):
            return False
        if opts.has("mode-guard-one-way") and mode == TIME_SLICING:
            return False  # seeded fault: only an sm-sharing newcomer is refused
        if opts.has("forget-modes-after-restart") and other is not None and other.adopted:
            return False  # seeded fault: what was adopted after the restart has no mode to guard
        return True

    def _ref_of(self, client: str) -> ContainerRef | None:
        tracked = self.registry.get(client)
        return tracked.ref if tracked is not None else None

    # ---- refusals

    def _as_read(self, pod: Mapping[str, Any], container: str) -> Mapping[str, Any]:
        """The Pod as this agent reads it: unchanged, but for the faults ``accept-bare-number`` and
        ``blank-mode-default``, which read some malformed values as valid ones."""
        bare, blank = self.options.has("accept-bare-number"), self.options.has("blank-mode-default")
        if not (bare or blank):
            return pod
        metadata = pod.get("metadata")
        if not isinstance(metadata, Mapping):
            return pod  # a broken document: the parser reports it, as without the fault
        metadata = dict(metadata)
        annotations = dict(_annotations(pod))
        # Seeded fault: a bare number is read as bytes and rounded up to a whole MiB (4096 -> 1 MiB)
        # instead of being refused as below the 1 MiB minimum, and the container is fenced with it.
        for suffix in (SUFFIX_REQUEST, SUFFIX_LIMIT) if bare else ():
            key = nvidia_key(container, suffix)
            value = annotations.get(key)
            if (
                isinstance(value, str)
                and value.isascii()
                and value.isdigit()
                and len(value) < 8
                and 0 < int(value) < MiB
            ):
                annotations[key] = f"{-(-int(value) // MiB)}Mi"
        # Seeded fault: a present but blank mode is read as an absent one (time-slicing), as an older
        # operator version did, instead of being refused as malformed (mode-word).
        mode_key = nvidia_key(container, SUFFIX_MODE)
        mode = annotations.get(mode_key)
        if blank and isinstance(mode, str) and not mode.strip():
            del annotations[mode_key]
        metadata["annotations"] = annotations
        return {**pod, "metadata": metadata}

    def _refusal_text(self, ref: ContainerRef, problems: list[Problem]) -> str:
        if self.options.has("vague-refusal"):
            # Seeded fault: the values are echoed back, but not which key holds them or what is wrong.
            shown = ", ".join("(none)" if p.value is None else repr(p.value) for p in problems)
            return f"GPU fraction of container {ref.container!r} refused: {shown}"
        details = "; ".join(str(p) for p in problems)
        fixes = "; ".join(dict.fromkeys(p.fix for p in problems if p.fix))
        text = f"GPU fraction contract of container {ref.container!r} is malformed: {details}"
        return text + (f"; fix: {fixes}" if fixes else "")

    def _malformed(self, ref: ContainerRef, problems: list[Problem]) -> Adjustment:
        self._release_previous(ref)
        text = self._refusal_text(ref, problems)
        if self.options.has("fail-open-silently"):
            return Adjustment(True)  # seeded fault: unfenced, and nobody is told
        # Seeded fault lenient-after-restart: once it re-adopted containers, the agent fails open.
        lenient = self.options.has("lenient-after-restart") and self._resumed
        if self.options.fails_open or lenient:
            self.metrics.inc("gpu_fractioning_agent_unfenced_containers_total")
            message = f"{text}; started WITHOUT GPU enforcement (the node agent runs fail-open)"
            self.kube.event(ref, k.WARNING, k.REASON_UNFENCED, message)
            self.log(f"{ref}: {message}")
            return Adjustment(True)
        self.metrics.inc("gpu_fractioning_agent_rejected_containers_total", reason="malformed")
        message = f"{text}; not started (the node agent fails closed)"
        self.kube.event(ref, k.WARNING, k.REASON_REJECTED, message)
        return Adjustment(False, reason=REASON_CONFIG_ERROR, message=message)

    def _refuse_mode(
        self, ref: ContainerRef, mode: str, gpu: str, other: ContainerRef | None, other_mode: str
    ) -> Adjustment:
        who = (
            f"container {other.container!r} of Pod {other.namespace}/{other.pod} ({other_mode})"
            if other is not None
            else f"a {other_mode} client"
        )
        message = (
            f"compute mode conflict on GPU {gpu} of node {self.node}: container {ref.container!r} of Pod "
            f"{ref.namespace}/{ref.pod} asks for {mode}, but the GPU already runs {who}; time-slicing and "
            "sm-sharing never share a GPU, so the scheduler broke the contract [mode-mixing]; not started"
        )
        self.metrics.inc("gpu_fractioning_agent_rejected_containers_total", reason="mode-conflict")
        self.kube.event(ref, k.WARNING, k.REASON_MODE_CONFLICT, message)
        self.log(f"{ref}: {message}")
        return Adjustment(False, reason=REASON_CONFIG_ERROR, message=message)

    def _backend_down(self, ref: ContainerRef, exc: BackendError) -> Adjustment:
        if self.options.has("start-while-unfenced"):
            # Seeded fault: a container the agent cannot fence starts anyway, with no enforcement.
            self.metrics.inc("gpu_fractioning_agent_unfenced_containers_total")
            self.log(
                f"{ref}: GPU backend unavailable ({exc}); started WITHOUT GPU enforcement (seeded fault)"
            )
            return Adjustment(True)
        message = (
            f"GPU backend {self.backend.name} unavailable ({exc}); container {ref.container!r} not started"
        )
        self.metrics.inc("gpu_fractioning_agent_rejected_containers_total", reason="backend-unavailable")
        self.kube.event(ref, k.WARNING, k.REASON_BACKEND_UNAVAILABLE, message)
        return Adjustment(False, reason=REASON_CREATE_ERROR, message=message)

    # ------------------------------------------------------------------ the NRI plugin

    def plugin_status(self, status: PluginStatus) -> None:
        """The NRI plugin's report (every second while it runs): registered with the runtime or not."""
        with self._plugin_lock:
            previous = self._plugin[0] if self._plugin is not None else None
            self._plugin = (status, self.clock())
        if previous is None or previous.registered != status.registered:
            state = "registered with" if status.registered else "NOT registered with"
            runtime = status.runtime or "the runtime"
            self.log(f"NRI plugin {status.plugin or '?'} (pid {status.pid}): {state} {runtime}")

    def plugin_health(self) -> tuple[bool, str]:
        """Whether the node's containers are fenced at all: (ok, why not). Always ok when no plugin is
        expected (``AgentOptions.nri_plugin_timeout_s`` None: the simulated kubelet calls the hook)."""
        timeout = self.options.nri_plugin_timeout_s
        if timeout is None:
            return True, ""
        with self._plugin_lock:
            last = self._plugin
        unfenced = "containerd starts this node's containers unfenced without it"
        if last is None:
            return False, f"the NRI plugin has not reported to the agent yet; {unfenced}"
        status, at = last
        age = self.clock() - at
        if age > timeout:
            return False, (
                f"the NRI plugin {status.plugin} has not reported for {age:.0f} s (more than "
                f"{timeout:g} s: not running, or its agent socket is unreachable); {unfenced}"
            )
        if not status.registered:
            return False, (
                f"the NRI plugin {status.plugin} runs but is not registered with the container runtime; "
                f"{unfenced}"
            )
        return True, f"NRI plugin {status.plugin} registered with {status.runtime or 'the runtime'}"

    # ------------------------------------------------------------------ StopContainer

    def stop_container(self, ref: ContainerRef, exit_code: int | None) -> None:
        with self._admit:
            tracked = self.registry.by_ref(ref.pod_uid, ref.container)
            if tracked is None:
                return
            self.registry.remove(tracked.client)
            if not self.options.has("leak-on-exit"):
                self._detach(tracked.client)

    def _release_previous(self, ref: ContainerRef) -> None:
        """A container starting again without a fraction (or unfenced) keeps nothing of its last run."""
        with self._admit:
            previous = self.registry.by_ref(ref.pod_uid, ref.container)
            if previous is not None:
                self.registry.remove(previous.client)
                self._detach(previous.client)

    def _detach(self, client: str, reason: str = "stopped") -> None:
        """Release a client; ``evicted`` reclaims it (the backend may kill what still runs in it)."""
        try:
            if reason == "evicted":
                self.backend.evict(client)
            else:
                self.backend.detach(client, reason)
        except BackendUnavailable as exc:
            self._orphans.add(client)
            self.log(f"could not release {client} now ({exc}); will when the backend is back")

    def forget_pod(self, pod_uid: str) -> None:
        """The Pod is gone from the API: release whatever its containers still hold."""
        with self._admit:
            for tracked in self.registry.by_pod(pod_uid):
                self.registry.remove(tracked.client)
                self._detach(tracked.client)
                self.log(f"{tracked.ref}: Pod deleted; released {tracked.client}")
        self.kube.forget_events(pod_uid)

    def prune(self, live_uids: set[str], listed_at: float) -> None:
        """After a full list: release containers of Pods the list lacks (deleted while nobody watched).

        Only those taken on before the list began: a container admitted since may belong to a Pod
        the list was too early to show.
        """
        with self._admit:
            for tracked in self.registry.all():
                if tracked.ref.pod_uid not in live_uids and tracked.since < listed_at:
                    self.registry.remove(tracked.client)
                    self._detach(tracked.client)
                    self.log(f"{tracked.ref}: Pod no longer exists; released {tracked.client}")

    # ------------------------------------------------------------------ recovery

    def adopt(self) -> int:
        """Rebuild the registry from what the backend holds (after a restart); returns how many.

        Raises ``BackendUnavailable``; the caller tries again when the backend is back.
        """
        if self.options.has("no-recovery"):
            return 0
        usage = self.backend.usage()
        count = 0
        with self._admit:
            for client in usage.clients:
                if self.registry.get(client.name) is None and self._adopt(client) is not None:
                    count += 1
        if count:
            self._resumed = True
            self.metrics.inc("gpu_fractioning_agent_adopted_containers_total", count)
            self.log(f"re-adopted {count} container(s) from the {self.backend.name} backend")
        return count

    def _adopt(self, client: ClientUsage) -> Tracked | None:
        if client.labels.get(LABEL_AGENT) != self.node or not client.gpus:
            return None  # attached by someone else: not ours to evict or release
        ref = ref_from_labels(client.labels)
        if ref is None:
            return None
        first = client.gpus[0]
        portion_text = client.labels.get(LABEL_PORTION)
        try:
            portion = float(portion_text) if portion_text else None
        except ValueError:
            portion = None
        fraction = Fraction(
            container=ref.container,
            request_mib=-(-first.guarantee_bytes // MiB),
            limit_mib=-(-first.hard_limit_bytes // MiB),
            mode="sm-sharing" if client.mode == "sm-sharing" else "time-slicing",
            devices=tuple(g.uuid for g in client.gpus),
            portion=portion,
        )
        tracked = Tracked(ref, client.name, fraction, fraction.devices, self.clock(), adopted=True)
        self.registry.put(tracked)
        return tracked

    def synchronize(self, running: list[RunningContainer]) -> None:
        try:
            self._synchronize(running)
        except BackendUnavailable as exc:
            self.log(f"Synchronize: backend unavailable ({exc}); will reconcile when it is back")

    def _synchronize(self, running: list[RunningContainer]) -> None:
        recover = not self.options.has("no-recovery")
        with self._admit:
            usage = self.backend.usage()
            present = {c.name: c for c in usage.clients}
            for item in running:
                ref = item.ref
                tracked = self.registry.by_ref(ref.pod_uid, ref.container)
                if tracked is None and recover:
                    client = present.get(client_name(ref))
                    if client is not None and client.labels.get(LABEL_UID) == ref.pod_uid:
                        tracked = self._adopt(client)
                        self._resumed = self._resumed or tracked is not None
                if tracked is None:
                    if recover:
                        self._fence_unknown(ref)
                    continue
                if tracked.client not in present:
                    self._fence_lost(tracked)
                elif item.pid > 0:  # NRI may not know a pid (0): nothing to track then
                    self.backend.track_process(tracked.client, item.pid)
            if not recover:
                return
            alive = {(r.ref.pod_uid, r.ref.container) for r in running}
            for tracked in self.registry.all():
                if (tracked.ref.pod_uid, tracked.ref.container) not in alive:
                    self.registry.remove(tracked.client)
                    self._detach(tracked.client)
                    self.log(
                        f"{tracked.ref}: not running any more (per Synchronize); released {tracked.client}"
                    )

    def _fence_unknown(self, ref: ContainerRef) -> None:
        """A running container the agent has no record of: fractional per its Pod? then its fence is lost."""
        try:
            pod = self.kube.read_pod(ref.namespace, ref.pod)
        except k.KubeError as exc:
            self.log(f"{ref}: cannot read its Pod to check its fence ({exc})")
            return
        if pod is None or k.pod_ref(pod).pod_uid != ref.pod_uid:
            return
        fraction = read_placement(self._as_read(pod, ref.container))[0].get(ref.container)
        if fraction is None:
            return  # not fractional (or malformed and started fail-open): nothing was fenced
        try:
            gpus, problems = self._resolve(ref.container, fraction, self.backend.gpus())
        except BackendUnavailable:
            return
        if problems:
            return
        self._fence_lost(Tracked(ref, client_name(ref), fraction, gpus, self.clock()))

    def _fence_lost(self, tracked: Tracked) -> None:
        """Re-attach a running container's client the backend lost, and say so on the Pod."""
        request = self._client_request(tracked.ref, tracked.client, tracked.fraction, tracked.gpus)
        try:
            self.backend.attach(request)
            held = "its limits, guarantee and mode are held for it again, but"
        except (ModeConflict, AttachRefused) as exc:
            held = f"re-attaching it failed ({exc}), and"
        self.registry.put(dataclasses.replace(tracked, fence_lost=True))
        message = (
            f"container {tracked.ref.container!r} runs without a valid GPU fence: the {self.backend.name} "
            f"backend had no client for it (was the device restarted?); {held} its process still holds the "
            "old client's credentials: restart the Pod to fence it again"
        )
        self.kube.event(tracked.ref, k.WARNING, k.REASON_FENCE_LOST, message)
        self.log(f"{tracked.ref}: {message}")

    def reconcile_backend(self) -> None:
        """The backend answers again: release what could not be released, re-fence what it lost."""
        with self._admit:
            usage = self.backend.usage()
            present = {c.name for c in usage.clients}
            for client in sorted(self._orphans):
                self.backend.detach(client)
                self._orphans.discard(client)
            for tracked in self.registry.all():
                if tracked.client not in present:
                    self._fence_lost(tracked)
            for held in usage.clients:
                ours = held.labels.get(LABEL_AGENT) == self.node
                if ours and self.registry.get(held.name) is None and not self.options.has("leak-on-exit"):
                    self.backend.detach(held.name)
                    self.log(f"released {held.name}: the backend held it, the agent no longer fences it")

"""The MPS backend on a machine without a GPU: NVML, the control daemon and /proc faked at their boundary."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from agent_pods import make_pod, placement

from enforcement.agent.environment import ENV_PINNED_LIMIT, ENV_PIPE_DIRECTORY, ENV_THREAD_PERCENTAGE
from enforcement.agent.evictor import Evictor
from enforcement.agent.handler import AgentCore
from enforcement.agent.kube import RecordingKube
from enforcement.agent.metrics import Metrics
from enforcement.agent.options import AgentOptions
from enforcement.backends import (
    AttachRefused,
    Backend,
    BackendUnavailable,
    ClientRequest,
    DeviceLimit,
    ModeConflict,
)
from enforcement.backends.mps import Completed, MpsBackend, NvmlGpu, NvmlProcess, PynvmlNvml

MIB = 1 << 20
GPU0, GPU1 = "GPU-aaaaaaaa-0000-0000-0000-000000000000", "GPU-bbbbbbbb-0000-0000-0000-000000000000"


@dataclass
class FakeNvml:
    total_mib: int = 1000
    procs: dict[int, list[NvmlProcess]] = field(default_factory=lambda: {0: [], 1: []})
    sm: dict[int, dict[int, float]] = field(default_factory=lambda: {0: {}, 1: {}})
    other_used: int = 0  # memory held by processes nobody attributes (another tenant, the driver)

    def gpus(self) -> tuple[NvmlGpu, ...]:
        return (
            NvmlGpu(0, GPU0, "Fake H200", self.total_mib * MIB),
            NvmlGpu(1, GPU1, "Fake H200", self.total_mib * MIB),
        )

    def memory(self, index: int) -> tuple[int, int, int]:
        used = sum(p.used_bytes for p in self.procs[index]) + (self.other_used if index == 0 else 0)
        total = self.total_mib * MIB
        return total, used, total - used

    def processes(self, index: int) -> tuple[NvmlProcess, ...]:
        return tuple(self.procs[index])

    def sm_utilization(self, index: int) -> Mapping[int, float]:
        return self.sm[index]


@dataclass
class FakeRunner:
    present: bool = True
    start_fails: str = ""
    running: set[str] = field(default_factory=set)
    calls: list[tuple[list[str], dict[str, str], str | None]] = field(default_factory=list)

    def which(self, name: str) -> str | None:
        return f"/usr/bin/{name}" if self.present else None

    def run(self, argv, env, stdin=None, timeout_s=10.0) -> Completed:
        self.calls.append((list(argv), dict(env), stdin))
        pipe = env["CUDA_MPS_PIPE_DIRECTORY"]
        if argv[1:] == ["-d"]:
            if self.start_fails:
                return Completed(1, "", self.start_fails)
            self.running.add(pipe)
            return Completed(0, "", "")
        if stdin == "quit\n":
            self.running.discard(pipe)
            return Completed(0, "", "")
        return (
            Completed(0, "", "")
            if pipe in self.running
            else Completed(1, "", "Cannot find MPS control daemon")
        )


@dataclass
class FakeProcs:
    parents: dict[int, int] = field(default_factory=dict)
    cgroups: dict[int, str] = field(default_factory=dict)
    dead: set[int] = field(default_factory=set)
    killed: list[int] = field(default_factory=list)

    def parent(self, pid: int) -> int | None:
        return self.parents.get(pid)

    def cgroup(self, pid: int) -> str:
        return self.cgroups.get(pid, "")

    def alive(self, pid: int) -> bool:
        return pid not in self.dead

    def kill(self, pid: int) -> None:
        self.killed.append(pid)
        self.dead.add(pid)


def backend(tmp_path: Path, runner: FakeRunner | None = None, nvml: FakeNvml | None = None, procs=None):
    b = MpsBackend(
        nvml or FakeNvml(), root=tmp_path / "mps", runner=runner or FakeRunner(), procs=procs or FakeProcs()
    )
    b.start()
    return b


def request(
    name: str, gpu: str = GPU0, guarantee: int = 100, hard: int = 200, mode: str = "time-slicing", uid="u"
):
    labels = {"namespace": "ns", "pod": name, "uid": uid, "container": "main", "gpuconf.io/node-agent": "n"}
    return ClientRequest(name, (DeviceLimit(gpu, hard, guarantee),), mode, None, labels)


def test_imports_and_says_plainly_when_pynvml_is_missing() -> None:
    try:
        import pynvml  # noqa: F401
    except ImportError:
        with pytest.raises(BackendUnavailable, match="pynvml is not importable"):
            PynvmlNvml()
    else:  # pragma: no cover - a GPU machine
        pytest.skip("pynvml is installed here")


def test_it_is_a_backend(tmp_path: Path) -> None:
    assert isinstance(backend(tmp_path), Backend)


def test_start_runs_one_control_daemon_per_mode_with_its_pipe_and_log_dirs(tmp_path: Path) -> None:
    runner = FakeRunner()
    b = backend(tmp_path, runner)
    starts = [env for argv, env, _ in runner.calls if argv[1:] == ["-d"]]
    assert sorted(e["CUDA_MPS_PIPE_DIRECTORY"] for e in starts) == [
        str(tmp_path / "mps" / "default"),
        str(tmp_path / "mps" / "sm-sharing"),
    ]
    assert all(e["CUDA_MPS_LOG_DIRECTORY"].startswith(str(tmp_path / "mps" / "log")) for e in starts)
    health = b.health()
    assert health.ok and health.reason == "MPSReady"
    b.shutdown_daemons()
    assert runner.running == set()


def test_a_running_daemon_is_adopted_not_restarted_and_close_leaves_it_running(tmp_path: Path) -> None:
    runner = FakeRunner(running={str(tmp_path / "mps" / "default"), str(tmp_path / "mps" / "sm-sharing")})
    b = backend(tmp_path, runner)
    assert not [c for c in runner.calls if c[0][1:] == ["-d"]]
    b.close()
    b.shutdown_daemons()  # it did not start them: it does not stop them either
    assert len(runner.running) == 2


def test_no_binary_is_said_plainly_and_the_nvml_evictor_still_runs(tmp_path: Path) -> None:
    nvml = FakeNvml()
    procs = FakeProcs()
    b = backend(tmp_path, FakeRunner(present=False), nvml, procs)
    health = b.health()
    assert not health.ok and health.reason == "MPSControlDaemonUnavailable"
    assert "nvidia-cuda-mps-control is not on PATH" in health.message and "evictor" in health.message
    b.attach(request("over", hard=200))
    b.track_process("over", 10)
    nvml.procs[0] = [NvmlProcess(10, 900 * MIB)]  # nobody applied the limit: 900 MiB against 200
    (p0, _p1) = b.pressure()
    assert [c.client for c in p0.over_limit] == ["over"]


def test_a_daemon_that_cannot_start_names_why(tmp_path: Path) -> None:
    b = backend(tmp_path, FakeRunner(start_fails="permission denied"))
    health = b.health()
    assert not health.ok and "permission denied" in health.message


def test_attach_gives_each_mode_its_pipe_and_refuses_mixing_and_unknown_gpus(tmp_path: Path) -> None:
    b = backend(tmp_path)
    ts = b.attach(request("a"))
    assert ts.env["CUDA_MPS_PIPE_DIRECTORY"] == str(tmp_path / "mps" / "default")
    sm = b.attach(request("b", gpu=GPU1, mode="sm-sharing"))
    assert sm.env["CUDA_MPS_PIPE_DIRECTORY"] == str(tmp_path / "mps" / "sm-sharing")
    with pytest.raises(ModeConflict) as err:
        b.attach(request("c", mode="sm-sharing"))
    assert err.value.other_client == "a" and err.value.other_mode == "time-slicing"
    with pytest.raises(AttachRefused, match="no GPU GPU-nope"):
        b.attach(request("d", gpu="GPU-nope"))


def test_usage_attributes_processes_by_pid_descendant_and_cgroup(tmp_path: Path) -> None:
    nvml = FakeNvml()
    procs = FakeProcs(parents={21: 20, 20: 1}, cgroups={30: "0::/kubepods/burstable/podu_b/cri-containerd-x"})
    b = backend(tmp_path, nvml=nvml, procs=procs)
    b.attach(request("a", uid="u-a"))
    b.attach(request("b", uid="u-b"))
    b.track_process("a", 20)
    nvml.procs[0] = [NvmlProcess(21, 150 * MIB), NvmlProcess(30, 40 * MIB), NvmlProcess(99, 500 * MIB)]
    nvml.sm[0] = {21: 60.0}
    usage = b.usage()
    by = {c.name: c.gpus[0] for c in usage.clients}
    assert by["a"].used_bytes == 150 * MIB and by["a"].sm_percent == 60.0
    assert by["b"].used_bytes == 40 * MIB and by["b"].sm_percent is None
    assert by["a"].hard_limit_bytes == 200 * MIB and by["a"].guarantee_bytes == 100 * MIB
    assert usage.gpus[0].used_bytes == 690 * MIB and usage.gpus[0].guaranteed_bytes == 200 * MIB


def test_pressure_keeps_free_memory_at_least_the_outstanding_guarantees(tmp_path: Path) -> None:
    nvml = FakeNvml(total_mib=1000)
    b = backend(tmp_path, nvml=nvml)
    b.attach(request("g", guarantee=500, hard=500))
    b.attach(request("small", guarantee=100, hard=900))
    b.attach(request("big", guarantee=100, hard=900))
    b.track_process("g", 1)
    b.track_process("small", 2)
    b.track_process("big", 3)
    nvml.procs[0] = [NvmlProcess(2, 150 * MIB), NvmlProcess(3, 300 * MIB)]
    (p0, p1) = b.pressure()
    assert not p0.under_pressure and p0.shortfall_bytes == 0  # free 550 >= owed 500
    nvml.procs[0] = [NvmlProcess(2, 200 * MIB), NvmlProcess(3, 400 * MIB)]
    (p0, p1) = b.pressure()
    assert p0.under_pressure and p0.shortfall_bytes == 100 * MIB  # free 400 < owed 500
    assert [c.client for c in p0.candidates] == ["big", "small"] and p0.waiting == ("g",)
    assert not p1.under_pressure


def test_evict_kills_the_clients_processes_and_forgets_it(tmp_path: Path) -> None:
    nvml = FakeNvml()
    procs = FakeProcs(parents={41: 40})
    b = backend(tmp_path, nvml=nvml, procs=procs)
    b.attach(request("a"))
    b.track_process("a", 40)
    nvml.procs[0] = [NvmlProcess(41, 10 * MIB)]
    b.evict("a")
    assert sorted(procs.killed) == [40, 41]
    assert b.usage().clients == ()


def test_the_client_table_survives_a_restart(tmp_path: Path) -> None:
    b = backend(tmp_path)
    b.attach(request("a", guarantee=64, hard=128))
    b.track_process("a", 77)
    again = backend(tmp_path)
    (client,) = again.usage().clients
    assert client.name == "a" and client.pids == (77,) and client.gpus[0].hard_limit_bytes == 128 * MIB
    again.detach("a")
    assert backend(tmp_path).usage().clients == ()


def test_the_agent_on_mps_env_eviction_and_recovery(tmp_path: Path) -> None:
    nvml = FakeNvml(total_mib=1000)
    procs = FakeProcs()
    b = backend(tmp_path, nvml=nvml, procs=procs)
    kube = RecordingKube()
    core = AgentCore(b, kube, AgentOptions(node="n"), metrics=Metrics(), log=lambda _m: None)
    g = make_pod("g", placement("main", 500, 500, devices=("0",)))
    borrower = make_pod("b", placement("main", 100, 900, devices=(GPU0,), mode="time-slicing"))
    sm = make_pod("s", placement("main", 100, 100, devices=("1",), mode="sm-sharing", portion=0.3))
    envs = {}
    for pod in (g, borrower, sm):
        adj = core.create_container(pod, "main")
        assert adj.allowed, adj.message
        envs[pod["metadata"]["name"]] = adj.env
    assert envs["b"][ENV_PINNED_LIMIT] == "0=900M"
    assert envs["b"][ENV_PIPE_DIRECTORY] == str(tmp_path / "mps" / "default")
    assert envs["s"][ENV_PIPE_DIRECTORY] == str(tmp_path / "mps" / "sm-sharing")
    assert envs["s"][ENV_THREAD_PERCENTAGE] == "30"
    b.track_process("ns/b/main", 500)
    nvml.procs[0] = [NvmlProcess(500, 800 * MIB)]  # free 200 < the 500 owed to g
    # a restarted agent finds its containers in the state file and evicts the borrower
    b2 = backend(tmp_path, nvml=nvml, procs=procs)
    core2 = AgentCore(b2, kube, AgentOptions(node="n"), metrics=Metrics(), log=lambda _m: None)
    assert core2.adopt() == 3
    assert [v.client for v in Evictor(core2).run_once()] == ["ns/b/main"]
    assert [ref.pod for ref, _at in kube.evictions] == ["b"] and procs.killed == [500]

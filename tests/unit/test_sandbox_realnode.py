"""The real node's parts that need no container: the kubelet's build and cache, its configuration."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from fixtures.sandbox import binaries
from fixtures.sandbox.errors import SandboxError
from fixtures.sandbox.realnode import build, host, node


def _module_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    module = tmp_path / "upstream"
    shutil.copytree(binaries.UPSTREAM_MODULE, module)
    monkeypatch.setattr(binaries, "UPSTREAM_MODULE", module)
    monkeypatch.setattr(build, "UPSTREAM_MODULE", module)
    monkeypatch.setattr(build, "KUBELET_SUM", module / "kubelet.sum")
    return module


def test_the_kubelet_has_a_cache_of_its_own_and_leaves_the_control_planes_key_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(binaries.ENV_CACHE_DIR, str(tmp_path / "cache"))
    module = _module_copy(tmp_path, monkeypatch)
    control_plane, kubelet = binaries.build_key(), build.kubelet_key()
    assert kubelet.startswith(f"kubelet-{binaries.KUBERNETES_VERSION}-")
    assert build.kubelet_dir() == tmp_path / "cache" / "bin" / kubelet
    assert binaries.cached_dir().parent == build.kubelet_dir().parent and control_plane != kubelet
    (module / "kubelet.sum").write_text((module / "kubelet.sum").read_text() + "example.com/x v1 h1:x=\n")
    assert binaries.build_key() == control_plane, "the kubelet's checksums must not rebuild the control plane"
    assert build.kubelet_key() != kubelet
    (module / "go.mod").write_text((module / "go.mod").read_text() + "\n")
    assert build.kubelet_key() != kubelet and binaries.build_key() != control_plane


def test_the_kubelets_checksums_are_only_what_go_sum_lacks() -> None:
    extra = build.KUBELET_SUM.read_text().splitlines()
    sums = set((binaries.UPSTREAM_MODULE / "go.sum").read_text().splitlines())
    assert extra and all(len(line.split()) == 3 and line.split()[2].startswith("h1:") for line in extra)
    assert not sums & set(extra)
    # Not in tools.go: `go mod tidy` would move these lines into go.sum, and rebuild the control plane.
    assert "cmd/kubelet" not in (binaries.UPSTREAM_MODULE / "tools.go").read_text()


def test_the_build_reads_the_control_planes_go_mod_read_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`go build -modfile`: go.mod as it is, go.sum plus kubelet.sum beside it, -mod=readonly."""
    seen = tmp_path / "seen"
    fake_go = tmp_path / "bin" / "go"
    fake_go.parent.mkdir()
    fake_go.write_text(
        "#!/bin/sh\n"
        f'echo "$GOFLAGS" > {seen}.flags\n'
        f'for a in "$@"; do echo "$a"; done > {seen}.args\n'
        'for a in "$@"; do case "$a" in -modfile=*) m="${a#-modfile=}";; esac; done\n'
        f'cp "$m" {seen}.mod; cp "${{m%.mod}}.sum" {seen}.sum\n'
        'out=""; prev=""; for a in "$@"; do [ "$prev" = "-o" ] && out="$a"; prev="$a"; done\n'
        'echo k8s.io/kubernetes/cmd/kubelet; printf "#!/bin/sh\\n" > "$out"; chmod +x "$out"\n'
    )
    os.chmod(fake_go, 0o755)
    monkeypatch.delenv(binaries.ENV_BIN_DIR, raising=False)
    monkeypatch.setenv(binaries.ENV_CACHE_DIR, str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", f"{fake_go.parent}:{os.environ['PATH']}")
    found = build.ensure_kubelet(log=lambda m: None)
    assert found.source == "built" and found.path == build.kubelet_dir() / "kubelet"
    assert "-mod=readonly" in Path(f"{seen}.flags").read_text()
    args = Path(f"{seen}.args").read_text().splitlines()
    assert args[-1] == build.KUBELET_PACKAGE and "-trimpath" in args
    assert f"-X k8s.io/component-base/version.gitVersion={binaries.KUBERNETES_VERSION}" in " ".join(args)
    module = binaries.UPSTREAM_MODULE
    assert Path(f"{seen}.mod").read_text() == (module / "go.mod").read_text()
    assert set(Path(f"{seen}.sum").read_text().splitlines()) == set(
        (module / "go.sum").read_text().splitlines() + build.KUBELET_SUM.read_text().splitlines()
    )
    assert sorted(p.name for p in build.kubelet_dir().iterdir()) == ["build.json", "kubelet"]
    assert build.ensure_kubelet(build=False).source == "cache"


def test_a_failed_build_says_why_and_caches_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_go = tmp_path / "bin" / "go"
    fake_go.parent.mkdir()
    fake_go.write_text("#!/bin/sh\necho 'missing go.sum entry for module providing package x' >&2\nexit 1\n")
    os.chmod(fake_go, 0o755)
    monkeypatch.delenv(binaries.ENV_BIN_DIR, raising=False)
    monkeypatch.setenv(binaries.ENV_CACHE_DIR, str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(fake_go.parent))
    with pytest.raises(SandboxError, match="not built yet.*sandbox build --kubelet"):
        build.ensure_kubelet(build=False)
    with pytest.raises(
        SandboxError, match=r"(?s)`go build` of the kubelet failed \(exit 1\).*missing go.sum"
    ):
        build.ensure_kubelet(log=lambda m: None)
    assert not build.kubelet_dir().exists()


def test_a_kubelet_in_the_binaries_folder_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "kubelet").write_text("#!/bin/sh\n")
    os.chmod(tmp_path / "kubelet", 0o755)
    monkeypatch.setenv(binaries.ENV_BIN_DIR, str(tmp_path))
    assert build.ensure_kubelet(build=False) == build.KubeletBinary(tmp_path / "kubelet", "env")


def test_the_kubelet_configuration() -> None:
    config = node.kubelet_config(
        containerd_socket=Path("/tmp/n/c/containerd.sock"),
        folder=Path("/tmp/n"),
        cgroup_root="/gpuconf-a-1",
        address="192.0.2.2",
        port=20250,
        healthz_port=20248,
        ca_file=Path("/sb/pki/ca.crt"),
    )
    assert config["containerRuntimeEndpoint"] == "unix:///tmp/n/c/containerd.sock"
    assert config["failCgroupV1"] is False and config["cgroupDriver"] == "cgroupfs"
    assert config["cgroupRoot"] == "/gpuconf-a-1"
    assert config["authentication"]["anonymous"] == {"enabled": False}
    assert config["authentication"]["x509"] == {"clientCAFile": "/sb/pki/ca.crt"}
    assert config["authorization"] == {"mode": "Webhook"}
    assert config["readOnlyPort"] == 0 and (config["address"], config["port"]) == ("192.0.2.2", 20250)
    assert config["registerWithTaints"] == [{"key": node.TAINT_KEY, "value": "true", "effect": "NoSchedule"}]
    # Nothing of the machine's own kubelet paths: everything under the node's folder.
    assert config["podLogsDir"].startswith("/tmp/n/") and config["volumePluginDir"].startswith("/tmp/n/")
    assert node.node_user("gpu-r-0") == "system:node:gpu-r-0" and node.NODE_GROUP == "system:nodes"


def test_the_placeholder_pod_network_names_a_plugin_that_does_not_exist() -> None:
    config = node.placeholder_cni_config()
    assert [p["type"] for p in config["plugins"]] == [node.NO_POD_NETWORK_PLUGIN]
    assert shutil.which(node.NO_POD_NETWORK_PLUGIN) is None


def test_mounts_under_a_folder_deepest_first(monkeypatch: pytest.MonkeyPatch) -> None:
    lines = [
        "1 0 8:1 / / rw - ext4 /dev/sda1 rw",
        "2 1 0:5 / /tmp/gcn-a/kubelet/pods/u/volumes/x rw - tmpfs tmpfs rw",
        "3 1 0:6 / /tmp/gcn-a/c/state/shm rw - tmpfs shm rw",
        r"4 1 0:7 / /tmp/gcn-a/with\040space rw - tmpfs tmpfs rw",
        "5 1 0:8 / /tmp/gcn-ab rw - tmpfs tmpfs rw",
        "6 1 0:9 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory",
        "7 1 0:10 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw",
    ]
    monkeypatch.setattr(host, "_mountinfo", lambda: [host._parse_mount(line) for line in lines])
    assert host.mounts_under(Path("/tmp/gcn-a")) == [
        Path("/tmp/gcn-a/kubelet/pods/u/volumes/x"),
        Path("/tmp/gcn-a/c/state/shm"),
        Path("/tmp/gcn-a/with space"),
    ]
    assert [(str(p), t) for p, t, _ in host.cgroup_hierarchies()] == [
        ("/sys/fs/cgroup/memory", "cgroup"),
        ("/sys/fs/cgroup/unified", "cgroup2"),
    ]


def test_a_recorded_node_is_stopped_by_pid_and_start_time(tmp_path: Path) -> None:
    """After a crash: the node's processes stop only when pid and kernel start time are the recorded
    ones (a reused pid is someone else's), and its folder goes."""
    import json
    import subprocess

    from fixtures.sandbox import processes

    ours = subprocess.Popen(["sleep", "60"], start_new_session=True)
    theirs = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        folder = tmp_path / "gcn-x"
        (folder / "kubelet").mkdir(parents=True)
        records = tmp_path / "state" / node.RECORDS
        records.mkdir(parents=True)
        started = {
            "kubelet": [ours.pid, processes.start_ticks(ours.pid)],
            "containerd": [theirs.pid, (processes.start_ticks(theirs.pid) or 0) + 1],
        }
        body = {
            "name": "n",
            "folder": str(folder),
            "cgroup": "gpuconf-unit-test-absent",
            "processes": started,
        }
        (records / "n.json").write_text(json.dumps(body))
        stopped = node.stop_recorded(tmp_path / "state", log=lambda m: None)
        assert stopped == [f"kubelet of real node n (pid {ours.pid})"]
        assert ours.wait(5) is not None and theirs.poll() is None
        assert not folder.exists() and not records.exists()
    finally:
        for proc in (ours, theirs):
            proc.kill()
            proc.wait()


def test_the_sandboxs_down_stops_the_real_nodes_it_finds_recorded(tmp_path: Path) -> None:
    import json
    import subprocess

    from fixtures.sandbox import processes
    from fixtures.sandbox.controlplane import Sandbox, SandboxConfig

    kubelet = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        state = tmp_path / "sandbox"
        (state / node.RECORDS).mkdir(parents=True)
        (state / "state.json").write_text(json.dumps({"version": 1, "running": True, "processes": {}}))
        body = {
            "name": "n",
            "folder": str(tmp_path / "gcn-y"),
            "cgroup": "gpuconf-unit-test-absent",
            "processes": {"kubelet": [kubelet.pid, processes.start_ticks(kubelet.pid)]},
        }
        (state / node.RECORDS / "n.json").write_text(json.dumps(body))
        stopped = Sandbox(SandboxConfig(state_dir=state), sources=()).down()
        assert stopped == [f"kubelet of real node n (pid {kubelet.pid})"]
        assert kubelet.wait(5) is not None
        assert not (state / node.RECORDS).exists()
    finally:
        kubelet.kill()
        kubelet.wait()

"""Where the upstream binaries come from, and the errors when they cannot be had."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fixtures.sandbox import binaries
from fixtures.sandbox.errors import SandboxError


def test_env_dir_must_hold_every_binary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "etcd").write_text("#!/bin/sh\n")
    os.chmod(tmp_path / "etcd", 0o755)
    monkeypatch.setenv(binaries.ENV_BIN_DIR, str(tmp_path))
    with pytest.raises(
        SandboxError, match="lacks executable kube-apiserver, kube-controller-manager, kube-scheduler"
    ):
        binaries.ensure_binaries()
    for name in binaries.BINARIES:
        (tmp_path / name).write_text("#!/bin/sh\n")
        os.chmod(tmp_path / name, 0o755)
    found = binaries.ensure_binaries()
    assert found.source == "env"
    assert found.path("kube-apiserver") == tmp_path / "kube-apiserver"


def test_cache_is_per_user_outside_the_checkout(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(binaries.ENV_CACHE_DIR, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert binaries.cached_dir().parent == tmp_path / "gpuconf" / "bin"
    key = binaries.build_key()
    assert key.startswith(f"k8s-{binaries.KUBERNETES_VERSION}-etcd-{binaries.ETCD_VERSION}-")
    assert key == binaries.build_key()


def test_pinned_versions_match_the_go_module() -> None:
    gomod = (binaries.UPSTREAM_MODULE / "go.mod").read_text()
    assert f"k8s.io/kubernetes {binaries.KUBERNETES_VERSION}" in gomod
    assert f"go.etcd.io/etcd/server/v3 {binaries.ETCD_VERSION}" in gomod
    minor = binaries.KUBERNETES_VERSION.split(".")[1]
    staging = [line.split() for line in gomod.splitlines() if "=>" in line]
    assert len(staging) >= 30
    assert all(parts[-1] == f"v0.{minor}.{binaries.KUBERNETES_VERSION.split('.')[2]}" for parts in staging)


def test_missing_go_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(binaries.ENV_BIN_DIR, raising=False)
    monkeypatch.setenv(binaries.ENV_CACHE_DIR, str(tmp_path))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(binaries.os, "access", lambda p, mode: False)
    with pytest.raises(SandboxError, match=r"the Go toolchain is not installed \(no `go` on PATH\)"):
        binaries.ensure_binaries()


def test_no_build_when_not_allowed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(binaries.ENV_BIN_DIR, raising=False)
    monkeypatch.setenv(binaries.ENV_CACHE_DIR, str(tmp_path))
    with pytest.raises(SandboxError, match="not built yet"):
        binaries.ensure_binaries(build=False)


def test_failed_build_names_the_package_and_shows_the_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake_go = tmp_path / "bin" / "go"
    fake_go.parent.mkdir()
    fake_go.write_text(
        "#!/bin/sh\necho 'go: k8s.io/kubernetes@v1.36.3: reading module: 410 Gone' >&2\nexit 1\n"
    )
    os.chmod(fake_go, 0o755)
    monkeypatch.delenv(binaries.ENV_BIN_DIR, raising=False)
    monkeypatch.setenv(binaries.ENV_CACHE_DIR, str(tmp_path / "cache"))
    monkeypatch.setenv("PATH", str(fake_go.parent))
    with pytest.raises(SandboxError) as err:
        binaries.ensure_binaries(log=lambda m: None)
    assert (
        "`go build` of etcd, kube-apiserver, kube-controller-manager, kube-scheduler failed (exit 1)"
        in str(err.value)
    )
    assert "410 Gone" in str(err.value)
    assert not binaries.cached_dir().exists(), "a failed build must not look like a cache hit"

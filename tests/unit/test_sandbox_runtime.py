"""The NRI test's real node runtime: what is built, where it is cached, the image, containerd's config."""

from __future__ import annotations

import json
import os
import tarfile
from pathlib import Path

import pytest

from fixtures.sandbox import runtime
from fixtures.sandbox.errors import SandboxError


def test_pinned_versions_match_the_go_modules() -> None:
    gomod = (runtime.RUNTIME_MODULE / "go.mod").read_text()
    assert f"github.com/containerd/containerd/v2 {runtime.CONTAINERD_VERSION}" in gomod
    assert f"sigs.k8s.io/cri-tools {runtime.CRICTL_VERSION}" in gomod
    plugin = (runtime.PLUGIN_MODULE / "go.mod").read_text()
    assert f"github.com/containerd/nri {runtime.NRI_VERSION}" in plugin
    # The plugin speaks the NRI version containerd was built with.
    assert f"github.com/containerd/nri {runtime.NRI_VERSION}" in gomod
    tools = (runtime.RUNTIME_MODULE / "tools.go").read_text()
    assert all(package in tools for package in runtime._RUNTIME_PACKAGES.values())


def test_cached_per_user_beside_the_kubernetes_binaries_and_keyed_by_sources(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("GPUCONF_CACHE_DIR", str(tmp_path))
    assert runtime.runtime_dir().parent == runtime.plugin_dir().parent == tmp_path / "bin"
    assert runtime.runtime_key().startswith(f"containerd-{runtime.CONTAINERD_VERSION}-crictl-")
    assert runtime.plugin_key().startswith(f"nri-plugin-{runtime.NRI_VERSION}-")
    assert runtime.runtime_key() == runtime.runtime_key() != runtime.plugin_key()


def test_a_cache_hit_builds_nothing_and_a_miss_without_build_says_how(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("GPUCONF_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(runtime, "find_runc", lambda: Path("/usr/sbin/runc"))
    with pytest.raises(SandboxError, match="gpuconf sandbox build --runtime"):
        runtime.ensure_runtime(build=False)
    for directory, names in (
        (runtime.runtime_dir(), runtime.RUNTIME_BINARIES),
        (runtime.plugin_dir(), (runtime.PLUGIN_BINARY,)),
    ):
        directory.mkdir(parents=True)
        (directory / "build.json").write_text(json.dumps({"seconds": 12.5}))
        for name in names:
            (directory / name).write_text("#!/bin/sh\n")
            os.chmod(directory / name, 0o755)
    found = runtime.ensure_runtime(build=False)
    assert found.source == "cache" and found.plugin.name == runtime.PLUGIN_BINARY
    assert found.seconds == {"containerd+crictl": 12.5, "nri-plugin": 12.5}


def test_no_runc_is_said_with_the_package_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime, "find_runc", lambda: None)
    with pytest.raises(SandboxError, match="apt-get install runc"):
        runtime.ensure_runtime(build=False)


def test_the_busybox_image_is_an_oci_archive_named_for_ctr(tmp_path: Path) -> None:
    fake = tmp_path / "busybox"
    fake.write_bytes(b"\x7fELF not really")
    archive = runtime.busybox_oci_archive(tmp_path / "image.tar", busybox=fake)
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        index = json.loads(tar.extractfile("index.json").read())  # type: ignore[union-attr]
    assert "oci-layout" in names and all(
        n.startswith(("blobs/sha256/", "oci-layout", "index.json")) for n in names
    )
    (manifest,) = index["manifests"]
    assert manifest["annotations"]["io.containerd.image.name"] == runtime.IMAGE
    assert f"blobs/sha256/{manifest['digest'].split(':')[1]}" in names
    with pytest.raises(SandboxError, match="busybox-static"):
        runtime.busybox_oci_archive(tmp_path / "x.tar", busybox=tmp_path / "none")


def test_containerd_writes_nothing_outside_its_folder(tmp_path: Path) -> None:
    root = tmp_path / "ctd"
    config = runtime.containerd_config(root, Path("/usr/sbin/runc"))
    assert "/run/containerd" not in config and "/var/lib/containerd" not in config
    assert "/var/run/nri" not in config and "/opt/" not in config and "/etc/" not in config
    for key in ("root", "state", "temp"):
        assert f'{key} = "{root}/' in config
    assert f'socket_path = "{root}/nri.sock"' in config and f'socket_dir = "{root}/s"' in config
    assert f'Root = "{root}/runc"' in config and "imports = []" in config
    assert '[plugins."io.containerd.nri.v1.nri"]' in config and f'sandbox = "{runtime.IMAGE}"' in config
    with pytest.raises(ValueError, match="too long"):
        runtime.Containerd(None, Path("/tmp") / ("x" * 40))  # type: ignore[arg-type]


def test_the_one_reason_containers_cannot_run(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    reason = runtime.cannot_run_containers()
    assert reason is not None and "need root" in reason and "1000" in reason

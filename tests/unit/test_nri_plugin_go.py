"""The NRI plugin's own Go tests (enforcement/nri/plugin_test.go): its translation and its one decision.

`go vet` and `go test` in the plugin's module; Go caches both, so only the first run compiles.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from fixtures.sandbox.runtime import PLUGIN_MODULE


def go() -> str | None:
    return shutil.which("go") or next((p for p in ("/usr/local/go/bin/go",) if os.access(p, os.X_OK)), None)


def test_the_plugins_go_tests_pass() -> None:
    tool = go()
    if tool is None:
        pytest.skip("the Go toolchain is not installed (no `go` on PATH); the NRI plugin is Go")
    env = dict(os.environ, CGO_ENABLED="0", GOFLAGS="-buildvcs=false -mod=readonly")
    for args in (["vet", "./..."], ["test", "./..."]):
        proc = subprocess.run(
            [tool, *args], cwd=PLUGIN_MODULE, env=env, capture_output=True, text=True, timeout=600
        )
        assert proc.returncode == 0, f"go {' '.join(args)}:\n{proc.stdout}\n{proc.stderr}"

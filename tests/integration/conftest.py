"""The sandbox the integration tests share: started once per pytest run, stopped at its end.

It lives in a fixed per-user folder (not a pytest tmp dir) so that a run killed before its
teardown leaves a record: the next run stops those processes by pid before starting
afresh. Ports are picked free at start, so a user's own sandbox on the default ports is
left alone.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from fixtures.sandbox.binaries import cache_root
from fixtures.sandbox.controlplane import Ports, Sandbox, SandboxConfig


def sandbox_state_dir(name: str = "session") -> Path:
    base = os.environ.get("GPUCONF_TEST_SANDBOX_DIR") or str(cache_root() / "test-sandbox")
    return Path(base) / name


@pytest.fixture(scope="session")
def sandbox() -> Iterator[Sandbox]:
    box = Sandbox(SandboxConfig(state_dir=sandbox_state_dir(), ports=Ports.free()))
    box.down()  # whatever a killed earlier run left behind
    box.up(log=lambda m: print(m, flush=True))
    try:
        yield box
    finally:
        box.down()


@pytest.fixture
def namespace(sandbox: Sandbox) -> Iterator[str]:
    """A fresh namespace, deleted afterwards (the namespace controller finishes the job)."""
    from kubernetes.client.rest import ApiException

    core = sandbox.core_v1()
    name = f"t-{uuid.uuid4().hex[:10]}"
    core.create_namespace({"metadata": {"name": name, "labels": {"gpuconf.io/test": "true"}}})
    yield name
    try:
        core.delete_namespace(name)
    except ApiException as exc:
        if exc.status != 404:
            raise

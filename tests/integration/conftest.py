"""The sandbox the integration tests share: started once per pytest run, stopped at its end.

It lives in a per-user folder named after the pytest process (not a pytest tmp dir, which
is pruned) so that a run killed before its teardown leaves a record: the next run finds
folders whose process is gone and stops their sandboxes by pid. Runs that are alive are
left alone, so two pytest runs on one machine do not stop each other's sandbox. Ports are
picked free at start, so a user's own sandbox on the default ports is untouched too.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from fixtures.sandbox.binaries import cache_root
from fixtures.sandbox.controlplane import Ports, Sandbox, SandboxConfig

HEAVIEST_FIRST = (
    "test_mutation.py",
    "test_suite_robustness.py",
    "test_emulated_implementations.py",
    "test_fidelity.py",
    "test_vendor_scheduler.py",
    "test_suite_scheduler.py",
)
"""The modules that take longest (in that order; `pytest --durations` on 2 cores: from about 14 down
to 3 minutes), run before the rest. With xdist's ``--dist loadfile`` (``make test``) each worker then
starts on a long module and the short ones fill the gaps, instead of one long module starting last
and running alone; serially the order changes nothing but the order."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    def rank(item: pytest.Item) -> int:
        name = item.path.name
        return HEAVIEST_FIRST.index(name) if name in HEAVIEST_FIRST else len(HEAVIEST_FIRST)

    items.sort(key=rank)  # stable: within a module, and among the rest, the collection order stays


def sandbox_root() -> Path:
    return Path(os.environ.get("GPUCONF_TEST_SANDBOX_DIR") or str(cache_root() / "test-sandbox"))


def clean_abandoned_sandboxes(root: Path) -> None:
    """Stop the sandboxes of earlier pytest runs that died before their teardown."""
    if not root.is_dir():
        return
    for folder in root.iterdir():
        owner = folder.name.removeprefix("run-")
        if folder.is_dir() and owner.isdigit() and not Path(f"/proc/{owner}").exists():
            Sandbox(SandboxConfig(state_dir=folder)).down()
            shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def sandbox() -> Iterator[Sandbox]:
    root = sandbox_root()
    clean_abandoned_sandboxes(root)
    box = Sandbox(SandboxConfig(state_dir=root / f"run-{os.getpid()}", ports=Ports.free()))
    box.down()
    box.up(log=lambda m: print(m, flush=True))
    try:
        yield box
    finally:
        box.down()


@pytest.fixture
def namespace(sandbox: Sandbox) -> Iterator[str]:
    """A fresh namespace, deleted afterwards (the namespace controller finishes the job).

    Its Pods are deleted first with no grace period: this sandbox has no kubelet, and a bound Pod's
    graceful deletion waits for a kubelet to confirm it, so the namespace controller's own deletion
    left them Terminating for good, holding GPU fractions that later tests (on empty GPUs) found."""
    from kubernetes.client.rest import ApiException

    core = sandbox.core_v1()
    name = f"t-{uuid.uuid4().hex[:10]}"
    core.create_namespace({"metadata": {"name": name, "labels": {"gpuconf.io/test": "true"}}})
    yield name
    try:
        core.delete_collection_namespaced_pod(name, grace_period_seconds=0)
        core.delete_namespace(name)
    except ApiException as exc:
        if exc.status != 404:
            raise

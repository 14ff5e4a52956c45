"""make setup's system packages: installed where this can install them, named at once where not."""

from __future__ import annotations

import pytest

from fixtures.sandbox import system
from fixtures.sandbox.errors import SandboxError


class Machine:
    """Files that appear once their package is installed; every command run is recorded."""

    def __init__(self, *present: str, install_works: bool = True, update_rc: int = 0) -> None:
        self.present = set(present)
        self.install_works = install_works
        self.update_rc = update_rc
        self.commands: list[list[str]] = []

    def need(self, package: str) -> system.SystemNeed:
        return system.SystemNeed(f"the {package} file", package, lambda: package in self.present)

    def run(self, argv: list[str]) -> int:
        self.commands.append(argv)
        if argv[:2] == ["apt-get", "update"]:
            return self.update_rc
        if self.install_works:
            self.present.update(a for a in argv[2:] if not a.startswith("-"))
        return 0


def test_nothing_missing_runs_nothing() -> None:
    machine = Machine("runc", "busybox-static")
    needs = [machine.need("runc"), machine.need("busybox-static")]
    assert system.ensure(needs, run=machine.run, log=lambda _l: None, can_install=lambda: None) == []
    assert machine.commands == []


def test_missing_packages_are_installed_with_apt_get_and_named_in_the_log() -> None:
    machine = Machine("runc")
    needs = [machine.need("runc"), machine.need("busybox-static")]
    lines: list[str] = []
    installed = system.ensure(needs, run=machine.run, log=lines.append, can_install=lambda: None)
    assert installed == ["busybox-static"]
    assert machine.commands == [
        ["apt-get", "update", "-qq"],
        ["apt-get", "install", "-y", "-qq", "busybox-static"],
    ]
    assert "busybox-static" in lines[0] and "apt-get install" in lines[0]


def test_cannot_install_stops_naming_each_package_and_the_command() -> None:
    machine = Machine()
    needs = [machine.need("runc"), machine.need("busybox-static")]
    with pytest.raises(SandboxError) as raised:
        system.ensure(
            needs, run=machine.run, log=lambda _l: None, can_install=lambda: "it needs root (uid 1000)"
        )
    message = str(raised.value)
    assert "Debian package runc" in message and "Debian package busybox-static" in message
    assert "sudo apt-get install -y -qq runc busybox-static" in message
    assert "uid 1000" in message and "SYSTEM_PACKAGES=skip" in message
    assert machine.commands == [], "nothing is tried where it cannot be installed"


def test_a_failing_apt_get_is_reported_with_its_exit_code() -> None:
    machine = Machine(update_rc=100)
    with pytest.raises(SandboxError, match=r"`apt-get update -qq` exited 100 .*runc"):
        system.ensure([machine.need("runc")], run=machine.run, log=lambda _l: None, can_install=lambda: None)


def test_a_package_that_installs_without_providing_the_file_is_named() -> None:
    machine = Machine(install_works=False)
    with pytest.raises(SandboxError, match="still missing: the runc file"):
        system.ensure([machine.need("runc")], run=machine.run, log=lambda _l: None, can_install=lambda: None)


def test_skip_goes_on_without_them(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SYSTEM_PACKAGES", "skip")
    monkeypatch.setattr(
        system, "missing", lambda needs=None: [system.SystemNeed("x", "some-package", lambda: False)]
    )
    assert system.main([]) == 0
    assert "without some-package" in capsys.readouterr().err


def test_the_needs_name_debian_packages_for_runc_and_busybox() -> None:
    assert {n.package for n in system.NEEDS} == {"runc", "busybox-static"}

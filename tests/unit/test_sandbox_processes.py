"""Process identity and ports: the sandbox stops only what it started."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

from fixtures.sandbox import processes


def test_spawn_records_identity_and_stop_ends_it(tmp_path: Path) -> None:
    rec = processes.spawn(
        "sleeper", [sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "s.log"
    )
    assert rec.alive()
    assert rec.start_ticks == processes.start_ticks(rec.pid)
    assert os.getpgid(rec.pid) == rec.pid  # its own session: outlives the command that started it
    assert processes.stop(rec, grace=5)
    assert not rec.alive()
    assert not processes.stop(rec)  # a second stop is a no-op


def test_a_reused_pid_is_not_ours(tmp_path: Path) -> None:
    rec = processes.spawn(
        "sleeper", [sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "s.log"
    )
    impostor = processes.ProcessRecord("sleeper", rec.pid, rec.start_ticks + 1, rec.argv, rec.log)
    try:
        assert not impostor.alive()
        assert not processes.stop(impostor)
        assert rec.alive(), "a process whose start time differs from the record was signalled"
    finally:
        processes.stop(rec, grace=5)


def test_stop_kills_what_ignores_sigterm(tmp_path: Path) -> None:
    code = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('x', flush=True); time.sleep(60)"
    )
    rec = processes.spawn("stubborn", [sys.executable, "-c", code], tmp_path / "s.log")
    for _ in range(200):
        if "x" in Path(rec.log).read_text():
            break
        import time

        time.sleep(0.02)
    assert processes.stop(rec, grace=0.5)
    assert not rec.alive()


def test_listening_pid_and_port_free() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert not processes.port_free("127.0.0.1", port)
        assert processes.listening_pid(port) == os.getpid()
    assert processes.port_free("127.0.0.1", port)


def test_log_tail_of_missing_file() -> None:
    assert processes.log_tail("/nonexistent/log") == "(no log)"


def test_stop_all_shares_one_grace_period(tmp_path: Path) -> None:
    import time

    stubborn = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print('x', flush=True); time.sleep(60)"
    )
    polite = processes.spawn(
        "polite", [sys.executable, "-c", "import time; time.sleep(60)"], tmp_path / "p.log"
    )
    rude = processes.spawn("rude", [sys.executable, "-c", stubborn], tmp_path / "r.log")
    gone = processes.ProcessRecord("gone", polite.pid, polite.start_ticks + 1, (), "")
    for _ in range(200):
        if "x" in Path(rude.log).read_text():
            break
        time.sleep(0.02)
    t0 = time.monotonic()
    stopped = processes.stop_all([polite, rude, gone], grace=1.0)
    assert time.monotonic() - t0 < 5, "the grace period is shared, not one per process"
    assert [r.name for r in stopped] == ["polite", "rude"]
    assert not polite.alive() and not rude.alive()

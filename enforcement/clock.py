"""One clock, injected: how the simulated device (in time, every component that waits) reads and spends time.

A simulated kernel's cost is time: it keeps the GPU busy for so many seconds, at a speed that depends
on what else runs there. Read from the real clock, every figure the device reports (how long a
kernel took, how long it shared the GPU) carries the machine's load with it, and a unit test that
asserts on them fails on a busy machine. So the device does not call ``time`` itself: it reads a
``Clock`` handed to it, the real one (``REAL``) in the product and a ``ManualClock`` in unit tests,
where time moves only as the code under test spends it. Kubernetes' components are built the same
way (an injected ``clock.Clock``, a fake one stepped by the tests). Benchmarks, not tests, measure
real time.

Three readings are enough: ``time`` (epoch seconds: spans that other processes compare), ``monotonic``
(intervals, deadlines) and ``wait`` (spend up to so many seconds unless an event comes first).
"""

from __future__ import annotations

import threading
import time
from typing import Final, Protocol


class Clock(Protocol):
    def time(self) -> float:
        """Seconds since the epoch (a span's start and end, compared across processes)."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back (intervals and deadlines)."""
        ...

    def wait(self, event: threading.Event, seconds: float) -> bool:
        """Spend up to ``seconds``, or less if ``event`` is set first; True when it was set."""
        ...


class RealClock:
    """The machine's clock."""

    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def wait(self, event: threading.Event, seconds: float) -> bool:
        return event.wait(seconds)


REAL: Final[Clock] = RealClock()


class ManualClock:
    """Virtual time: it moves only by ``advance`` or by a ``wait`` that runs its course.

    A ``wait`` whose event is not set spends its seconds at once (time jumps forward; nothing
    sleeps), so code that runs kernels one after another takes exactly the virtual time its cost
    model says, however busy the machine is. Meant for one thread at a time: two threads waiting
    at once would each move the shared time forward.
    """

    def __init__(self, start: float = 1_000_000.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def time(self) -> float:
        with self._lock:
            return self._now

    def monotonic(self) -> float:
        return self.time()

    def __call__(self) -> float:
        """The monotonic reading, for seams that take a bare callable."""
        return self.time()

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError(f"time does not go back ({seconds} s)")
        with self._lock:
            self._now += seconds

    def wait(self, event: threading.Event, seconds: float) -> bool:
        if event.is_set():
            return True
        self.advance(max(0.0, seconds))
        return event.is_set()


__all__ = ["REAL", "Clock", "ManualClock", "RealClock"]

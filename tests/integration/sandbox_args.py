"""What a ``gpuconf run --kubeconfig`` against a test sandbox must be told about it.

Through ``--kubeconfig`` the suite judges a sandbox as it judges any cluster: it cannot know that the
sandbox's schedulers (the reference scheduler with ``--retry-seconds 0.5``, the toy schedulers of
``tests/data/schedulers`` polling every 0.2-0.5 s) try an unplaced Pod again within half a second.
Without ``--retry-period`` every unbound window would be sized from the reference scheduler's declared
default (10 s) or the suite's default (5 s): correct, and many seconds slower per check.

And how a run that a test interrupts is started (``interruptible``).
"""

from __future__ import annotations

import signal
from typing import Final

from fixtures.sandbox.scheduler.component import SANDBOX_RETRY_S

RETRY: Final = f"--retry-period={SANDBOX_RETRY_S:g}"


def interruptible() -> None:
    """A ``preexec_fn``: SIGINT at its default in the run, however pytest was started. A shell starts
    a background job with SIGINT ignored, the run inherits that (as a program should), and a test
    that interrupts it would then see it finish instead."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)

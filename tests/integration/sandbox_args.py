"""What a ``gpuconf run --kubeconfig`` against a test sandbox must be told about it.

Through ``--kubeconfig`` the suite judges a sandbox as it judges any cluster: it cannot know that the
sandbox's schedulers (the reference scheduler with ``--retry-seconds 0.5``, the toy schedulers of
``tests/data/schedulers`` polling every 0.2-0.5 s) try an unplaced Pod again within half a second.
Without ``--retry-period`` every unbound window would be sized from the reference scheduler's declared
default (10 s) or the suite's default (5 s): correct, and many seconds slower per check.
"""

from __future__ import annotations

from typing import Final

from fixtures.sandbox.scheduler.component import SANDBOX_RETRY_S

RETRY: Final = f"--retry-period={SANDBOX_RETRY_S:g}"

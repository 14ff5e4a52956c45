"""``python -m enforcement.agent``: see ``enforcement.agent.agent`` for the options and start order."""

from __future__ import annotations

import sys

from enforcement.agent.agent import main

if __name__ == "__main__":
    sys.exit(main())

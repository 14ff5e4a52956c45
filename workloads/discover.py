"""A device-discovery container: ``nvidia-smi -L`` into the termination message.

Runs in a Pod that got GPUs whole from the device plugin (``enforcement.discovery``); what the
container sees is the answer. The termination message is the channel every cluster returns through
the API, so the caller needs no logs API. Exit status: nvidia-smi's.
"""

from __future__ import annotations

import os
import subprocess
import sys

from .report import termination_path, write_termination_message


def main() -> int:
    try:
        done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        text, code = f"nvidia-smi -L could not run: {exc}\n", 127
    else:
        text, code = done.stdout + done.stderr, done.returncode
    sys.stdout.write(text)
    write_termination_message(termination_path(None, os.environ), text[-4096:])
    return code


if __name__ == "__main__":
    sys.exit(main())

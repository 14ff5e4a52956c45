"""What the benchmark scripts share (imported as ``benchlib``: each script's folder is on sys.path)."""

from __future__ import annotations

from pathlib import Path


def rss_mib(pid: int) -> float | None:
    """Resident memory of ``pid`` in MiB (``VmRSS``), or None if it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None

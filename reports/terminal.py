"""The terminal summary: the table ``gpuconf run`` prints at the end, the verdict per profile, the level."""

from __future__ import annotations

from reports.levels import level_of
from reports.model import RunRecord, not_judged_parts
from reports.verdicts import profile_results

COLUMNS = ("CHECK", "LEVEL", "PARTY", "OUTCOME", "SECONDS", "REASON")
REASON_WIDTH = 100


def summary_table(record: RunRecord) -> list[str]:
    """One row per check (the last column, the reason, is not padded)."""
    rows = [COLUMNS]
    for r in record.results:
        rows.append(
            (r.key, r.level, r.party, r.outcome.upper(), f"{r.duration_s:.1f}", r.reason[:REASON_WIDTH])
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS) - 1)]
    return [
        ("  ".join(c.ljust(w) for c, w in zip(row[:-1], widths, strict=True)) + "  " + row[-1]).rstrip()
        for row in rows
    ]


def summary(record: RunRecord) -> str:
    """The table, one verdict line per profile, then the run's verdict."""
    lines = summary_table(record)
    lines += not_judged_lines(record)
    lines += [f"profile {p.summary()}" for p in profile_results(record)]
    lines.append(record.verdict_line())
    lines.append(level_of(record).line())
    return "\n".join(lines) + "\n"


def not_judged_lines(record: RunRecord) -> list[str]:
    """What passed checks did not judge for this implementation, and the implementation itself."""
    lines: list[str] = []
    unjudged = not_judged_parts(record.results)
    if unjudged:
        lines.append("parts of passed checks not judged for this implementation:")
        lines += [f"  {r.key}: {part}" for r, part in unjudged]
    under = record.under_test
    if under.get("node"):
        lines.append(
            f"implementation: node {under['node'].get('name')} ({under['node'].get('chosen')}); scheduler "
            f"{(under.get('scheduler') or {}).get('name')} ({(under.get('scheduler') or {}).get('chosen')})"
        )
    return lines

"""The level a run reaches, said plainly in every view (the HTML head, the terminal, the YAML).

- **conformant**: every MUST check of the claim was judged and passed (a check skipped for a
  feature the implementation does not claim is outside the claim);
- **partial**: none failed, but some were not judged, and the level names them (an error, a
  skip for another reason, a run narrowed to some checks or interrupted);
- **not conformant**: a MUST check failed.

Two qualifiers say what the level may be used for: **sandbox-verified, simulated GPUs** for a run in
the embedded sandbox (only a scheduler claim can be made there), and **reference components** when
gpuconf's own reference scheduler or node agent is the party under test (fine for a demo, never a
certification).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from reports.model import RunRecord

CONFORMANT: Final = "conformant"
PARTIAL: Final = "partial"
NOT_CONFORMANT: Final = "not conformant"
SANDBOX_VERIFIED: Final = "sandbox-verified, simulated GPUs"
REFERENCE_COMPONENTS: Final = "reference components"
FEATURE_SKIP: Final = "needs feature(s) "
"""How the plugin starts the reason of a check skipped for a feature the implementation does not claim."""
REFERENCE_SCHEDULER: Final = "gpuconf-reference"
REFERENCE_AGENT: Final = "gpuconf reference agent"
SCHEDULER_PARTIES: Final = ("scheduler", "stack")
AGENT_PROFILES: Final = ("node", "stack")


@dataclass
class Level:
    name: str
    qualifiers: list[str] = field(default_factory=list)
    not_judged: list[str] = field(default_factory=list)
    """What kept the run from ``conformant`` without a failure: the checks not judged and why."""

    def line(self) -> str:
        text = f"LEVEL: {self.name.upper()}"
        if self.qualifiers:
            text += f" ({'; '.join(self.qualifiers)})"
        if REFERENCE_COMPONENTS in self.qualifiers:
            text += ": gpuconf's own components were judged, fine for a demo, never a certification"
        if self.not_judged:
            shown = ", ".join(self.not_judged[:5]) + (", ..." if len(self.not_judged) > 5 else "")
            text += f"; not judged: {shown}"
        return text

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "qualifiers": list(self.qualifiers), "notJudged": list(self.not_judged)}


def narrowing(record: RunRecord) -> list[str]:
    """The filters that narrowed the run (``--check``, ``-k``, ``--deselect``, ...), as one reads them."""
    filters = record.invocation.get("filters") or {}
    checks = filters.get("checks") or record.options.get("checks") or []
    out = []
    if checks:
        out.append(f"--check {','.join(str(c) for c in checks)}")
    if filters.get("keyword"):
        out.append(f"-k {filters['keyword']!r}")
    if filters.get("markers"):
        out.append(f"-m {filters['markers']!r}")
    out += [f"--deselect {d}" for d in filters.get("deselect") or []]
    out += [f"node id {n}" for n in filters.get("nodeIds") or []]
    if filters.get("maxfail"):
        out.append(f"--maxfail {filters['maxfail']}")
    if filters.get("lastFailed"):
        out.append("--lf")
    return out


def reference_parties(record: RunRecord) -> list[str]:
    """The parties under test that are gpuconf's reference components (``scheduler``, ``node agent``)."""
    comps = record.components
    profiles = {r.profile for r in record.results}
    sched = comps.get("scheduler") or {}
    agent = comps.get("nodeAgent") or {}
    sched_ref = (
        bool(sched.get("reference"))
        if "reference" in sched
        else str(record.options.get("schedulerName") or "") == REFERENCE_SCHEDULER
    )
    agent_ref = (
        bool(agent.get("reference"))
        if "reference" in agent
        else record.environment.node_agent == REFERENCE_AGENT
        or record.target.get("kind") == "gpuconf-sandbox"
    )
    out = []
    if sched_ref and profiles & set(SCHEDULER_PARTIES):
        out.append("scheduler")
    if agent_ref and profiles & set(AGENT_PROFILES):
        out.append("node agent")
    return out


def level_of(record: RunRecord) -> Level:
    must = [r for r in record.results if r.level == "MUST"]
    qualifiers = []
    if record.target_kind == "sandbox":
        qualifiers.append(SANDBOX_VERIFIED)
    if reference_parties(record):
        qualifiers.append(REFERENCE_COMPONENTS)
    if any(r.outcome == "failed" for r in must):
        return Level(NOT_CONFORMANT, qualifiers)
    not_judged = [f"{r.key} (error)" for r in must if r.outcome == "error"]
    not_judged += [
        f"{r.key} (skipped: {r.reason})"
        for r in must
        if r.outcome == "skipped" and not r.reason.startswith(FEATURE_SKIP)
    ]
    not_judged += [f"the run was narrowed: {n}" for n in narrowing(record)]
    if record.interrupted:
        not_judged.append("the run was interrupted")
    if not must:
        not_judged.append("no MUST check ran")
    return Level(PARTIAL if not_judged else CONFORMANT, qualifiers, not_judged)

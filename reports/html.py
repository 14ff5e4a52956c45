"""The HTML report: one self-contained file a person reads, rendered with Jinja2.

On top the verdict per profile, what was not judged (the checks, the parts of a check's rule not
judged for the implementation, the mechanisms it does not claim: a grey block, never a failure, and
again beside each check), the implementation under test, and how good the suite that judged is
(its version's mutation score, ``reports.validation``); then the seed's four deliverables as
sections: (1) the annotation checklist with this run's verdict per rule, (2) the
hard and soft threshold verification, (3) time-slicing and sm-sharing side by side, (4) the rollout
path (probe, agent restart, density ramp); then every check, and for each one that failed or could
not be judged, its evidence and the party that broke the rule. Plots are matplotlib SVGs embedded
in the page (``reports.plots``); the page loads nothing from anywhere and runs no script.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import jinja2
import markupsafe

from reports import checklist, figures, plots, timeline, validation
from reports.environment import complete, describe
from reports.levels import level_of
from reports.model import NOT_JUDGED, CheckResult, Implementation, RunRecord, not_judged_parts
from reports.verdicts import profile_results, supported_features

TEXT_LIMIT: Final = 6000
"""Characters of a log or attached file shown inline (the tail: where a run stops is what matters)."""
RESTART_FEATURE: Final = "agent-restart"
CSP: Final = "default-src 'none'; img-src data:; style-src 'unsafe-inline'"
"""The page's Content-Security-Policy: it may load nothing but its own inline styles and data: images,
so a browser refuses (and reports on its console) anything that would reach the network."""


def broken_by(record: RunRecord, result: CheckResult) -> str:
    """The party that broke the rule: a stack failure whose node twin passed is the scheduler's."""
    if result.outcome != "failed":
        return ""
    if result.party == "stack":
        twin = next((r for r in record.results if r.profile == "node" and r.id == result.id), None)
        if twin is not None and twin.outcome == "passed":
            return "scheduler (the node twin of this check passed)"
        if twin is not None and twin.outcome == "failed":
            return "node agent (the node twin of this check fails too)"
    return {"node": "node agent", "scheduler": "scheduler"}.get(result.party, result.party or "unknown")


def anchor(key: str) -> str:
    """The HTML id of a check's evidence block."""
    return "check-" + "".join(c if c.isalnum() else "-" for c in key)


def ticks(text: str) -> markupsafe.Markup:
    """Markdown's `code` spans of the rule table as <code>, the rest escaped."""
    parts = str(markupsafe.escape(text)).split("`")
    return markupsafe.Markup(
        "".join(f"<code>{p}</code>" if i % 2 else p for i, p in enumerate(parts))
        if len(parts) % 2
        else str(markupsafe.escape(text))
    )


def _tail(text: str) -> str:
    return text if len(text) <= TEXT_LIMIT else "...\n" + text[-TEXT_LIMIT:]


@dataclass
class CheckView:
    result: CheckResult
    anchor: str
    broken_by: str
    timelines: list[timeline.PodTimeline]
    events: list[dict[str, Any]]
    workloads: dict[str, str]
    smi: list[str]
    logs: dict[str, str]
    facts: dict[str, str]
    attachments: list[str]
    not_judged: list[str] = field(default_factory=list)
    """Parts of the check's rule not judged for the implementation: shown apart from its outcome."""
    notes: list[str] = field(default_factory=list)
    """The check's other notes."""


def _smi(record: RunRecord, result: CheckResult) -> list[str]:
    out = []
    f = figures.facts(record, result)
    for key in ("nvidia_smi", "nvidiaSmi"):
        if f.get(key) is not None:
            out.append(json.dumps(f[key], indent=1) if not isinstance(f[key], str) else f[key])
    for name, res in figures.workloads(record, result).items():
        for step in res.get("steps") or []:
            if isinstance(step, dict) and step.get("op") == "smi":
                rows = [f"{name}: {step.get('command', 'nvidia-smi')}"]
                rows += [
                    f"  GPU {g.get('index')} {g.get('uuid')} {g.get('used_mib')}/{g.get('total_mib')} MiB"
                    for g in step.get("gpus") or []
                ]
                out.append("\n".join(rows))
    for name, path in figures.files(record, result).items():
        if "smi" in name:
            out.append(_tail(path.read_text(errors="replace")))
    return out


def check_view(record: RunRecord, result: CheckResult) -> CheckView:
    f = figures.facts(record, result)
    found = figures.files(record, result)
    logs = {n: _tail(p.read_text(errors="replace")) for n, p in found.items() if n.startswith("log-")}
    shown = {"events", "nvidia_smi", "nvidiaSmi", "memoryTimeline", "densityRamp"}
    return CheckView(
        result=result,
        anchor=anchor(result.key),
        broken_by=broken_by(record, result),
        timelines=timeline.timelines(record, result),
        events=[e for e in f.get("events") or [] if isinstance(e, dict)],
        workloads={n: json.dumps(w, indent=1) for n, w in figures.workloads(record, result).items()},
        smi=_smi(record, result),
        logs=logs,
        facts={k: v if isinstance(v, str) else json.dumps(v) for k, v in f.items() if k not in shown},
        attachments=sorted(n for n in found if not n.startswith("log-")),
        not_judged=result.not_judged(),
        notes=[n for n in result.notes if not n.startswith(NOT_JUDGED)],
    )


@dataclass
class ThresholdRow:
    view: CheckView
    boundaries: list[figures.Boundary]
    borrowing: figures.Borrowing | None
    eviction: figures.Eviction | None
    plot: str | None


@dataclass
class ModesRow:
    view: CheckView
    modes: dict[str, figures.ModeFigures]
    plot: str | None


@dataclass
class Rollout:
    probe: list[CheckView] = field(default_factory=list)
    restart: list[CheckView] = field(default_factory=list)
    density: list[tuple[CheckView, list[dict[str, Any]], str | None]] = field(default_factory=list)


def context(record: RunRecord, implementation: Implementation | None = None) -> dict[str, Any]:
    views = {r.key: check_view(record, r) for r in record.results}
    thresholds, modes_rows, rollout = [], [], Rollout()
    for r in record.results:
        view = views[r.key]
        bounds, borrow, evict = (
            figures.boundaries(record, r),
            figures.borrowing(record, r),
            figures.eviction(record, r),
        )
        memory = figures.memory_timelines(record, r)
        if bounds or borrow or evict or memory:
            plot = plots.memory_over_time(memory, r.key) if memory else None
            thresholds.append(ThresholdRow(view, bounds, borrow, evict, plot))
        by_mode = figures.modes(record, r)
        if by_mode:
            modes_rows.append(ModesRow(view, by_mode, plots.kernel_timelines(by_mode, r.key)))
        if r.profile == "probe":
            rollout.probe.append(view)
        if RESTART_FEATURE in r.features or r.id == RESTART_FEATURE:
            rollout.restart.append(view)
        ramp = figures.density_ramp(record, r)
        if ramp:
            rollout.density.append((view, ramp, plots.density_ramp(ramp, r.key)))
    items = checklist.checklist(record)
    supported, unsupported = supported_features(record)
    impl = implementation or record.implementation
    return {
        "record": record,
        "date": datetime.fromtimestamp(record.started, UTC).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "duration": round(record.finished - record.started, 1),
        "implementation": impl,
        "environment": describe(complete(record)) + left_out_rows(record),
        "profiles": profile_results(record),
        "verdict": record.verdict_line(),
        "not_judged": [(views[r.key], part) for r, part in not_judged_parts(record.results)],
        "not_claimed": dict((record.under_test or {}).get("mechanismsNotClaimed") or {}),
        "level": level_of(record),
        "exit_code": record.exit_code(),
        "supported": supported,
        "unsupported": unsupported,
        "suites": validation.validations(record),
        "readable_date": validation.readable_date,
        "suite_command": validation.COMMAND,
        "checklist": items,
        "checklist_counts": checklist.counts(items),
        "thresholds": thresholds,
        "modes": modes_rows,
        "rollout": rollout,
        "views": list(views.values()),
        "plots_available": plots.available(),
        "plots_hint": plots.INSTALL_HINT,
        "csp": CSP,
    }


def left_out_rows(record: RunRecord) -> list[tuple[str, str]]:
    """One row per GPU node the suite left out (MIG, not ready, whole-GPU Pods), from preflight."""
    rows = []
    for entry in (record.preflight or {}).get("leftOut") or []:
        scope = "left out" if entry.get("excluded") == "all" else "left out of checks needing idle GPUs"
        rows.append((f"Node {entry.get('node')}", f"{scope}: {entry.get('reason')}"))
    return rows


def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("reports", "templates"),
        autoescape=jinja2.select_autoescape(["html", "j2"]),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["anchor"] = anchor
    env.filters["ticks"] = ticks
    env.filters["num"] = lambda v, digits=1: "-" if v is None else f"{float(v):.{digits}f}"
    return env


def render_html(record: RunRecord, implementation: Implementation | None = None) -> str:
    return environment().get_template("report.html.j2").render(**context(record, implementation))


def write_html(record: RunRecord, path: Path, implementation: Implementation | None = None) -> Path:
    path.write_text(render_html(record, implementation))
    return path

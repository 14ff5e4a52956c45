"""``gpuconf run --dry-run``: what a run would judge, skip and create, creating nothing.

The plan is built from the declared checks (``conformance.catalog.load_checks``) and the run's
options, the same way the plugin selects and skips them at collection: one item per check,
profile and (for per-form checks) request form, each either run or skipped with the reason a
real run would give. For each item it says what it would create, all of it labelled with the run
and deleted at its end:

- one namespace (``gc-<run>-<check>-<4 hex>``) holding every Pod it makes, and a second one
  (the same name with ``-o``) for a check that makes a Pod of another party's namespace;
- its Pods: counted from the check's code (calls that make a Pod, in the check's body and the
  helpers of its module it calls); "or more" where one is made in a loop or the scenario adds
  fillers for the other GPUs of the node, since then the count depends on the node;
- one ``coordination.k8s.io`` Lease per GPU node it needs (in ``gpuconf-leases``);
- a Node, for the one check that adds a simulated GPU node, only where the GPU nodes are simulated.

Beyond its own namespaces, a run creates the namespace ``gpuconf-leases`` (when missing), its run
Lease, and a preflight namespace with one probe Pod. The one thing it changes outside them is
opt-in: with the feature ``agent-restart`` supported, the agent-restart check restarts the node
agent of a node it leased (deleting the agent's Pod, or signalling its process).

With a cluster to read (``--kubeconfig``, or in a Pod) it also reads (never writes) the GPU
nodes and the Pods that hold GPUs, to say which nodes a check could lease now and which the suite
leaves out (MIG, not ready for fractions, GPUs held whole).
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any, Final

from fixtures.suite.checks import FEATURES, SUITE_PROFILES, Check, needed_features
from fixtures.suite.session import AGENT_RESTART

POD_MAKERS: Final = frozenset({"scheduled_pod", "placed_pod", "submit", "foreign_pod"})
"""``Suite`` methods that create a Pod."""
STAGE_POD_MAKERS: Final = frozenset({"pod", "place"})
"""``Stage`` methods that create a Pod (called on a name containing ``stage``)."""
NODE_MAKERS: Final = frozenset({"create_node"})
NAMESPACE_MAKERS: Final = frozenset({"foreign_pod", "other_namespace"})
"""``Suite`` methods that make the check's second namespace (``Suite.other_namespace``)."""
AGENT_RESTARTERS: Final = frozenset({"restart_agent"})
LEASES_NAMESPACE: Final = "gpuconf-leases"


@dataclass(frozen=True)
class Footprint:
    """What a check's code creates, read from its source."""

    pods: int
    more_pods: bool
    """Some Pod is made in a loop, or the scenario fills the node's other GPUs: the count depends on it."""
    nodes: bool
    restarts_agent: bool
    namespaces: int = 1
    """Its own namespace, and a second one where it makes a Pod of another namespace."""

    def pods_text(self) -> str:
        return f"{self.pods} or more" if self.more_pods else str(self.pods)


def _functions(module: Any) -> dict[str, ast.FunctionDef]:
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(module)))
    except (OSError, TypeError):
        return {}
    return {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}


@cache
def footprint(declared: Check) -> Footprint:
    """Count the Pod-making calls of the check's body and of the module's helpers it calls."""
    body = declared.body
    module = inspect.getmodule(body) if body is not None else None
    functions = _functions(module) if module is not None else {}
    start = functions.get(getattr(body, "__name__", ""))
    if start is None:
        return Footprint(0, True, False, False)
    pods, more, nodes, restarts, second = 0, False, False, False, False
    seen: set[str] = set()

    def visit(node: ast.AST, in_loop: bool) -> None:
        nonlocal pods, more, nodes, restarts, second
        looping = in_loop or isinstance(
            node, ast.For | ast.While | ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp
        )
        if isinstance(node, ast.Call):
            func = node.func
            name = (
                func.attr
                if isinstance(func, ast.Attribute)
                else func.id
                if isinstance(func, ast.Name)
                else ""
            )
            receiver = (
                func.value.id if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) else ""
            )
            second = second or name in NAMESPACE_MAKERS
            if name in POD_MAKERS or (name in STAGE_POD_MAKERS and "stage" in receiver.lower()):
                pods += 1
                more = more or looping
            elif name == "Stage":
                more = True  # through the scheduler, the scenario fills the node's other GPUs
            elif name in NODE_MAKERS:
                nodes = True
            elif name in AGENT_RESTARTERS:
                restarts = True
            elif isinstance(func, ast.Name) and name in functions and name not in seen:
                seen.add(name)
                for helper_statement in functions[name].body:
                    visit(helper_statement, looping)
        for child in ast.iter_child_nodes(node):
            visit(child, looping)

    seen.add(start.name)
    for statement in start.body:
        visit(statement, False)
    return Footprint(pods, more, nodes, restarts, 2 if second else 1)


@dataclass(frozen=True)
class Item:
    """One check item a run would collect."""

    key: str
    check: Check
    profile: str
    form: str | None
    skip: str
    """Why it would be skipped (empty: it would run)."""

    def as_dict(self, eligible: Sequence[str] | None = None) -> dict[str, Any]:
        needs = self.check.needs
        out: dict[str, Any] = {
            "key": self.key,
            "level": self.check.level,
            "party": self.check.party(self.profile),
            "runs": not self.skip,
        }
        if self.skip:
            out["skip"] = self.skip
            return out
        mark = footprint(self.check)
        creates: dict[str, Any] = {"namespaces": mark.namespaces, "pods": mark.pods_text()}
        if not needs.cluster:
            creates["nodeLeases"] = needs.nodes
            out["needs"] = {"nodes": needs.nodes, "gpusPerNode": needs.gpus, "idle": needs.idle}
            if eligible is not None:
                out["eligibleNodes"] = list(eligible)
        if mark.nodes:
            creates["nodes"] = "1, only where the GPU nodes are simulated"
        out["creates"] = creates
        if mark.restarts_agent:
            out["changesOutside"] = "restarts the node agent of its leased node (feature agent-restart)"
        return out


def items(
    checks: Iterable[Check],
    profiles: Sequence[str],
    supported: frozenset[str],
    only: Sequence[str] = (),
    withheld: str = "",
) -> list[Item]:
    """Every item a run with these options collects, in the plugin's order, with its skip reason
    (``withheld``: why agent-restart is not done here, as
    ``fixtures.suite.session.withhold_agent_restart``)."""
    from fixtures.suite.checks import REQUEST_FORM_PREFERENCE

    preferred = next((f for f in REQUEST_FORM_PREFERENCE if f in supported), None)
    forms = [f.name for f in FEATURES.values() if f.request_form]
    out: list[Item] = []
    for declared in checks:
        if only and declared.id not in only:
            continue
        for profile in declared.profiles:
            if profile not in profiles:
                continue
            for form in forms if declared.each_form else [None]:
                params: dict[str, Any] = {"profile": profile}
                if form is not None:
                    params["form"] = form
                missing = [f for f in needed_features(declared, params) if f not in supported]
                skip = ""
                if missing:
                    skip = f"needs feature(s) {', '.join(missing)}, which the implementation does not support"
                elif withheld and AGENT_RESTART in needed_features(declared, params):
                    skip = withheld
                elif form is None and preferred is None and not declared.needs.cluster:
                    skip = "no request form (gpu-memory, nvidia, gpu-fraction) is supported"
                key = declared.key(profile) + (f"[{form}]" if form else "")
                out.append(Item(key, declared, profile, form, skip))
    return out


def cluster_view(cluster: Any, selector: str) -> dict[str, Any]:
    """What the cluster shows now, read only: its GPU nodes, the Pods holding GPUs, what is left out."""
    from enforcement.contract import gpu_loads
    from fixtures.suite.cluster import left_out, whole_gpu_holders

    nodes = cluster.gpu_nodes(selector)
    pods = cluster.unfinished_pods()
    holders = whole_gpu_holders(pods)
    guaranteed = {node for (node, _gpu), load in gpu_loads(pods).items() if load.shares}
    try:
        from fixtures.suite.leases import NAMESPACE

        cluster.core.read_namespace(NAMESPACE)
        leases_namespace = True
    except Exception:  # noqa: BLE001 - absent or not readable: either way the run would create it
        leases_namespace = False
    return {
        "server": cluster.server,
        "nodes": nodes,
        "whole": {n: sum(c for _p, c in held) for n, held in holders.items()},
        "guaranteed": guaranteed,
        "leftOut": left_out(nodes, holders),
        "leasesNamespace": leases_namespace,
    }


def eligible_nodes(check: Check, view: Mapping[str, Any]) -> list[str]:
    """The GPU nodes the check could lease now (ignoring other runs' leases)."""
    needs = check.needs
    whole: Mapping[str, int] = view["whole"]
    out = []
    for node in view["nodes"]:
        if not node.usable_for_fractions or node.gpu_count - whole.get(node.name, 0) < needs.gpus:
            continue
        if needs.idle and (node.name in view["guaranteed"] or node.name in whole):
            continue
        out.append(node.name)
    return out


def plan(
    checks: Iterable[Check],
    *,
    profiles: Sequence[str] = SUITE_PROFILES,
    supported: frozenset[str] = frozenset(FEATURES),
    only: Sequence[str] = (),
    scheduler: str = "",
    target: Mapping[str, Any] | None = None,
    view: Mapping[str, Any] | None = None,
    withheld: str = "",
) -> dict[str, Any]:
    """The dry run's plan as plain data (``render`` prints it)."""
    chosen = items(checks, profiles, supported, only, withheld)
    rows = []
    for item in chosen:
        eligible = eligible_nodes(item.check, view) if view is not None and not item.skip else None
        rows.append(item.as_dict(eligible))
    run_creates = [
        f"namespace {LEASES_NAMESPACE} (if missing)",
        f"Lease run-<id> in {LEASES_NAMESPACE}",
        "a preflight namespace with 1 probe Pod (deleted before the checks)",
    ]
    if view is not None and view.get("leasesNamespace"):
        run_creates[0] = f"namespace {LEASES_NAMESPACE}: exists, kept"
    outside = sorted({r["changesOutside"] for r in rows if r.get("changesOutside")})
    out: dict[str, Any] = {
        "dryRun": True,
        "target": dict(target or {}),
        "schedulerName": scheduler,
        "profiles": list(profiles),
        "supportedFeatures": sorted(supported),
        "checks": rows,
        "summary": {
            "items": len(rows),
            "run": sum(1 for r in rows if r["runs"]),
            "skipped": sum(1 for r in rows if not r["runs"]),
            "namespaces": sum(r["creates"]["namespaces"] for r in rows if r["runs"]),
        },
        "runCreates": run_creates,
        "changesOutsideItsNamespaces": outside or ["nothing"],
    }
    if view is not None:
        out["gpuNodes"] = [
            {"name": n.name, "gpus": n.gpu_count, "memoryMiB": n.memory_mib, "usable": n.usable_for_fractions}
            for n in view["nodes"]
        ]
        out["leftOut"] = list(view["leftOut"])
    return out


def render(data: Mapping[str, Any], say: Callable[[str], None] = print) -> None:
    """The plan as a person reads it."""
    target = data.get("target") or {}
    where = f"{target.get('kind', '?')} {target.get('server', '')}".strip()
    say(f"gpuconf run --dry-run: nothing is created; target {where}")
    say(f"scheduler under test: {data.get('schedulerName') or '?'}; profiles: {', '.join(data['profiles'])}")
    if "gpuNodes" in data:
        usable = [n["name"] for n in data["gpuNodes"] if n["usable"]]
        say(f"GPU nodes: {len(data['gpuNodes'])}, ready for fractions: {', '.join(usable) or 'none'}")
        for entry in data.get("leftOut") or []:
            scope = "left out" if entry["excluded"] == "all" else "left out of checks needing idle GPUs"
            say(f"  {entry['node']}: {scope}: {entry['reason']}")
    for row in data["checks"]:
        if not row["runs"]:
            say(f"  SKIP {row['key']}: {row['skip']}")
            continue
        creates = row["creates"]
        spaces = creates["namespaces"]
        parts = [f"{spaces} namespace{'s' if spaces != 1 else ''}, {creates['pods']} Pod(s)"]
        if "nodeLeases" in creates:
            parts.append(f"{creates['nodeLeases']} node Lease(s)")
        if "nodes" in creates:
            parts.append(f"Node: {creates['nodes']}")
        needs = row.get("needs")
        where = ""
        if needs:
            where = f"; needs {needs['nodes']} node(s) with >= {needs['gpusPerNode']} GPU(s)" + (
                ", idle" if needs["idle"] else ""
            )
            if "eligibleNodes" in row:
                where += f" (now: {', '.join(row['eligibleNodes']) or 'none: it would wait, then error'})"
        extra = f"; {row['changesOutside']}" if row.get("changesOutside") else ""
        say(f"  RUN  {row['key']} [{row['level']}]: creates {', '.join(parts)}{where}{extra}")
    s = data["summary"]
    say(f"{s['run']} of {s['items']} item(s) would run, {s['skipped']} skipped, each in its own namespace")
    say("the run also creates: " + "; ".join(data["runCreates"]))
    say("outside its own namespaces and Leases it changes: " + "; ".join(data["changesOutsideItsNamespaces"]))

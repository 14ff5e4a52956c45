"""``gpuconf lint`` and ``gpuconf checklist``: the contract, applied to manifests and live Pods.

Why this shape: lint is a thin shell around ``enforcement.contract``. It only finds Pods (in
files, inside workload templates and Lists, or in a cluster), turns each into the plain dict the
contract reads, and renders the violations; every judgement is the contract module's, so lint
can never disagree with the node agent or the suite. ``checklist`` prints the same rule table
lint enforces (``enforcement.rules``), so a reader's checklist and the tool cannot drift.

Files and the cluster share one path: both become ``(source, object)`` pairs. Node objects found
in the input (or listed from the cluster) enable the device and per-GPU checks, so those can be
exercised from files too.

Exit codes: 0 no errors (warnings alone pass, unless ``--strict``), 1 errors found, 2 unreadable
input or a usage error (a YAML or JSON syntax error names the file and line).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Final, TextIO

import yaml

from enforcement.contract import Violation, audit_gpus, audit_pod, pod_to_dict
from enforcement.dialects import DIALECT_RULES, DIALECTS, apply_dialect
from enforcement.rules import ANNOTATION_KEYS, RULES, SIDE_TITLES, rules_by_side
from reports.junit import Suite, suites_xml, to_text
from reports.model import CheckResult

# Where each workload kind keeps its Pod template.
TEMPLATE_PATHS: Final[dict[str, tuple[str, ...]]] = {
    "Deployment": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "ReplicationController": ("spec", "template"),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
    "PodTemplate": ("template",),
}
MANIFEST_SUFFIXES: Final = (".yaml", ".yml", ".json")
OUTPUTS: Final = ("table", "json", "junit")


class InputError(Exception):
    """Input that cannot be read at all (exit code 2)."""


@dataclass(frozen=True)
class Subject:
    """One object lint looked at (a Pod, a workload's template, or a Node), and where it came from."""

    kind: str
    namespace: str
    name: str
    source: str


@dataclass(frozen=True)
class Finding:
    """A violation plus where its object came from (file:line, or ``cluster``)."""

    source: str
    violation: Violation

    def as_json(self) -> dict[str, str]:
        return {"source": self.source, **asdict(self.violation)}


@dataclass
class Report:
    subjects: list[Subject]
    findings: list[Finding]

    def count(self, severity: str) -> int:
        return sum(1 for f in self.findings if f.violation.severity == severity)

    def failed(self, strict: bool) -> bool:
        return any(
            f.violation.is_error or (strict and f.violation.severity == "warning") for f in self.findings
        )


# --------------------------------------------------------------------------- reading input


def load_path(path: str, stdin: TextIO | None = None) -> list[tuple[str, Any]]:
    """Every document in a file, a directory (recursively: *.yaml, *.yml, *.json) or ``-`` (stdin)."""
    if path == "-":
        text = (stdin or sys.stdin).read()
        return parse_text(text, "<stdin>", as_json=text.lstrip()[:1] in ("{", "["))
    p = Path(path)
    if p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.is_file() and f.suffix in MANIFEST_SUFFIXES)
        return [doc for f in files for doc in load_path(str(f))]
    try:
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read {path}: {exc}") from exc
    return parse_text(text, path, as_json=p.suffix == ".json")


def parse_text(text: str, name: str, *, as_json: bool) -> list[tuple[str, Any]]:
    """``(source, document)`` pairs; the source is ``name:line`` of each document's start."""
    if as_json:
        try:
            return [(name, json.loads(text))]
        except json.JSONDecodeError as exc:
            raise InputError(f"{name}:{exc.lineno}:{exc.colno}: invalid JSON: {exc.msg}") from exc
    loader_class = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    loader = loader_class(text)
    docs: list[tuple[str, Any]] = []
    try:
        while loader.check_node():
            node = loader.get_node()
            line = node.start_mark.line + 1 if node is not None else 1
            docs.append((f"{name}:{line}", loader.construct_document(node)))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{name}:{mark.line + 1}" if mark is not None else name
        # the context often points at the real culprit (the start of an unterminated string)
        context = (
            f" ({exc.context} at line {exc.context_mark.line + 1})"
            if exc.context and exc.context_mark
            else ""
        )
        raise InputError(f"{where}: invalid YAML: {exc.problem}{context}") from exc
    except yaml.YAMLError as exc:
        raise InputError(f"{name}: invalid YAML: {exc}") from exc
    finally:
        loader.dispose()
    return docs


def _get(obj: Any, *path: str) -> Any:
    for part in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(part)
    return obj


def expand(source: str, obj: Any) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """The Kubernetes objects in one document: itself, or the items of a List, recursively."""
    if not isinstance(obj, Mapping):
        return
    kind = obj.get("kind")
    items = obj.get("items")
    if isinstance(kind, str) and kind.endswith("List") and isinstance(items, list):
        for i, item in enumerate(items):
            yield from expand(f"{source} items[{i}]", item)
        return
    yield source, obj


def pod_of(obj: Mapping[str, Any]) -> tuple[Subject, dict[str, Any]] | None:
    """The Pod (or Pod template, as a Pod dict) an object carries, and who to name in findings."""
    kind = str(obj.get("kind") or "")
    found = obj.get("metadata")
    meta: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    name = meta.get("name") or meta.get("generateName") or "<unnamed>"
    subject = Subject(kind, str(meta.get("namespace") or ""), str(name), "")
    if kind == "Pod":
        return subject, dict(obj)
    path = TEMPLATE_PATHS.get(kind)
    template = _get(obj, *path) if path else None
    if not isinstance(template, Mapping):
        return None
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": template.get("metadata") or {}}
    pod["spec"] = template.get("spec") or {}
    return subject, pod


# --------------------------------------------------------------------------- auditing


def audit(
    objects: Iterable[tuple[str, Mapping[str, Any]]],
    *,
    sm_sharing_enabled: bool = True,
    reserve_mib: int = 0,
    dialect: str = "contract",
) -> Report:
    """Audit Pods and workload templates; Nodes among ``objects`` enable device and GPU checks."""
    objects = list(objects)
    nodes = {str(_get(o, "metadata", "name")): (src, o) for src, o in objects if o.get("kind") == "Node"}
    subjects: list[Subject] = []
    findings: list[Finding] = []
    bound_pods: list[Mapping[str, Any]] = []
    for source, obj in objects:
        found = pod_of(obj)
        if found is None:
            continue
        subject, pod = found
        subject = replace(subject, source=source)
        subjects.append(subject)
        node_name = _get(pod, "spec", "nodeName")
        node = nodes.get(node_name, ("", None))[1] if isinstance(node_name, str) else None
        found_here = audit_pod(pod, node, sm_sharing_enabled=sm_sharing_enabled)
        for v in apply_dialect(pod, found_here, dialect):
            # a template's findings name the workload that owns it
            v = replace(v, kind=subject.kind, namespace=subject.namespace, name=subject.name)
            findings.append(Finding(source, v))
        if subject.kind == "Pod":
            bound_pods.append(pod)
    for v in audit_gpus(bound_pods, [o for _, o in nodes.values()], reserve_mib):
        findings.append(Finding(nodes.get(v.name, ("",))[0], v))
    return Report(subjects, findings)


def cluster_objects(
    kubeconfig: str | None, context: str | None, namespace: str | None, all_namespaces: bool
) -> list[tuple[str, Mapping[str, Any]]]:
    """Live Pods (one namespace, or all) and the Nodes, as plain dicts; ``InputError`` if unreachable."""
    from kubernetes import client, config
    from kubernetes.client.rest import ApiException
    from kubernetes.config.config_exception import ConfigException

    # The client reads KUBECONFIG once, at import; read it now so a caller's environment counts.
    kubeconfig = kubeconfig or os.environ.get("KUBECONFIG") or None
    try:
        api_client = config.new_client_from_config(config_file=kubeconfig, context=context)
    except (ConfigException, OSError, TypeError) as exc:
        raise InputError(f"cannot load kubeconfig {kubeconfig or '(default)'}: {exc}") from exc
    core = client.CoreV1Api(api_client)
    try:
        if all_namespaces:
            pods = core.list_pod_for_all_namespaces(_request_timeout=60).items
        else:
            chosen = namespace or _context_namespace(kubeconfig, context)
            pods = core.list_namespaced_pod(chosen, _request_timeout=60).items
    except ApiException as exc:
        raise InputError(f"cannot list Pods: {exc.status} {exc.reason}") from exc
    except Exception as exc:  # urllib3 connection errors have no common base worth naming
        raise InputError(f"cannot reach the cluster: {exc}") from exc
    objects: list[tuple[str, Mapping[str, Any]]] = []
    try:
        for node in core.list_node(_request_timeout=60).items:
            objects.append(("cluster", {**api_client.sanitize_for_serialization(node), "kind": "Node"}))
    except ApiException as exc:  # a namespaced user may not list Nodes; the Pod checks still stand
        print(
            f"gpuconf lint: cannot list Nodes ({exc.status} {exc.reason}); device checks skipped",
            file=sys.stderr,
        )
    objects += [("cluster", pod_to_dict(api_client.sanitize_for_serialization(pod))) for pod in pods]
    return objects


def _context_namespace(kubeconfig: str | None, context: str | None) -> str:
    from kubernetes import config

    try:
        contexts, active = config.list_kube_config_contexts(config_file=kubeconfig)
        chosen = next((c for c in contexts if c.get("name") == context), active) if context else active
        return str((chosen or {}).get("context", {}).get("namespace") or "default")
    except Exception:  # noqa: BLE001 - the client already loaded this file; no namespace means "default"
        return "default"


# --------------------------------------------------------------------------- rendering


def render_table(report: Report) -> str:
    """Aligned rows, one per finding, each followed by its fix; a summary line at the end."""
    header = ("SEVERITY", "RULE", "OBJECT", "CONTAINER", "KEY", "MESSAGE")
    rows = [
        (
            v.severity,
            v.rule,
            f"{v.kind} {v.namespace + '/' if v.namespace else ''}{v.name}",
            v.container or "-",
            v.key or "-",
            v.message,
        )
        for v in (f.violation for f in report.findings)
    ]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
    lines: list[str] = []
    if rows:
        lines.append("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=False)) + "  " + header[-1])
    indent = " " * (widths[0] + 2)  # under RULE: keeps the fix readable however long the key
    for row, finding in zip(rows, report.findings, strict=True):
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=False)) + "  " + row[-1])
        lines.append(f"{indent}fix: {finding.violation.fix}")
        if finding.source:
            lines.append(f"{indent}at:  {finding.source}")
    errors, warnings = report.count("error"), report.count("warning")
    lines.append(f"{errors} error(s), {warnings} warning(s) in {len(report.subjects)} object(s) checked")
    return "\n".join(lines) + "\n"


def render_json(report: Report) -> str:
    return json.dumps([f.as_json() for f in report.findings], indent=2) + "\n"


PARTY_OF_SIDE: Final[dict[str, str]] = {
    "request": "author",
    "placement": "scheduler",
    "node": "scheduler",
    "gpu": "scheduler",
}
"""Whose output a broken rule judges (``enforcement.rules`` sides): the workload's author or the scheduler."""
LINT_STATEMENT: Final = (
    "The object MUST obey the GPU-fraction contract (`gpuconf checklist` lists its rules)."
)


def lint_results(report: Report, strict: bool) -> list[CheckResult]:
    """Lint's findings on the result model: one result per object checked, ``failed`` when it has an
    error (with ``strict``, any finding), naming the rules it broke; the findings that do not fail it
    are its notes. The JUnit output (and any other rendering) is the model's."""
    cases: dict[tuple[str, str, str, str], list[Finding]] = {}
    for s in report.subjects:
        cases.setdefault((s.kind, s.namespace, s.name, s.source), [])
    for f in report.findings:
        v = f.violation
        cases.setdefault((v.kind, v.namespace, v.name, f.source), []).append(f)
    results = []
    for (kind, namespace, name, source), found in cases.items():
        failing = [f for f in found if f.violation.is_error or strict]
        rules = list(dict.fromkeys(f.violation.rule for f in failing))
        sides = {RULES[r].side for r in rules if r in RULES}
        results.append(
            CheckResult(
                key=f"{namespace + '/' if namespace else ''}{name}",
                id=name,
                profile="lint",
                party=", ".join(sorted({PARTY_OF_SIDE[side] for side in sides})),
                level="MUST",
                statement=LINT_STATEMENT,
                capability=kind,
                outcome="failed" if failing else "passed",
                reason=f"{len(failing)} finding(s): {', '.join(rules)}" if failing else "",
                detail="\n".join(str(f.violation) for f in failing),
                rules=rules,
                notes=[str(f.violation) for f in found if f not in failing],
                source=source,
            )
        )
    return results


def render_junit(report: Report, strict: bool) -> str:
    """One testcase per object checked; errors (and, with --strict, warnings) fail it."""
    suite = Suite("gpuconf lint", lint_results(report, strict))
    return to_text(suites_xml("gpuconf lint", [suite], classname="{capability}"))


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def render_checklist(dialect: str = "contract") -> str:
    """The complete annotation checklist, as Markdown, from the rule table lint enforces."""
    out = [
        "# GPU-fraction annotation checklist",
        "",
        "Generated by `gpuconf checklist` from the rule table that `gpuconf lint` enforces",
        "(`enforcement/rules.py`), so the two cannot disagree. `<c>` is the container name exactly as in",
        "`spec.containers[].name`. Errors fail `gpuconf lint`; warnings fail it only with `--strict`.",
        "",
        "## Annotations",
        "",
        "| key | written by | value | when absent |",
        "|---|---|---|---|",
    ]
    out += [
        f"| `{k.key}` | {_cell(k.writer)} | {_cell(k.value)} | {_cell(k.default)} |" for k in ANNOTATION_KEYS
    ]
    for side, rules in rules_by_side():
        out += ["", f"## {SIDE_TITLES[side]}", ""]
        for r in rules:
            out.append(f"- [ ] **`{r.id}`** ({r.severity}): {r.statement}")
            out.append(f"  - Fix: {r.fix}")
    extra = [r for r in DIALECT_RULES.values() if r.dialect == dialect]
    if extra:
        out += ["", f"## Dialect `{dialect}`: what its consumer adds", ""]
        for d in extra:
            out.append(f"- [ ] **`{d.id}`** ({d.severity}, dialect {d.dialect}): {d.statement}")
            out.append(f"  - Source: {d.source}")
    out += [
        "",
        f"{len(RULES)} rules (dialect contract)"
        + (f", {len(extra)} of dialect {dialect}" if extra else "")
        + ".",
        "",
    ]
    return "\n".join(out)


# --------------------------------------------------------------------------- commands


def run_lint(args: argparse.Namespace) -> int:
    if not args.paths and not args.cluster:
        print("gpuconf lint: error: give PATH... (or - for stdin), or --cluster", file=sys.stderr)
        return 2
    if (args.namespace or args.all_namespaces) and not args.cluster:
        print("gpuconf lint: error: --namespace/--all-namespaces need --cluster", file=sys.stderr)
        return 2
    try:
        objects = [obj for path in args.paths for src, doc in load_path(path) for obj in expand(src, doc)]
        if args.cluster:
            objects += cluster_objects(args.kubeconfig, args.context, args.namespace, args.all_namespaces)
    except InputError as exc:
        print(f"gpuconf lint: {exc}", file=sys.stderr)
        return 2
    report = audit(
        objects,
        sm_sharing_enabled=not args.sm_sharing_disabled,
        reserve_mib=args.gpu_reserve_mib,
        dialect=args.dialect,
    )
    if args.output == "json":
        sys.stdout.write(render_json(report))
    elif args.output == "junit":
        sys.stdout.write(render_junit(report, args.strict))
    else:
        sys.stdout.write(render_table(report))
    return 1 if report.failed(args.strict) else 0


def run_checklist(args: argparse.Namespace) -> int:
    sys.stdout.write(render_checklist(getattr(args, "dialect", "contract")))
    return 0


def register(subparsers: Any) -> None:
    """Add ``lint`` and ``checklist`` to the ``gpuconf`` command line."""
    lint = subparsers.add_parser(
        "lint",
        help="audit GPU-fraction annotations in manifests or live Pods",
        description=(
            "Audit Pods and the Pod templates of Deployments, StatefulSets, DaemonSets, ReplicaSets, "
            "Jobs, CronJobs and Lists (multi-document YAML or JSON) against the GPU-fraction contract. "
            "Every Pod is checked as a request; a bound Pod (spec.nodeName) also as a placement. "
            "Node objects in the input enable the device and per-GPU checks."
        ),
        epilog="exit codes: 0 no errors (warnings pass unless --strict), 1 errors, 2 unreadable input/usage",
    )
    lint.add_argument(
        "paths", nargs="*", metavar="PATH", help="file or directory of manifests; - reads stdin"
    )
    lint.add_argument(
        "--cluster", action="store_true", help="also audit the live Pods (and Nodes) of a cluster"
    )
    lint.add_argument("--kubeconfig", help="kubeconfig file (default: KUBECONFIG, then ~/.kube/config)")
    lint.add_argument("--context", help="kubeconfig context (default: the current one)")
    scope = lint.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", help="namespace to audit (default: the context's, else default)")
    scope.add_argument(
        "-A",
        "--all-namespaces",
        action="store_true",
        help="audit every namespace (per-GPU checks then see every Pod)",
    )
    lint.add_argument(
        "-o", "--output", choices=OUTPUTS, default="table", help="output format (default: table)"
    )
    lint.add_argument("--strict", action="store_true", help="warnings fail too (exit 1)")
    lint.add_argument(
        "--dialect",
        choices=DIALECTS,
        default="contract",
        help="contract (docs/contract.md as stated), kai (KAI admission's refusals as errors) or "
        "gpu-fractioning (what the released node agent trims, as notes)",
    )
    lint.add_argument(
        "--sm-sharing-disabled",
        action="store_true",
        help="the cluster has sm-sharing disabled: report any use",
    )
    lint.add_argument(
        "--gpu-reserve-mib",
        type=int,
        default=0,
        metavar="MIB",
        help="memory held back on each GPU when checking overcommit (default: 0)",
    )
    lint.set_defaults(func=run_lint)

    checklist = subparsers.add_parser(
        "checklist",
        help="print the annotation checklist (Markdown) that lint enforces",
        description="Print the complete GPU-fraction annotation checklist as Markdown, from lint's rules.",
    )
    checklist.add_argument("--dialect", choices=DIALECTS, default="contract", help="whose rules to add")
    checklist.set_defaults(func=run_checklist)

"""JUnit XML from the result model: the one JUnit writer of gpuconf (``gpuconf run``, ``report``, ``lint``).

Written from the model rather than by pytest's ``--junitxml`` because the suite's outcomes are
not pytest's: an *error* (the suite could not judge) must reach a CI dashboard as ``<error>``,
not as a ``<failure>`` of the implementation, and every testcase carries what it judged (party,
level, statement) as properties, and what it did not judge for the implementation (``not-judged``,
beside the notes in ``system-out``) without changing its outcome. The element set is the common
JUnit subset every CI reads:
``testsuites > testsuite > testcase`` with ``failure``/``error``/``skipped``, ``properties``,
``system-out``, and ``file``/``line`` where a result names its source (``path:line``).

A run gives one testsuite per profile and one testcase per check; ``gpuconf lint`` gives one
testsuite with one testcase per object checked (``conformance.lint``), through the same writer.
"""

from __future__ import annotations

import io
import re
import xml.etree.ElementTree as ET
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from reports.model import CheckResult, RunRecord

_SOURCE: Final = re.compile(r"(?P<path>.+):(?P<line>[0-9]+)(?: .*)?")
# Characters XML 1.0 cannot carry at all; an annotation key or a log line may contain them.
_NOT_XML: Final = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def xml_text(text: str) -> str:
    return _NOT_XML.sub("\ufffd", text)


@dataclass
class Suite:
    name: str
    results: list[CheckResult] = field(default_factory=list)


def _case(parent: ET.Element, r: CheckResult, classname: str) -> None:
    case = ET.SubElement(
        parent, "testcase", classname=xml_text(classname), name=xml_text(r.key), time=f"{r.duration_s:.3f}"
    )
    located = _SOURCE.fullmatch(r.source)
    if located:  # file="path" line="N", as CI systems expect
        case.set("file", xml_text(located.group("path")))
        case.set("line", located.group("line"))
    # Every part not judged in one property: a CI that keeps properties as a map keeps one per
    # name. The outcome is untouched (a pass stays a pass); system-out has each note.
    not_judged = "; ".join(r.not_judged())
    props = [
        (n, v)
        for n, v in (
            ("party", r.party),
            ("level", r.level),
            ("statement", r.statement),
            ("seed", r.seed),
            ("not-judged", not_judged),
        )
        if v
    ]
    if props:
        element = ET.SubElement(case, "properties")
        for name, value in props:
            ET.SubElement(element, "property", name=name, value=xml_text(value))
    if r.outcome in ("failed", "error"):
        tag = "failure" if r.outcome == "failed" else "error"
        node = ET.SubElement(case, tag, message=xml_text(r.reason))
        if r.rules and r.outcome == "failed":
            node.set("type", xml_text(", ".join(r.rules)))
        node.text = xml_text(r.detail or r.reason)
    elif r.outcome == "skipped":
        ET.SubElement(case, "skipped", message=xml_text(r.reason))
    if r.notes:
        ET.SubElement(case, "system-out").text = xml_text("\n".join(r.notes))


def suites_xml(name: str, suites: Iterable[Suite], classname: str = "{profile}.{capability}") -> ET.Element:
    """``<testsuites>`` for ``suites``; a testcase's classname is ``classname`` formatted with its result."""
    root = ET.Element("testsuites", name=xml_text(name))
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for suite in suites:
        results = suite.results
        counts = {
            "tests": len(results),
            "failures": sum(r.outcome == "failed" for r in results),
            "errors": sum(r.outcome == "error" for r in results),
            "skipped": sum(r.outcome == "skipped" for r in results),
        }
        attrs = {"name": xml_text(suite.name), **{k: str(v) for k, v in counts.items()}}
        element = ET.SubElement(root, "testsuite", attrs, time=f"{sum(r.duration_s for r in results):.3f}")
        for r in results:
            _case(element, r, classname.format(profile=r.profile, capability=r.capability, id=r.id))
        for key, value in counts.items():
            totals[key] += value
    for key, value in totals.items():
        root.set(key, str(value))
    ET.indent(root)
    return root


def junit_tree(record: RunRecord) -> ET.ElementTree:
    """A run: one testsuite per profile (``gpuconf.<profile>``), one testcase per check."""
    by_profile: dict[str, list[CheckResult]] = defaultdict(list)
    for r in record.results:
        by_profile[r.profile].append(r)
    suites = [Suite(f"gpuconf.{profile}", results) for profile, results in sorted(by_profile.items())]
    return ET.ElementTree(suites_xml("gpuconf", suites, "gpuconf.{profile}.{capability}"))


def to_text(root: ET.Element) -> str:
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def junit_bytes(record: RunRecord) -> bytes:
    """The run's ``junit.xml``, exactly as ``write_junit`` writes it."""
    out = io.BytesIO()
    junit_tree(record).write(out, encoding="utf-8", xml_declaration=True)
    return out.getvalue()


def write_junit(record: RunRecord, path: Path) -> Path:
    path.write_bytes(junit_bytes(record))
    return path

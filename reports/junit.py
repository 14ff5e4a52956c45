"""JUnit XML from the result model: one testsuite per profile, one testcase per check.

Written from the model rather than by pytest's ``--junitxml`` because the suite's outcomes are
not pytest's: an *error* (the suite could not judge) must reach a CI dashboard as ``<error>``,
not as a ``<failure>`` of the implementation, and every testcase carries what it judged (party,
level, statement) as properties. The element set is the common JUnit subset every CI reads.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

from reports.model import CheckResult, RunRecord


def junit_tree(record: RunRecord) -> ET.ElementTree:
    by_profile: dict[str, list[CheckResult]] = defaultdict(list)
    for r in record.results:
        by_profile[r.profile].append(r)
    root = ET.Element("testsuites", name="gpuconf", tests=str(len(record.results)))
    for profile, results in sorted(by_profile.items()):
        suite = ET.SubElement(
            root,
            "testsuite",
            name=f"gpuconf.{profile}",
            tests=str(len(results)),
            failures=str(sum(r.outcome == "failed" for r in results)),
            errors=str(sum(r.outcome == "error" for r in results)),
            skipped=str(sum(r.outcome == "skipped" for r in results)),
            time=f"{sum(r.duration_s for r in results):.3f}",
        )
        for r in results:
            case = ET.SubElement(
                suite,
                "testcase",
                classname=f"gpuconf.{profile}.{r.capability}",
                name=r.key,
                time=f"{r.duration_s:.3f}",
            )
            props = ET.SubElement(case, "properties")
            for name, value in (
                ("party", r.party),
                ("level", r.level),
                ("statement", r.statement),
                ("seed", r.seed),
            ):
                ET.SubElement(props, "property", name=name, value=value)
            if r.outcome == "failed":
                ET.SubElement(case, "failure", message=r.reason).text = r.detail or r.reason
            elif r.outcome == "error":
                ET.SubElement(case, "error", message=r.reason).text = r.detail or r.reason
            elif r.outcome == "skipped":
                ET.SubElement(case, "skipped", message=r.reason)
    ET.indent(root)
    return ET.ElementTree(root)


def write_junit(record: RunRecord, path: Path) -> Path:
    junit_tree(record).write(path, encoding="utf-8", xml_declaration=True)
    return path

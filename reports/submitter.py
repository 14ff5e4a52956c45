"""The submitter file: who submits which product version (``--submitter FILE``, YAML).

Keys (all required, schema ``reports/schema/submitter.schema.json``): ``organization``,
``project``, ``url``, ``version``, ``contact`` (one or a list), ``type`` (``scheduler``, ``node
agent`` or ``stack``), ``repository`` and ``documentation`` (URLs). CI passes one file instead of
eight options. This is not an implementation *description* (how a stack behaves): it names the
product and its version, the subject of a certification.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any, Final

import yaml

from reports.model import Implementation

SCHEMA_FILE: Final = "submitter.schema.json"
EXAMPLE: Final = """organization: Example Inc.
project: example-gpu-scheduler
url: https://example.com/gpu-scheduler
version: v2.1.0
contact: [gpu-team@example.com]
type: scheduler
repository: https://example.com/src/gpu-scheduler
documentation: https://example.com/docs/gpu-scheduler
"""


class SubmitterError(ValueError):
    """A submitter file that cannot be read or breaks the schema; the message says what to fix."""


def schema() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(resources.files("reports").joinpath("schema", SCHEMA_FILE).read_text())
    return data


def problems(data: Any) -> list[str]:
    """Schema errors of a submitter file's content, one line each (empty: valid)."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(schema())
    return [
        f"{'/'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}"
        for e in sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path))
    ]


def from_data(data: dict[str, Any]) -> Implementation:
    contact = data.get("contact") or []
    return Implementation(
        organization=str(data.get("organization") or ""),
        project=str(data.get("project") or ""),
        url=str(data.get("url") or ""),
        version=str(data.get("version") or ""),
        contact=[contact] if isinstance(contact, str) else [str(c) for c in contact],
        type=str(data.get("type") or ""),
        repository=str(data.get("repository") or ""),
        documentation=str(data.get("documentation") or ""),
    )


def load(path: Path) -> Implementation:
    """The submitter file at ``path``; raises ``SubmitterError`` naming the file and each problem."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise SubmitterError(f"--submitter {path}: cannot read it: {exc}") from exc
    found = problems(data)
    if found:
        raise SubmitterError(
            f"--submitter {path}: " + "; ".join(found) + f". A complete file looks like:\n{EXAMPLE}"
        )
    return from_data(data)

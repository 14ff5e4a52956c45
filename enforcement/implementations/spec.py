"""A small typed-record language for implementation descriptions: one spec, two uses.

``parse`` reads a YAML mapping against a spec and refuses what the spec does not name (the field's
dotted path and the file in the message); ``json_schema`` writes the same spec as a JSON schema
(``schema.json`` beside the built-ins, kept equal to this by a unit test). The loader needs no
schema library at run time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


class DescriptionError(ValueError):
    """An implementation description is malformed: names the file and the field."""


@dataclass(frozen=True)
class T:
    """One field's type: ``str``, ``bool``, ``int``, ``str-list``, ``str-map``, ``enum`` or ``object``."""

    kind: str
    doc: str = ""
    required: bool = False
    values: tuple[str, ...] = ()
    """For ``enum`` (and ``enum-list``): the allowed values."""
    fields: Mapping[str, T] = field(default_factory=dict)
    """For ``object``: its fields."""
    nullable: bool = False


def obj(doc: str, required: bool = False, nullable: bool = False, **fields: T) -> T:
    return T("object", doc, required, fields=dict(fields), nullable=nullable)


def parse(spec: T, value: Any, where: str, path: str = "") -> Any:
    """``value`` checked against ``spec``; raises ``DescriptionError`` naming ``where`` and the field."""
    shown = path or "(top level)"
    if value is None and (spec.nullable or not spec.required):
        return None
    if spec.kind == "object":
        if not isinstance(value, Mapping):
            raise DescriptionError(f"{where}: {shown} must be a mapping, not {type(value).__name__}")
        unknown = [k for k in value if k not in spec.fields]
        if unknown:
            raise DescriptionError(
                f"{where}: unknown field {_join(path, str(unknown[0]))!r}; "
                f"known here: {', '.join(spec.fields)}"
            )
        out: dict[str, Any] = {}
        for name, sub in spec.fields.items():
            if name not in value or value[name] is None:
                if sub.required:
                    raise DescriptionError(f"{where}: missing required field {_join(path, name)!r}")
                out[name] = None
                continue
            out[name] = parse(sub, value[name], where, _join(path, name))
        return out
    if spec.kind == "str":
        if not isinstance(value, str):
            raise DescriptionError(f"{where}: {shown} must be a string, not {type(value).__name__} {value!r}")
        return value
    if spec.kind == "bool":
        if not isinstance(value, bool):
            raise DescriptionError(f"{where}: {shown} must be true or false, not {value!r}")
        return value
    if spec.kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            raise DescriptionError(f"{where}: {shown} must be a whole number, not {value!r}")
        return value
    if spec.kind == "enum":
        if value not in spec.values:
            raise DescriptionError(f"{where}: {shown} is {value!r}; allowed: {', '.join(spec.values)}")
        return value
    if spec.kind in ("str-list", "enum-list"):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise DescriptionError(f"{where}: {shown} must be a list of strings, not {value!r}")
        if spec.kind == "enum-list":
            bad = [v for v in value if v not in spec.values]
            if bad:
                raise DescriptionError(f"{where}: {shown} has {bad[0]!r}; allowed: {', '.join(spec.values)}")
        return tuple(value)
    if spec.kind == "str-map":
        if not isinstance(value, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in value.items()
        ):
            raise DescriptionError(f"{where}: {shown} must map strings to strings, not {value!r}")
        return dict(value)
    if spec.kind == "list-of":
        item = spec.fields["item"]
        if not isinstance(value, list):
            raise DescriptionError(f"{where}: {shown} must be a list, not {type(value).__name__}")
        return tuple(parse(item, v, where, f"{path}[{i}]") for i, v in enumerate(value))
    raise AssertionError(spec.kind)


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def json_schema(spec: T) -> dict[str, Any]:
    """The spec as a JSON schema (draft 2020-12)."""
    out: dict[str, Any]
    if spec.kind == "object":
        out = {
            "type": "object",
            "additionalProperties": False,
            "properties": {k: json_schema(v) for k, v in spec.fields.items()},
        }
        required = [k for k, v in spec.fields.items() if v.required]
        if required:
            out["required"] = required
    elif spec.kind == "str":
        out = {"type": "string"}
    elif spec.kind == "bool":
        out = {"type": "boolean"}
    elif spec.kind == "int":
        out = {"type": "integer"}
    elif spec.kind == "enum":
        out = {"enum": list(spec.values)}
    elif spec.kind == "str-list":
        out = {"type": "array", "items": {"type": "string"}}
    elif spec.kind == "enum-list":
        out = {"type": "array", "items": {"enum": list(spec.values)}}
    elif spec.kind == "str-map":
        out = {"type": "object", "additionalProperties": {"type": "string"}}
    elif spec.kind == "list-of":
        out = {"type": "array", "items": json_schema(spec.fields["item"])}
    else:
        raise AssertionError(spec.kind)
    if spec.doc:
        out["description"] = spec.doc
    if spec.nullable or not spec.required:
        if "type" in out:
            out = {**out, "type": [out["type"], "null"]}
        elif "enum" in out:
            out = {**out, "enum": [*out["enum"], None]}
    return out

"""Request bodies read the way Google's JSON transcoding reads them, and answers shaped by the same schemas.

One generic walker over the discovery document's schemas (``tpuctl.sim.discovery``), no per-field code:

- ``read_body``: an unknown field name, or a value of the wrong JSON type, is 400 INVALID_ARGUMENT with a
  ``google.rpc.BadRequest`` field violation per fault, in the messages Google's frontend writes::

      Invalid JSON payload received. Unknown name "spott" at 'node.scheduling_config': Cannot find field.
      Invalid value at 'node.scheduling_config.preemptible' (TYPE_BOOL), "yes"

  (Field paths use the proto names, snake_case, with ``[i]`` for list items. Source: the messages quoted
  in public issues about Google APIs' JSON transcoding, e.g. googleapis/google-api-python-client and
  Sheets API threads; the TPU API shares that frontend.) Proto3 JSON rules apply: a field may be named in
  lowerCamelCase or in its proto snake_case; ``null`` is the field's absence; a bool is ``true``/``false``
  only (protobuf's JSON parser takes the strings "true"/"false" only in its legacy mode, so "yes" is
  refused); an enum is one of its names or a number; an int is a number or a string of digits; a
  duration is ``"<seconds>[.<fraction>]s"``; a timestamp is RFC 3339. A repeated field given one object
  instead of a list is read as a list of that one item: Google's transcoder accepts it, and SkyPilot's
  TPU provisioner sends ``tpu.nodeSpec`` that way. The body comes back normalized (camelCase names,
  lists, no nulls) for the engine.
- ``project``: an answer keeps only the fields the version's schema has (so a v2 client never sees a
  v2alpha1-only field such as ``autocheckpointEnabled``, as on Google).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from tpuctl.sim.api_errors import BAD_REQUEST_TYPE, ApiError
from tpuctl.sim.discovery import document, schemas

_DURATION_RE = re.compile(r"^-?[0-9]+(\.[0-9]{1,9})?s$")
_TIMESTAMP_RE = re.compile(
    r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?(Z|[+-][0-9]{2}:[0-9]{2})$"
)
_INT_RE = re.compile(r"^-?[0-9]+$")
_INT_RANGES = {"int32": (-(2**31), 2**31 - 1), "uint32": (0, 2**32 - 1), "int64": (-(2**63), 2**63 - 1)}
_INT_RANGES["uint64"] = (0, 2**64 - 1)
_PROTO_SCALAR = {"boolean": "TYPE_BOOL", "string": "TYPE_STRING", "number": "TYPE_DOUBLE"}


def snake(name: str) -> str:
    """A JSON (lowerCamel) or schema (UpperCamel) name as its proto field name."""
    return re.sub(r"([A-Z])", lambda m: "_" + m.group(1).lower(), name[:1].lower() + name[1:])


def _camel(name: str) -> str:
    return re.sub(r"_([a-z0-9])", lambda m: m.group(1).upper(), name)


def body_field(schema_name: str) -> str:
    """The request message's field that holds the body: ``node`` for a Node, none ("") for a whole
    ``*Request`` message (body "*")."""
    return "" if schema_name.endswith("Request") else snake(schema_name)


class _Faults:
    def __init__(self) -> None:
        self.unknown: list[tuple[str, str]] = []  # (name, at)
        self.invalid: list[tuple[str, str]] = []  # (path, message)


def read_body(version: str, schema_name: str, body: Any) -> dict[str, Any]:
    """``body`` checked against ``schema_name`` of ``version``'s document, and normalized."""
    faults = _Faults()
    root = body_field(schema_name)
    value = _read_object(version, {"$ref": schema_name}, body, root, faults)
    _raise(faults)
    return value if isinstance(value, dict) else {}


def _raise(faults: _Faults) -> None:
    """The 400 for what ``faults`` holds (unknown names first, as Google reports them), if anything."""
    if faults.unknown:
        lines = [
            f'Unknown name "{name}"' + (f" at '{at}'" if at else "") + ": Cannot find field."
            for name, at in faults.unknown
        ]
        message = "Invalid JSON payload received. " + "\n".join(lines)
        violations = [
            {"field": at, "description": f"Invalid JSON payload received. {line}"}
            for (_, at), line in zip(faults.unknown, lines, strict=True)
        ]
        raise ApiError(
            400, "INVALID_ARGUMENT", message, [{"@type": BAD_REQUEST_TYPE, "fieldViolations": violations}]
        )
    if faults.invalid:
        message = "\n".join(m for _, m in faults.invalid)
        violations = [{"field": path, "description": m} for path, m in faults.invalid]
        raise ApiError(
            400, "INVALID_ARGUMENT", message, [{"@type": BAD_REQUEST_TYPE, "fieldViolations": violations}]
        )


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _type_url(version: str, schema_name: str) -> str:
    return f"type.googleapis.com/google.cloud.tpu.{version}.{schema_name}"


def _invalid(faults: _Faults, path: str, kind: str, raw: Any, extra: str = "") -> None:
    shown = (
        f'"{raw}"'
        if isinstance(raw, str)
        else ("true" if raw is True else "false" if raw is False else repr(raw))
    )
    faults.invalid.append((path, f"Invalid value at '{path}' ({kind}), {extra or shown}"))


def _read_object(version: str, prop: dict[str, Any], value: Any, path: str, faults: _Faults) -> Any:
    schema_name = prop["$ref"]
    schema = schemas(version)[schema_name]
    if not isinstance(value, dict):
        _invalid(faults, path, _type_url(version, schema_name), value)
        return None
    props: dict[str, Any] = schema.get("properties", {})
    out: dict[str, Any] = {}
    for key, item in value.items():
        name = key if key in props else _camel(key)
        if name not in props:
            faults.unknown.append((key, path))
            continue
        if item is None:
            continue  # proto3 JSON: null is the field's default
        # An enum's proto type is named after its field, nested in the message (AcceleratorConfig.Type).
        enum_type = _type_url(version, f"{schema_name}.{name[:1].upper()}{name[1:]}")
        out[name] = _read_value(version, props[name], item, _join(path, snake(name)), faults, enum_type)
    return out


def _read_value(
    version: str, prop: dict[str, Any], value: Any, path: str, faults: _Faults, enum_type: str = "TYPE_ENUM"
) -> Any:
    if "$ref" in prop:
        return _read_object(version, prop, value, path, faults)
    kind = prop.get("type")
    if kind == "array":
        items = value if isinstance(value, list) else [value]
        return [
            _read_value(version, prop["items"], v, f"{path}[{i}]", faults, enum_type)
            for i, v in enumerate(items)
        ]
    if kind == "object" and "additionalProperties" in prop:
        if not isinstance(value, dict):
            _invalid(faults, path, "TYPE_MESSAGE", value)
            return None
        inner = prop["additionalProperties"]
        return {k: _read_value(version, inner, v, f"{path}[{k}]", faults) for k, v in value.items()}
    if kind == "any" or kind == "object":
        return value
    return _read_scalar(prop, value, path, faults, enum_type)


def _read_scalar(prop: dict[str, Any], value: Any, path: str, faults: _Faults, enum_type: str) -> Any:
    kind, fmt = prop.get("type"), prop.get("format")
    if kind == "boolean":
        if not isinstance(value, bool):
            _invalid(faults, path, "TYPE_BOOL", value)
        return value
    if kind == "integer" or fmt in _INT_RANGES:
        text = str(value) if isinstance(value, int | str) and not isinstance(value, bool) else ""
        low, high = _INT_RANGES.get(str(fmt), _INT_RANGES["int64"])
        if not _INT_RE.match(text) or not low <= int(text) <= high:
            _invalid(faults, path, f"TYPE_{str(fmt or 'int32').upper()}", value)
            return value
        return value
    if kind == "number":
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            _invalid(faults, path, "TYPE_DOUBLE", value)
        return value
    if "enum" in prop:
        if not (isinstance(value, int) and not isinstance(value, bool)) and value not in prop["enum"]:
            _invalid(faults, path, enum_type, value)
        return value
    if not isinstance(value, str):
        _invalid(faults, path, "TYPE_STRING", value)
        return value
    if fmt == "google-duration" and not _DURATION_RE.match(value):
        name = path.rsplit(".", 1)[-1]
        _invalid(
            faults,
            path,
            "type.googleapis.com/google.protobuf.Duration",
            value,
            f"Field '{name}', Illegal duration format; duration must end with 's'",
        )
    elif fmt == "google-datetime" and not _TIMESTAMP_RE.match(value):
        name = path.rsplit(".", 1)[-1]
        _invalid(
            faults,
            path,
            "type.googleapis.com/google.protobuf.Timestamp",
            value,
            f"Field '{name}', Invalid time format: {value}",
        )
    return value


def project(version: str, schema_name: str, value: Any) -> Any:
    """``value`` with only the fields ``schema_name`` of ``version`` has (recursively); an Operation's
    ``response`` is projected onto the schema its ``@type`` names."""
    schema = schemas(version).get(schema_name)
    if schema is None or not isinstance(value, dict):
        return value
    props: dict[str, Any] = schema.get("properties", {})
    out: dict[str, Any] = {}
    for key, item in value.items():
        prop = props.get(key)
        if prop is None:
            continue
        out[key] = _project_value(version, prop, item)
    return out


def _project_value(version: str, prop: dict[str, Any], value: Any) -> Any:
    if "$ref" in prop:
        return project(version, prop["$ref"], value)
    if prop.get("type") == "array" and isinstance(value, list):
        return [_project_value(version, prop.get("items", {}), v) for v in value]
    if isinstance(value, dict) and "@type" in value:
        # A google.protobuf.Any (Operation.response / metadata): project onto the schema it names.
        kind = str(value["@type"]).rsplit(".", 1)[-1]
        if kind in schemas(version):
            return {"@type": value["@type"], **project(version, kind, value)}
    return value


def read_query(version: str, parameters: Mapping[str, Any], query: Mapping[str, list[str]]) -> None:
    """The query string checked as Google's frontend checks it: a name that is neither one of the
    method's parameters nor a system parameter (``alt``, ``fields``, ``key``, ...; ``$``-prefixed forms
    such as google-cloud-tpu's ``$alt``) is an unknown name; a bool or int parameter holds one."""
    system = document(version).get("parameters", {})
    faults = _Faults()
    for key, values in query.items():
        if key.startswith("$") or key in system:
            continue
        prop = parameters.get(key)
        if prop is None or prop.get("location") != "query":
            faults.unknown.append((key, ""))
            continue
        for value in values:
            if prop.get("type") == "boolean":
                # A query string has no JSON types: the words true/false are its bools.
                if value not in ("true", "false"):
                    _invalid(faults, snake(key), "TYPE_BOOL", value)
            elif prop.get("type") == "integer":
                _read_scalar(prop, value, snake(key), faults, "TYPE_ENUM")
    _raise(faults)

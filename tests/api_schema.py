"""Check a TPU API answer against Google's discovery document (the copy google-api-python-client ships,
independent of the simulator's own): every field named in the schema, every value of its type, enum
values among the listed ones, timestamps and durations in Google's JSON forms. A ``google.protobuf.Any``
(an Operation's response or metadata) is checked against the schema its ``@type`` names."""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import googleapiclient
import pytest

if TYPE_CHECKING:
    from tpuctl.sim.exchange import SimRequest, SimResponse

_DOCUMENTS = Path(googleapiclient.__file__).parent / "discovery_cache" / "documents"
_TIMESTAMP_RE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{1,9})?(Z|[+-]\d{2}:\d{2})$")
_DURATION_RE = re.compile(r"^-?\d+(\.\d{1,9})?s$")
_INT_RE = re.compile(r"^-?\d+$")


@functools.cache
def google_document(version: str) -> dict[str, Any]:
    """Google's discovery document of the TPU API ``version`` (``v2``), or of another API named with
    its version (``compute.v1``), as google-api-python-client ships it."""
    name = version if "." in version else f"tpu.{version}"
    data: dict[str, Any] = json.loads((_DOCUMENTS / f"{name}.json").read_text())
    return data


def _methods(resources: dict[str, Any]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for resource in resources.values():
        found.extend(resource.get("methods", {}).values())
        found.extend(_methods(resource.get("resources", {})))
    return found


@functools.cache
def _compute_routes() -> list[tuple[str, re.Pattern[str], str | None]]:
    document = google_document("compute.v1")
    routes = []
    for method in _methods(document["resources"]):
        pattern = re.sub(r"\\{[^}]+\\}", "[^/]+", re.escape(document["servicePath"] + method["path"]))
        ref = method.get("response", {}).get("$ref")
        routes.append((method["httpMethod"], re.compile(f"^/{pattern}$"), ref))
    # Literal segments first: /instances/aggregated must not read as /instances/{instance}.
    return sorted(routes, key=lambda r: r[1].pattern.count("[^/]+"))


def compute_response_schema(http_method: str, path: str) -> str | None:
    """The response schema of the Compute v1 method serving ``http_method path``."""
    for method, pattern, ref in _compute_routes():
        if method == http_method and pattern.match(path):
            return ref
    raise AssertionError(f"no compute v1 method serves {http_method} {path}")


def response_schema(version: str, method_id: str) -> str | None:
    """The response schema of a method id such as ``tpu.projects.locations.nodes.get``."""

    def walk(resources: dict[str, Any]) -> str | None:
        for resource in resources.values():
            for method in resource.get("methods", {}).values():
                if method["id"] == method_id:
                    ref = method.get("response", {}).get("$ref")
                    return str(ref) if ref else None
            found = walk(resource.get("resources", {}))
            if found:
                return found
        return None

    return walk(google_document(version)["resources"])


def check(version: str, schema_name: str, value: Any, path: str = "$") -> list[str]:
    """Every way ``value`` departs from ``schema_name`` (empty when it conforms)."""
    return _check_ref(google_document(version)["schemas"], schema_name, value, path)


def _check_ref(schemas: dict[str, Any], name: str, value: Any, path: str) -> list[str]:
    if not isinstance(value, dict):
        return [f"{path}: expected a {name} object, got {value!r}"]
    return _check_fields(schemas, schemas[name].get("properties", {}), name, value, path)


def _check_fields(
    schemas: dict[str, Any], props: dict[str, Any], name: str, value: dict[str, Any], path: str
) -> list[str]:
    problems: list[str] = []
    for key, item in value.items():
        if key not in props:
            problems.append(f"{path}.{key}: not a field of {name}")
            continue
        problems.extend(_check_prop(schemas, props[key], item, f"{path}.{key}"))
    return problems


def _check_prop(schemas: dict[str, Any], prop: dict[str, Any], value: Any, path: str) -> list[str]:
    if "$ref" in prop:
        return _check_ref(schemas, prop["$ref"], value, path)
    kind, fmt = prop.get("type"), prop.get("format")
    if kind == "array":
        if not isinstance(value, list):
            return [f"{path}: expected a list, got {value!r}"]
        return [
            p for i, v in enumerate(value) for p in _check_prop(schemas, prop["items"], v, f"{path}[{i}]")
        ]
    if kind == "object":
        if not isinstance(value, dict):
            return [f"{path}: expected an object, got {value!r}"]
        if "properties" in prop:  # an inline message (Compute's Operation.error)
            return _check_fields(schemas, prop["properties"], "object", value, path)
        inner = prop.get("additionalProperties", {})
        if inner.get("type") == "any":
            return _check_any(schemas, value, path)
        return [p for k, v in value.items() for p in _check_prop(schemas, inner, v, f"{path}[{k}]")]
    if kind == "any":
        return []
    if kind == "boolean":
        return [] if isinstance(value, bool) else [f"{path}: expected a bool, got {value!r}"]
    if kind == "integer":
        ok = isinstance(value, int) and not isinstance(value, bool)
        return [] if ok else [f"{path}: expected an integer, got {value!r}"]
    if kind == "number":
        return [] if isinstance(value, int | float) else [f"{path}: expected a number, got {value!r}"]
    if not isinstance(value, str):
        return [f"{path}: expected a string, got {value!r}"]
    if "enum" in prop and value not in prop["enum"]:
        return [f"{path}: {value!r} is not one of {prop['enum']}"]
    patterns = {
        "google-datetime": _TIMESTAMP_RE,
        "google-duration": _DURATION_RE,
        "int64": _INT_RE,
        "uint64": _INT_RE,
    }
    pattern = patterns.get(str(fmt))
    if pattern is not None and not pattern.match(value):
        return [f"{path}: {value!r} is not a {fmt}"]
    return []


def _check_any(schemas: dict[str, Any], value: dict[str, Any], path: str) -> list[str]:
    type_url = value.get("@type")
    if type_url is None:
        return []
    name = str(type_url).rsplit(".", 1)[-1]
    if name == "Empty":
        return [] if set(value) == {"@type"} else [f"{path}: an Empty with fields {sorted(value)}"]
    if name not in schemas:
        return [f"{path}: @type {type_url} names no schema of the document"]
    rest = {k: v for k, v in value.items() if k != "@type"}
    return _check_ref(schemas, name, rest, path)


@pytest.fixture
def schema_problems(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every Compute answer (2xx) the simulator gives in the test is checked against compute.v1.json;
    the test fails at teardown if any departs from it. Import it into a test module to use it. Both the
    served simulator and the in-process one (``tpuctl.testing``) answer through the patched dispatch."""
    from tpuctl.sim import routes
    from tpuctl.sim import server as sim_server
    from tpuctl.sim.routes import dispatch

    problems: list[str] = []
    real: Callable[..., SimResponse] = dispatch

    def checked(engine: Any, request: SimRequest) -> SimResponse:
        response = real(engine, request)
        if request.path.startswith("/compute/v1/") and response.status == 200:
            schema = compute_response_schema(request.method, request.path)
            if schema is not None:
                problems.extend(check("compute.v1", schema, json.loads(response.body), request.path))
        return response

    monkeypatch.setattr(sim_server, "dispatch", checked)
    monkeypatch.setattr(routes, "dispatch", checked)
    yield problems
    assert problems == []

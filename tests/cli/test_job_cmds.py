"""`tpuctl job schema` and `tpuctl job check`: the published JSON Schema validates every example job file
in docs/examples/ (and refuses a typo'd one), and a file is checked as `run` would check it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tpuctl.testing.cli import Cli

EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "docs" / "examples").glob("*.yaml"))
_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def schema_errors(value: Any, schema: dict[str, Any], root: dict[str, Any], where: str = "") -> list[str]:
    """What ``value`` breaks of ``schema``: the JSON Schema keywords pydantic's schemas use ($ref, anyOf,
    type, const, properties, additionalProperties, items, minimum, maximum). No validator is a
    dependency of tpuctl, and these few are all the published schema needs."""
    if "$ref" in schema:
        return schema_errors(value, root["$defs"][schema["$ref"].rsplit("/", 1)[-1]], root, where)
    if "anyOf" in schema:
        branches = [schema_errors(value, branch, root, where) for branch in schema["anyOf"]]
        return [] if any(not b for b in branches) else [f"{where}: matches none of anyOf"]
    kind = schema.get("type")
    if kind in ("integer", "number"):
        numeric = isinstance(value, int | float) and not isinstance(value, bool)
        if not numeric or (kind == "integer" and not isinstance(value, int)):
            return [f"{where}: not {kind}"]
    elif kind is not None and not isinstance(value, _TYPES[kind]):
        return [f"{where}: not {kind}"]
    if "const" in schema and value != schema["const"]:
        return [f"{where}: not {schema['const']!r}"]
    if isinstance(value, int | float) and not schema.get("minimum", value) <= value <= schema.get(
        "maximum", value
    ):
        return [f"{where}: out of range"]
    errors: list[str] = []
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        extra = schema.get("additionalProperties", True)
        for key, item in value.items():
            if key in properties:
                errors += schema_errors(item, properties[key], root, f"{where}.{key}")
            elif extra is False:
                errors.append(f"{where}.{key}: not allowed")
            elif isinstance(extra, dict):
                errors += schema_errors(item, extra, root, f"{where}.{key}")
    if isinstance(value, list) and "items" in schema:
        for index, item in enumerate(value):
            errors += schema_errors(item, schema["items"], root, f"{where}[{index}]")
    return errors


@pytest.fixture(scope="module")
def schema() -> dict[str, Any]:
    from tpuctl.testing.cli import invoke

    result = invoke(("job", "schema"))
    assert result.code == 0, result.stderr
    published: dict[str, Any] = json.loads(result.stdout)
    return published


def test_there_are_examples_for_one_slice_a_multislice_and_any_of_types() -> None:
    assert {p.name for p in EXAMPLES} >= {"lm-single-slice.yaml", "lm-multislice.yaml", "lm-any-type.yaml"}


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_the_schema_validates_every_example(schema: dict[str, Any], example: Path) -> None:
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema_errors(yaml.safe_load(example.read_text()), schema, schema) == []


def test_the_schema_refuses_a_typo_a_wrong_type_and_num_nodes_2(schema: dict[str, Any]) -> None:
    document = yaml.safe_load(EXAMPLES[0].read_text())
    # resources is optional (anyOf: the object, or null): a typo inside it fails the object's branch.
    assert schema_errors({**document, "resources": {"use_spott": True}}, schema, schema) == [
        ".resources: matches none of anyOf"
    ]
    assert schema_errors({**document, "use_spott": True}, schema, schema) == [".use_spott: not allowed"]
    assert schema_errors({**document, "slices": "two"}, schema, schema) == [".slices: matches none of anyOf"]
    assert schema_errors({**document, "num_nodes": 2}, schema, schema) == [
        ".num_nodes: matches none of anyOf"
    ]


def test_check_names_the_types_and_a_bad_file_is_exit_2(cli: Cli, tmp_path: Path) -> None:
    good = cli("job", "check", str(EXAMPLES[0]), "-o", "json", env={"HF_TOKEN": "t"})
    assert good.code == 0, good.stderr
    assert good.json["job"]["valid"] is True and good.json["job"]["slice types"]
    bad = tmp_path / "bad.yaml"
    bad.write_text("run: x\nresources:\n  acelerators: tpu-v6e-8\n")
    result = cli("job", "check", str(bad))
    assert result.code == 2
    assert "bad.yaml:3: resources.acelerators: unknown key; did you mean accelerators?" in result.stderr


def test_the_readmes_job_file_is_valid(schema: dict[str, Any]) -> None:
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    text = readme.split("```yaml\n# job.yaml\n", 1)[1].split("```", 1)[0]
    assert schema_errors(yaml.safe_load(text), schema, schema) == []

"""The JSON writer: indented, with a long top-level list one compact item per line (a cost report lists
every slice), and values json cannot encode (enums, paths, datetimes) written as before."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from enum import Enum
from pathlib import Path
from typing import Any, cast

import pytest

from tpuctl.cli.render import Output


class Colour(Enum):
    RED = 1


def _written(capsys: pytest.CaptureFixture[str], data: dict[str, object]) -> str:
    Output(fmt="json").document(data)
    return capsys.readouterr().out


def test_small_documents_keep_their_indentation(capsys: pytest.CaptureFixture[str]) -> None:
    data: dict[str, object] = {"a": 1, "items": [{"x": 1}, {"x": 2}], "nested": {"b": [1, 2]}}
    out = _written(capsys, data)
    assert out == json.dumps(data, indent=2) + "\n"


def test_a_long_list_is_one_item_per_line_and_parses_back(capsys: pytest.CaptureFixture[str]) -> None:
    groups = [{"key": f"g{i}", "labels": {"team": "a"}, "cost_usd": i / 3, "name": None} for i in range(1500)]
    data: dict[str, object] = {
        "backend": "sim",
        "totals": {"cost_usd": 1.5},
        "groups": groups,
        "warnings": ["w"],
    }

    out = _written(capsys, data)

    assert json.loads(out) == data
    lines = out.splitlines()
    start = lines.index('  "groups": [')
    assert lines[start + 1] == '    {"key": "g0", "labels": {"team": "a"}, "cost_usd": 0.0, "name": null},'
    assert lines[start + 1501] == "  ],"
    assert lines[1] == '  "backend": "sim",' and lines[-1] == "}"


def test_values_json_cannot_encode_are_written_as_before(capsys: pytest.CaptureFixture[str]) -> None:
    when = datetime(2027, 1, 15, 8, tzinfo=UTC)
    data = {"path": Path("/tmp/x"), "colour": Colour.RED, "when": when, "many": [Colour.RED] * 1200}
    out = json.loads(_written(capsys, data))
    assert (out["path"], out["colour"], out["when"]) == ("/tmp/x", 1, "2027-01-15T08:00:00+00:00")
    assert out["many"] == [1] * 1200
    keyed = json.loads(_written(capsys, {"by": {Colour.RED: "r"}}))  # a key json refuses: converted
    assert keyed == {"by": {"Colour.RED": "r"}}


class _Stderr:
    """Keeps what the Output prints to stderr, markup and all."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def print(self, text: str, **_: object) -> None:
        self.lines.append(text)


@pytest.mark.parametrize(
    ("backend", "detail", "line"),
    [
        ("sim", ", state ~/s", "[black on yellow] sim [/] simulated TPU cloud (project p), state ~/s"),
        ("gcp", "", "[white on blue] gcp [/] project p"),
    ],
)
def test_the_banner_is_the_marker_the_backend_supplies(backend: str, detail: str, line: str) -> None:
    from tpuctl.backends.gcp import GCP_LABEL
    from tpuctl.backends.sim import SIM_LABEL

    label = {"sim": SIM_LABEL, "gcp": GCP_LABEL}[backend]
    stderr = _Stderr()
    out = Output(fmt="table", _stderr=cast(Any, stderr))
    out.backend_banner(label, "p", detail)
    assert stderr.lines == [line]
    assert out.envelope(x=1) == {"backend": backend, "project": "p", "x": 1}


def test_machine_formats_get_the_name_in_the_envelope_and_no_banner() -> None:
    from tpuctl.backends.sim import SIM_LABEL

    stderr = _Stderr()
    out = Output(fmt="json", _stderr=cast(Any, stderr))
    out.backend_banner(SIM_LABEL, "p")
    assert stderr.lines == [] and out.envelope() == {"backend": "sim", "project": "p"}

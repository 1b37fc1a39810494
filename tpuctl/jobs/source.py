"""A job file's YAML, read with the line of every key and item, so that an error names where it is.

PyYAML's composer keeps each node's position; the values are built from those nodes with the safe
loader's own constructors (so ``yes``/``1e3``/``~`` mean what they mean in any YAML tool).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from tpuctl.errors import ConfigError

#: Where a value sits in the document: its keys and list indices from the top, e.g. ("envs", "LR").
KeyPath = tuple[str | int, ...]


@dataclass(frozen=True)
class JobSource:
    """The document's values, and the 1-based line of each key (and list item) by its path."""

    path: str
    data: dict[str, Any]
    lines: Mapping[KeyPath, int] = field(default_factory=dict)

    def line_of(self, where: KeyPath) -> int | None:
        """The line of ``where``, else of the nearest enclosing key that has one."""
        for end in range(len(where), 0, -1):
            line = self.lines.get(where[:end])
            if line is not None:
                return line
        return None


def read_job_source(path: Path) -> JobSource:
    """The job file at ``path``; an unreadable file, bad YAML or a top level that is not a mapping is a
    ``ConfigError`` (exit 2) naming the file (and the line, for YAML)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"cannot read job file {path}: {exc}", path=str(path), fix="give a readable YAML job file"
        ) from None
    return parse_job_source(text, str(path))


def parse_job_source(text: str, path: str) -> JobSource:
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        lines: dict[KeyPath, int] = {}
        data = _value(loader, node, (), lines) if node is not None else {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else path
        raise ConfigError(
            f"{where}: not valid YAML ({getattr(exc, 'problem', None) or exc})",
            path=path,
            fix="fix the YAML syntax (indentation, a missing colon, an unclosed quote)",
        ) from None
    finally:
        loader.dispose()
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: a job file is a mapping of keys (name, resources, run, ...), not a "
            f"{type(data).__name__}",
            path=path,
            fix="start the file with keys, e.g. `resources:` and `run:`",
        )
    return JobSource(path=path, data=data, lines=lines)


def _value(loader: yaml.SafeLoader, node: yaml.Node, where: KeyPath, lines: dict[KeyPath, int]) -> Any:
    if isinstance(node, yaml.MappingNode):
        out: dict[str, Any] = {}
        loader.flatten_mapping(node)  # YAML merge keys (<<: *base), as the safe loader resolves them
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            # A key that is not a string (`1: x`) is kept as its text: the model refuses it by name.
            name = key if isinstance(key, str) else str(key)
            lines[(*where, name)] = key_node.start_mark.line + 1
            out[name] = _value(loader, value_node, (*where, name), lines)
        return out
    if isinstance(node, yaml.SequenceNode):
        items = []
        for index, item in enumerate(node.value):
            lines[(*where, index)] = item.start_mark.line + 1
            items.append(_value(loader, item, (*where, index), lines))
        return items
    return loader.construct_object(node, deep=True)

"""``filter`` and ``orderBy`` of the TPU API's list methods, in the AIP-160 / AIP-132 forms its
documentation shows (``type=v5litepod-8``, ``version:tpu-vm``, ``name != x``, terms joined by ``AND``;
``orderBy`` as ``field [asc|desc], ...``). Fields are dotted paths in the answer's JSON, named in
camelCase or snake_case. Anything else is 400 INVALID_ARGUMENT, as Google refuses a filter it cannot parse.
"""

from __future__ import annotations

import re
from typing import Any

from tpuctl.sim.api_errors import invalid_argument

_TERM_RE = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_.]*)\s*(!=|=|:|<=|>=|<|>)\s*(\"[^\"]*\"|'[^']*'|\S+)\s*$")


def _camel(name: str) -> str:
    return re.sub(r"_([a-z0-9])", lambda m: m.group(1).upper(), name)


def _lookup(item: Any, path: str) -> Any:
    value = item
    for part in path.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part, value.get(_camel(part)))
    return value


def _matches(item: dict[str, Any], field: str, op: str, wanted: str) -> bool:
    value = _lookup(item, field)
    if isinstance(value, list):
        return any(_compare(v, op, wanted) for v in value)
    return _compare(value, op, wanted)


def _compare(value: Any, op: str, wanted: str) -> bool:
    text = "" if value is None else (str(value).lower() if isinstance(value, bool) else str(value))
    if op == ":":
        # "has": a substring for text, as the TPU API's own examples use it (version:tpu-vm).
        return (wanted == "*" and value is not None) or wanted in text
    if op in ("=", "!="):
        return (text == wanted) == (op == "=")
    try:
        left, right = float(text), float(wanted)
    except ValueError:
        left_s, right_s = text, wanted
        return {
            "<": left_s < right_s,
            ">": left_s > right_s,
            "<=": left_s <= right_s,
            ">=": left_s >= right_s,
        }[op]
    return {"<": left < right, ">": left > right, "<=": left <= right, ">=": left >= right}[op]


def apply_query(items: list[dict[str, Any]], filter_: str, order_by: str) -> list[dict[str, Any]]:
    """``items`` kept by ``filter_`` and sorted by ``order_by`` (either may be empty)."""
    out = list(items)
    if filter_.strip():
        for term in re.split(r"\s+AND\s+", filter_.strip()):
            match = _TERM_RE.match(term)
            if match is None:
                raise invalid_argument(f"Invalid filter: {filter_!r}.", "filter")
            field, op, wanted = match.groups()
            wanted = wanted[1:-1] if wanted[:1] in "\"'" else wanted
            out = [item for item in out if _matches(item, field, op, wanted)]
    if order_by.strip():
        for clause in reversed([c.strip() for c in order_by.split(",") if c.strip()]):
            parts = clause.split()
            if len(parts) > 2 or (len(parts) == 2 and parts[1].lower() not in ("asc", "desc")):
                raise invalid_argument(f"Invalid orderBy: {order_by!r}.", "orderBy")
            desc = len(parts) == 2 and parts[1].lower() == "desc"
            field = parts[0]
            out.sort(key=lambda item: str(_lookup(item, field) or ""), reverse=desc)
    return out

"""Compute Engine's list queries: the ``filter`` expression and the aggregated lists
(``/aggregated/<collection>``), whose ``items`` map every scope of the project (``zones/Z``, and
``regions/R`` for collections that have regional resources) to its resources, or to a
``NO_RESULTS_ON_PAGE`` warning when the page holds none of that scope's (as Google answers)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tpuctl.sim.compute import links
from tpuctl.sim.compute.errors import invalid_field
from tpuctl.sim.wire import paginate
from tpuctl.sim.world import World, region_of

#: One term: ``field op value``, op ``=``/``!=`` (exact) or ``eq``/``ne`` (RE2, whole value), the value
#: bare or double-quoted (with backslash escapes).
_TERM = r'\s*([A-Za-z][A-Za-z0-9_.]*)\s*(!=|=|\beq\b|\bne\b)\s*("(?:[^"\\]|\\.)*"|[^\s()"]+)\s*'
_TERM_RE = re.compile(_TERM)
_PAREN_RE = re.compile(rf"\s*\({_TERM}\)\s*")


def _terms(filter_text: str) -> list[tuple[str, str, str]]:
    """The AND'ed terms of a filter: one bare term, or several each in parentheses (Compute's form,
    what gcloud's filter rewriter sends). OR, NOT and ``:`` are refused here (stricter than Google)."""
    text = filter_text.strip()
    found = []
    if text.startswith("("):
        at = 0
        while at < len(text):
            match = _PAREN_RE.match(text, at)
            if match is None:
                raise invalid_field("filter", filter_text, "Invalid list filter expression.")
            found.append(match)
            at = match.end()
    else:
        match = _TERM_RE.fullmatch(text)
        if match is None:
            raise invalid_field("filter", filter_text, "Invalid list filter expression.")
        found.append(match)
    out = []
    for match in found:
        field, op, value = match.group(1, 2, 3)
        if value.startswith('"'):
            value = value[1:-1].replace('\\"', '"')
        out.append((field, op, value))
    return out


def _field(item: Mapping[str, Any], dotted: str) -> str:
    value: Any = item
    for key in dotted.split("."):
        value = value.get(key) if isinstance(value, Mapping) else None
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def _term_holds(item: Mapping[str, Any], field: str, op: str, value: str) -> bool:
    actual = _field(item, field)
    if op in ("=", "!="):
        # '=' compares the literal; a quoted literal keeps its backslashes as written.
        return (actual == value.replace("\\\\", "\\")) == (op == "=")
    try:
        # eq/ne: the literal is an RE2 pattern that must match the whole value (Compute's docs;
        # gcloud sends ``operationType eq ".*\bcompute\.instances\.preempted\b.*"``).
        return (re.fullmatch(value, actual) is not None) == (op == "eq")
    except re.error:
        raise invalid_field("filter", value, "Invalid regular expression.") from None


def matches(item: Mapping[str, Any], filter_text: str) -> bool:
    """Whether ``item`` passes Compute's list ``filter`` (empty: everything passes)."""
    if not filter_text.strip():
        return True
    return all(_term_holds(item, *term) for term in _terms(filter_text))


@dataclass(frozen=True)
class ListQuery:
    """A list request's query: ``filter``, ``maxResults`` (0: all), ``pageToken``,
    ``returnPartialSuccess`` (accepted; nothing here is ever unreachable, so it changes nothing) and
    aggregated lists' ``includeAllScopes``."""

    filter_text: str = ""
    page_size: int = 0
    page_token: str = ""
    partial_success: bool = False
    all_scopes: bool = False

    @classmethod
    def of(cls, query: Mapping[str, Sequence[str]]) -> ListQuery:
        def one(key: str) -> str:
            values = query.get(key) or [""]
            return values[0]

        raw_size = one("maxResults") or "0"
        if not raw_size.isdigit():
            raise invalid_field("maxResults", raw_size, "Must be an integer.")
        flags = {key: one(key) for key in ("returnPartialSuccess", "includeAllScopes")}
        for key, raw in flags.items():
            if raw not in ("", "true", "false"):
                raise invalid_field(key, raw, "Must be a boolean.")
        return cls(
            one("filter"),
            int(raw_size),
            one("pageToken"),
            flags["returnPartialSuccess"] == "true",
            flags["includeAllScopes"] == "true",
        )


def zone_scopes(world: World) -> list[str]:
    return [f"zones/{z}" for z in sorted(world.zones)]


def region_scopes(world: World) -> list[str]:
    return [f"regions/{r}" for r in sorted({region_of(z) for z in world.zones})]


def aggregated(
    *,
    kind: str,
    project: str,
    collection: str,
    scopes: Sequence[str],
    items: Sequence[tuple[str, dict[str, Any]]],
    query: ListQuery,
) -> dict[str, Any]:
    """An aggregated list: ``items`` is (scope, resource) pairs in order; every one of ``scopes``
    appears in the answer (Google lists them all), with its resources on this page or a
    NO_RESULTS_ON_PAGE warning. Pages run across scopes."""
    kept = [(scope, item) for scope, item in items if matches(item, query.filter_text)]
    page, next_token = paginate(kept, query.page_size, query.page_token)
    scoped: dict[str, Any] = {}
    for scope in scopes:
        mine = [item for where, item in page if where == scope]
        scoped[scope] = {collection: mine} if mine else {"warning": no_results(scope)}
    out: dict[str, Any] = {
        "kind": kind,
        "id": f"projects/{project}/aggregated/{collection}",
        "items": scoped,
        "selfLink": links.link(project, "aggregated", collection),
    }
    if next_token:
        out["nextPageToken"] = next_token
    return out


def no_results(scope: str) -> dict[str, Any]:
    return {
        "code": "NO_RESULTS_ON_PAGE",
        "message": f"There are no results for scope '{scope}' on this page.",
        "data": [{"key": "scope", "value": scope}],
    }

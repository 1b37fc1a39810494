"""Compute Engine's names on the wire: self links, partial URLs, ids, timestamps and Durations."""

from __future__ import annotations

import hashlib
import re
from typing import Any

from tpuctl.sim.compute.errors import invalid_field
from tpuctl.sim.wire import rfc3339

#: Google's self links name its own host whatever endpoint the client used.
BASE = "https://www.googleapis.com/compute/v1/"
NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")


def link(project: str, *parts: str) -> str:
    """``https://www.googleapis.com/compute/v1/projects/P/<parts...>``."""
    return BASE + "/".join(("projects", project, *parts))


def path(project: str, *parts: str) -> str:
    """The relative name errors quote: ``projects/P/<parts...>``."""
    return "/".join(("projects", project, *parts))


def zone_link(project: str, zone: str) -> str:
    return link(project, "zones", zone)


def region_link(project: str, region: str) -> str:
    return link(project, "regions", region)


def short_name(value: str) -> str:
    """The last segment of a full or partial URL (or the name itself)."""
    return value.rstrip("/").rsplit("/", 1)[-1]


def resource_id(*parts: object) -> str:
    """A stable uint64 id (as Compute's JSON writes it, a string) for a resource."""
    digest = hashlib.sha256(":".join(map(str, parts)).encode()).digest()
    return str(10**18 + int.from_bytes(digest[:8], "big") % (8 * 10**18))


def timestamp(ts: float) -> str:
    return rfc3339(ts)


def check_name(name: Any, field: str = "resource.name") -> str:
    if not isinstance(name, str) or not NAME_RE.match(name):
        raise invalid_field(
            field,
            name,
            "Must be a match of regex '(?:[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?)'",
        )
    return name


def duration_seconds(value: Any, field: str) -> float:
    """A Duration in Compute's JSON form, ``{"seconds": "N", "nanos": n}``
    (docs/google-facts.md#instance-requests)."""
    if not isinstance(value, dict):
        raise invalid_field(field, value, "A Duration is an object with 'seconds' and 'nanos'.")
    try:
        seconds = int(value.get("seconds", 0))
        nanos = int(value.get("nanos", 0))
    except (TypeError, ValueError):
        raise invalid_field(field, value, "A Duration's seconds and nanos are integers.") from None
    return seconds + nanos / 1e9


def duration_json(seconds: float) -> dict[str, Any]:
    whole = int(seconds)
    out: dict[str, Any] = {"seconds": str(whole)}
    nanos = round((seconds - whole) * 1e9)
    if nanos:
        out["nanos"] = nanos
    return out

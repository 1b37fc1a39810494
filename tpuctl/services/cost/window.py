"""A report's inputs: the grouping, the number of groups kept, and the window ``[since, until)`` in UTC."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Final

from tpuctl.errors import UsageError
from tpuctl.timefmt import iso_or_none

GROUP_BY_CHOICES: Final = (
    "slice", "run", "workspace", "user", "zone", "region", "type", "capacity", "day", "label:KEY",
)  # fmt: skip
_LABEL_KEY_RE = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
_DURATION_PART_RE = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*(w|d|h|m|s)")
_DURATION_UNITS = {"w": 604800.0, "d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
_TIME_FIX = (
    "use a date (2026-11-01), a UTC time (2026-11-01T12:00 or 2026-11-01T12:00:00Z), a time with an "
    "offset (2026-11-01T12:00+02:00), a duration ago (7d, 12h, 1h30m), or today, yesterday, month, now"
)


@dataclass(frozen=True)
class GroupBy:
    kind: str  # slice | run | workspace | user | zone | region | type | capacity | day | label
    label_key: str | None = None

    @property
    def name(self) -> str:
        return f"label:{self.label_key}" if self.kind == "label" else self.kind


def parse_group_by(value: str | None) -> GroupBy:
    """``slice|run|workspace|user|zone|region|type|capacity|day|label:KEY`` (default slice) ->
    ``GroupBy``."""
    if value is None:
        return GroupBy("slice")
    text = value.strip()
    fix = "use one of: " + ", ".join(GROUP_BY_CHOICES) + " (e.g. --group-by label:team)"
    if text.lower().startswith("label:"):
        key = text.split(":", 1)[1]  # as given: label keys are case-sensitive (and lowercase on GCP)
        if not _LABEL_KEY_RE.match(key):
            raise UsageError(
                f"--group-by {value!r}: {key!r} is not a label key",
                field="group_by",
                value=value,
                fix="a label key is lowercase letters, digits, - and _, starting with a letter, "
                "e.g. --group-by label:team",
            )
        return GroupBy("label", key)
    kind = text.lower()
    if kind not in GROUP_BY_CHOICES or kind == "label:key":
        raise UsageError(f"unknown --group-by {value!r}", field="group_by", value=value, fix=fix)
    return GroupBy(kind)


#: Groups the table shows by default (the costliest); machine formats list every group unless --limit.
DEFAULT_TABLE_LIMIT: Final = 50


def parse_limit(value: str | None, *, table: bool) -> int | None:
    """``--limit N`` -> the number of groups to keep (None: all). N is a whole number >= 0, 0 meaning
    all; without it the table keeps ``DEFAULT_TABLE_LIMIT`` (hundreds of thousands of slices do not make
    a readable table) and JSON/YAML/CSV keep every group (a script wants them all)."""
    if value is None:
        return DEFAULT_TABLE_LIMIT if table else None
    text = value.strip()
    if not text.isdigit():
        raise UsageError(
            f"--limit {value!r} is not a whole number >= 0",
            field="limit",
            value=value,
            fix="give how many of the costliest groups to show, e.g. --limit 20, or --limit 0 for all",
        )
    return int(text) or None


def parse_instant(value: str, *, field_name: str, now: float) -> float:
    """A point in time as epoch seconds. Naive dates and times are UTC (cost reports are in UTC days)."""
    text = value.strip()
    lowered = text.lower()
    today = datetime.fromtimestamp(now, UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    named = {
        "now": now,
        "today": today.timestamp(),
        "yesterday": (today - timedelta(days=1)).timestamp(),
        "month": today.replace(day=1).timestamp(),
    }
    if lowered in named:
        return named[lowered]
    if lowered and re.fullmatch(r"(\s*[0-9]+(\.[0-9]+)?\s*[wdhms])+\s*", lowered):
        return now - sum(float(n) * _DURATION_UNITS[u] for n, u in _DURATION_PART_RE.findall(lowered))
    try:
        if re.fullmatch(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", text):
            day = date.fromisoformat(text)
            return datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp()
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise UsageError(
            f"cannot parse {field_name} {value!r} as a date or time",
            field=field_name,
            value=value,
            fix=_TIME_FIX,
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def parse_window(since: str | None, until: str | None, *, now: float) -> tuple[float | None, float]:
    """``--since``/``--until`` -> ``(since or None, until)``; until defaults to now. since >= until is an
    error (exit 2) naming both values."""
    start = None if since is None else parse_instant(since, field_name="since", now=now)
    end = now if until is None else parse_instant(until, field_name="until", now=now)
    if start is not None and start >= end:
        raise UsageError(
            f"--since {since!r} ({iso(start)}) is not before --until {until or 'now'!r} ({iso(end)})",
            field="since",
            value=since,
            fix="give a --since earlier than --until (the window is [since, until), in UTC)",
        )
    return start, end


def iso(ts: float | None) -> str | None:
    return iso_or_none(ts)

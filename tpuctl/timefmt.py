"""Instants as tpuctl writes them, in every output and file: ISO 8601 in UTC with a ``Z``, to the second,
or to the millisecond where a fraction of a second matters (a run's host lines, segments and detection
latencies)."""

from __future__ import annotations

from datetime import UTC, datetime


def iso(ts: float, *, milliseconds: bool = False) -> str:
    """``ts`` (epoch seconds) as ``2026-11-24T15:53:29Z`` (or ``...29.123Z``)."""
    spec = "milliseconds" if milliseconds else "seconds"
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec=spec).replace("+00:00", "Z")


def iso_or_none(ts: float | None, *, milliseconds: bool = False) -> str | None:
    """``iso(ts)``, and None for an instant that is not known."""
    return None if ts is None else iso(ts, milliseconds=milliseconds)

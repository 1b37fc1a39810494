"""One way to write an instant: ISO 8601 UTC with a Z, to the second or the millisecond."""

from __future__ import annotations

from tpuctl.timefmt import iso, iso_or_none

T = 1_795_530_209.1237  # 2026-11-24T14:23:29.1237Z: milliseconds truncate, as isoformat does


def test_seconds_and_milliseconds_in_utc_with_a_z() -> None:
    assert iso(T) == "2026-11-24T14:23:29Z"
    assert iso(T, milliseconds=True) == "2026-11-24T14:23:29.123Z"


def test_an_unknown_instant_stays_unknown() -> None:
    assert iso_or_none(None) is None
    assert iso_or_none(T) == "2026-11-24T14:23:29Z"

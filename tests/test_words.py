"""Counts in words: one host, four hosts, never "1 hosts"."""

from __future__ import annotations

from tpuctl.words import counted


def test_the_noun_is_plural_unless_the_count_is_one() -> None:
    assert [counted(n, "host") for n in (0, 1, 2, 16)] == ["0 hosts", "1 host", "2 hosts", "16 hosts"]
    assert counted(1, "entry", "entries") == "1 entry"
    assert counted(3, "entry", "entries") == "3 entries"

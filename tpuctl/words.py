"""Counts in words people read: ``1 host``, ``4 hosts``."""

from __future__ import annotations


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """``count`` and ``noun``, the noun plural unless the count is one; ``plural`` where adding an "s"
    would be wrong (``counted(n, "entry", "entries")``)."""
    return f"{count} {noun if count == 1 else (plural or noun + 's')}"

"""Who held a run when, read back from its lease history: the check that no two owners ever held one run
at the same moment.

A claim (or a takeover) starts a hold at its time; the hold lasts until its release, or else until the
last expiry any of its renewals reached (``Ledger.lease_history`` folds a claim's consecutive renewals
into one row carrying the latest expiry). A loss ends nothing earlier than that expiry: the holder found
out late, and until then it may have been acting. Every time is the ledger's clock, so the holds of
owners on different machines compare directly.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tpuctl.store.records import LeaseAction, LeaseHistoryRecord
from tpuctl.timefmt import iso


@dataclass(frozen=True, slots=True)
class Hold:
    """One claim's hold on a run: ``owner_id`` held generation ``generation`` from ``start`` until
    ``end`` (the ledger's clock)."""

    run_id: str
    owner_id: str
    generation: int
    start: float
    end: float

    def overlaps(self, other: Hold) -> bool:
        # Half-open: a takeover exactly at the previous holder's expiry is allowed (a claim takes a lease
        # whose expires_at <= now), and so one that starts where a release ended.
        return self.start < other.end and other.start < self.end

    def describe(self) -> str:
        return (
            f"{self.owner_id} (generation {self.generation}) from {iso(self.start, milliseconds=True)} "
            f"to {iso(self.end, milliseconds=True)}"
        )


def holds(history: Iterable[LeaseHistoryRecord]) -> list[Hold]:
    """Every claim's hold in one run's history, in the history's order. Renewals, losses and releases
    are matched to their claim by generation (each claim of a run has its own)."""
    started: dict[int, LeaseHistoryRecord] = {}
    ends: dict[int, float] = {}
    released: dict[int, float] = {}
    for record in history:
        action = record.action
        if action in (LeaseAction.CLAIM, LeaseAction.TAKEOVER):
            started[record.generation] = record
            ends[record.generation] = _expiry(record)
        elif action == LeaseAction.RENEW:
            ends[record.generation] = max(ends.get(record.generation, record.at), _expiry(record))
        elif action == LeaseAction.RELEASE:
            released[record.generation] = record.at
    return [
        Hold(
            run_id=claim.run_id,
            owner_id=claim.owner.owner_id,
            generation=generation,
            start=claim.at,
            end=released.get(generation, ends[generation]),
        )
        for generation, claim in started.items()
    ]


def overlapping(found: Sequence[Hold]) -> list[tuple[Hold, Hold]]:
    """The pairs of holds on one run by two different owners that overlap in time."""
    return [
        (a, b)
        for a, b in itertools.combinations(found, 2)
        if a.run_id == b.run_id and a.owner_id != b.owner_id and a.overlaps(b)
    ]


def assert_one_holder_at_a_time(histories: Iterable[Sequence[LeaseHistoryRecord]]) -> list[Hold]:
    """Every hold of the given runs' histories (one history per run), after checking that no two owners'
    holds on one run overlap; an ``AssertionError`` naming each overlap otherwise."""
    every: list[Hold] = []
    clashes: list[str] = []
    for history in histories:
        found = holds(history)
        every.extend(found)
        clashes.extend(f"run {a.run_id}: {a.describe()} and {b.describe()}" for a, b in overlapping(found))
    if clashes:
        raise AssertionError("two owners held a run at once:\n  " + "\n  ".join(clashes))
    return every


def _expiry(record: LeaseHistoryRecord) -> float:
    if record.expires_at is None:
        raise ValueError(f"lease history row {record.id} ({record.action}) has no expiry")
    return record.expires_at

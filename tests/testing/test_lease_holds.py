"""The lease-history check: each claim's hold runs from its claim to its release or its last expiry, and
two owners' holds on one run must not overlap."""

from __future__ import annotations

from typing import Any

import pytest

from tpuctl.store.records import LeaseAction, LeaseHistoryRecord, LeaseOwner
from tpuctl.testing.lease_holds import Hold, assert_one_holder_at_a_time, holds

A = LeaseOwner("owner-a", "host-a", 1, None)
B = LeaseOwner("owner-b", "host-b", 2, None)


def history(*rows: tuple[float, LeaseAction, LeaseOwner, int, float | None], run: str = "r1") -> list[Any]:
    return [
        LeaseHistoryRecord(i, run, at, action, owner, generation, expires_at, None)
        for i, (at, action, owner, generation, expires_at) in enumerate(rows, 1)
    ]


def test_a_hold_lasts_until_its_release_or_its_last_renewals_expiry() -> None:
    found = holds(
        history(
            (100.0, LeaseAction.CLAIM, A, 1, 130.0),
            (160.0, LeaseAction.RENEW, A, 1, 190.0),  # the fold of the claim's renewals: the latest expiry
            (170.0, LeaseAction.RELEASE, A, 1, None),
            (171.0, LeaseAction.CLAIM, B, 2, 201.0),
            (230.0, LeaseAction.LOST, B, 2, None),  # found late: the hold still ended at its expiry
            (230.0, LeaseAction.TAKEOVER, A, 3, 260.0),
        )
    )
    assert found == [
        Hold("r1", "owner-a", 1, 100.0, 170.0),
        Hold("r1", "owner-b", 2, 171.0, 201.0),
        Hold("r1", "owner-a", 3, 230.0, 260.0),
    ]


def test_handovers_at_the_expiry_or_after_a_release_pass() -> None:
    one = history(
        (100.0, LeaseAction.CLAIM, A, 1, 130.0),
        (130.0, LeaseAction.TAKEOVER, B, 2, 160.0),  # exactly at A's expiry: allowed
        (150.0, LeaseAction.RELEASE, B, 2, None),
        (150.0, LeaseAction.CLAIM, A, 3, 180.0),
    )
    other_run = history((120.0, LeaseAction.CLAIM, B, 1, 150.0), run="r2")  # another run: no clash
    found = assert_one_holder_at_a_time([one, other_run])
    assert [(h.run_id, h.owner_id, h.start, h.end) for h in found] == [
        ("r1", "owner-a", 100.0, 130.0),
        ("r1", "owner-b", 130.0, 150.0),
        ("r1", "owner-a", 150.0, 180.0),
        ("r2", "owner-b", 120.0, 150.0),
    ]


def test_a_takeover_before_the_renewed_expiry_is_an_overlap() -> None:
    clash = history(
        (100.0, LeaseAction.CLAIM, A, 1, 130.0),
        (125.0, LeaseAction.RENEW, A, 1, 155.0),  # A renewed in time: held until 155
        (140.0, LeaseAction.TAKEOVER, B, 2, 170.0),  # B took it at 140, while A still held it
    )
    with pytest.raises(
        AssertionError, match=r"run r1: owner-a \(generation 1\) .* and owner-b \(generation 2\)"
    ):
        assert_one_holder_at_a_time([clash])

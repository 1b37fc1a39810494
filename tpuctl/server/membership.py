"""This server's place among the servers of its ledger (``Ledger.claim_replica``): claimed at start,
renewed by the replica loop, given back at a clean stop. A ledger that takes one server refuses a second
(exit 2, naming the first); a first server that was killed keeps its place until its claim expires,
unless it ran on this host and its process is provably gone (the pid and start time no longer match),
which this server checks before giving up: a crashed server is replaced at once, a live one never."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from tpuctl.store.servers import ReplicaLimitError

if TYPE_CHECKING:
    from tpuctl.store.ledger import Ledger
    from tpuctl.store.records import LeaseOwner
    from tpuctl.store.servers import ReplicaRecord


def join(ledger: Ledger, owner: LeaseOwner, listen: str, ttl_s: float) -> ReplicaRecord:
    """Take this server's place; ``ReplicaLimitError`` (exit 2) while the ledger's live servers fill it."""
    try:
        return ledger.claim_replica(owner, listen, ttl_s)
    except ReplicaLimitError as full:
        dead = frozenset(r.owner.owner_id for r in full.others if _gone(r))
        if not dead:
            raise
        return ledger.claim_replica(owner, listen, ttl_s, replacing=dead)


def _gone(replica: ReplicaRecord) -> bool:
    """Provably dead: it ran on this host and no live process has its pid and start time."""
    from tpuctl.processes import is_same_process

    owner = replica.owner
    if owner.host != os.uname().nodename or owner.start_ticks is None:
        return False
    return not is_same_process(owner.pid, owner.start_ticks)

"""A ledger writer run as a separate process by the concurrency and kill tests.

    python ledger_writer.py STATE_DIR count TAG N     # N single events for pods of TAG, then exit 0
    python ledger_writer.py STATE_DIR forever TAG     # write until killed; "ready" on stdout first

``forever`` mixes the three write shapes a tpuctl process makes: a lifecycle event that moves the pods
view, a placement attempt (attempt row + event), and a bulk batch of ``BATCH`` events whose details all
carry the batch id, so the test can check that every batch is either wholly present or wholly absent.
Every event's detail carries ``check`` = a function of its other fields, so a torn row would show.
"""

from __future__ import annotations

import itertools
import sys

from tpuctl.catalog import CapacityType
from tpuctl.store import AttemptOutcome, EventKind, Ledger, NewEvent

BATCH = 20
ZONES = ("us-central1-a", "europe-west4-b")
LIFECYCLE = (EventKind.REQUESTED, EventKind.CREATED, EventKind.READY, EventKind.DELETED)


def check_value(kind: str, pod: str, zone: str, seq: int) -> str:
    return f"{kind}|{pod}|{zone}|{seq}"


def write_count(state_dir: str, tag: str, n: int) -> None:
    with Ledger(state_dir) as ledger:
        for i in range(n):
            kind = LIFECYCLE[i % len(LIFECYCLE)]
            pod = f"{tag}-{i // len(LIFECYCLE)}"
            zone = ZONES[(i // len(LIFECYCLE)) % 2]
            ledger.record_event(
                kind,
                pod=pod,
                zone=zone,
                chips=4,
                capacity=CapacityType.SPOT,
                price_per_chip_hour=1.0,
                detail={"tag": tag, "seq": i, "check": check_value(kind, pod, zone, i)},
            )


def write_forever(state_dir: str, tag: str) -> None:
    with Ledger(state_dir) as ledger:
        print("ready", flush=True)
        for seq in itertools.count():
            shape = seq % 3
            pod = f"{tag}-{seq // 12}"
            zone = ZONES[seq % 2]
            if shape == 0:
                kind = LIFECYCLE[(seq // 3) % len(LIFECYCLE)]
                ledger.record_event(
                    kind,
                    pod=pod,
                    zone=zone,
                    chips=8,
                    price_per_chip_hour=0.5,
                    detail={"seq": seq, "check": check_value(kind, pod, zone, seq)},
                )
            elif shape == 1:
                ledger.record_attempt(
                    f"req-{tag}-{seq}",
                    zone=zone,
                    outcome=AttemptOutcome.STOCKOUT,
                    pod=pod,
                    detail={"seq": seq, "check": check_value("attempt", pod, zone, seq)},
                )
            else:
                batch = f"{tag}-b{seq}"
                ledger.record_events_bulk(
                    NewEvent(
                        EventKind.GC,
                        pod=f"{batch}-{i}",
                        zone=zone,
                        detail={
                            "batch": batch,
                            "size": BATCH,
                            "check": check_value("gc", f"{batch}-{i}", zone, seq),
                        },
                    )
                    for i in range(BATCH)
                )


def main(argv: list[str]) -> None:
    state_dir, mode, tag = argv[1], argv[2], argv[3]
    if mode == "count":
        write_count(state_dir, tag, int(argv[4]))
    elif mode == "forever":
        write_forever(state_dir, tag)
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv)

"""The server's queue end to end, one-host runs of a tiny program on the served simulator: a workspace
of 16 v5e chips takes two v5e-8 runs; the third waits QUEUED with the exact reason (`tpuctl queue` shows
it first) and starts when one of the two ends; `runs describe` then says how long it waited and why. A
v5e-32 can never fit: refused at once, exit 3."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from server_place import ZONE, Place, ended_under, make_place, output

from tpuctl.errors import EXIT_INFEASIBLE
from tpuctl.sim import SimAdminClient
from tpuctl.store.records import RunStatus
from tpuctl.testing.clock import wait_for

#: Waits to be cancelled, given "wait"; ends at once otherwise.
PROGRAM = """
import sys, time
print("started", flush=True)
while sys.argv[1:] == ["wait"]:
    time.sleep(0.1)
"""
FULL = "workspace default: 16 of 16 v5e chips in use"


@pytest.fixture
def queue_place(tmp_path: Path, serve_sim: Callable[..., SimAdminClient]) -> Iterator[Place]:
    yield from make_place(
        tmp_path, serve_sim, f"sqlite:///{tmp_path / 'team' / 'ledger.db'}", program=PROGRAM
    )


def submit(place: Place, *args: str, accelerator: str = "v5e-8") -> tuple[int, str]:
    argv = ("run", str(place.script), "--type", accelerator, "--zone", ZONE, "--no-runtime-deps", "--detach")
    client = place.client(*argv, "-o", "json", "--", *args)
    return client.wait(timeout=120), client.communicate(timeout=10)[0].decode()


def run_id_of(said: str) -> str:
    return str(json.loads(said[said.index("{") :])["run"]["run_id"])


@pytest.mark.slow  # ~35 s: three runs and eight client processes (its pieces are default-suite tests)
def test_the_third_run_waits_for_room_and_starts_when_one_ends(queue_place: Place, tmp_path: Path) -> None:
    workspaces = tmp_path / "workspaces.yaml"
    workspaces.write_text(
        "workspaces:\n  default:\n    chips:\n      v5e: 16\n    members:\n      a1@example.com: member\n"
    )
    server = queue_place.start_server("--workspaces", str(workspaces))
    place = queue_place.signed_in("a1@example.com", tmp_path)  # a team server takes a member's ID token

    code, said = submit(place, accelerator="v5e-32")
    assert code == EXIT_INFEASIBLE, said
    assert "the run needs 32 v5e chips, more than workspace default may ever hold at once (16)" in said

    first, second = (run_id_of(submit(place, "wait")[1]) for _ in range(2))
    code, said = submit(place)
    assert code == 0, said
    third = run_id_of(said)

    def statuses() -> dict[str, tuple[str, str | None]]:
        assert server.poll() is None, output(server)
        with place.ledger() as ledger:
            return {r.run_id: (str(r.status), r.queue_reason) for r in ledger.list_runs()}

    def waiting_for_room() -> bool:
        now = statuses()
        return now[third] == ("queued", FULL) and now[first][0] == now[second][0] == "running"

    wait_for(waiting_for_room, timeout=120.0, interval=0.2, what="two runs running and the third waiting")
    listed = place.client("queue", "-o", "json")
    shown = json.loads(listed.communicate(timeout=60)[0].decode())["queue"]
    assert [(q["position"], q["run_id"], q["reason"]) for q in shown] == [(1, third, FULL)]

    cancelled = place.client("runs", "cancel", first)
    assert cancelled.wait(timeout=120) == 0, output(cancelled)
    assert ended_under(place, server, third) is RunStatus.SUCCEEDED
    described = place.client("runs", "describe", third, "-o", "json")
    queue = json.loads(described.communicate(timeout=60)[0].decode())["run"]["queue"]
    assert queue["reason"] == FULL and queue["admitted_at"] is not None and queue["waited_s"] > 0

    cancelled = place.client("runs", "cancel", second)
    assert cancelled.wait(timeout=120) == 0, output(cancelled)

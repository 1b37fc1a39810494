"""The read-only commands through a `tpuctl server` (``--server URL``) print the same JSON documents as
in local mode on the same ledger and simulator: the server's app in process (FastAPI's test client),
reached by the CLI's own client; and a command whose path the server does not serve is exit 2, naming
the command."""

from __future__ import annotations

import json
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tpuctl.cli import remote
from tpuctl.client.api import ServerClient
from tpuctl.server.app import build_app
from tpuctl.server.bundles import BundleStore
from tpuctl.services.session import open_session
from tpuctl.settings import load_settings
from tpuctl.testing.backend import InProcessCli
from tpuctl.testing.cli import CliResult

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # starlette's note on which httpx it prefers, at import
    from fastapi.testclient import TestClient

ZONE = "us-central1-a"
SERVER = "http://server.test"
WORLD: dict[str, Any] = {
    "project": "tpuctl-sim",
    "speed": 1000,
    "seed": 3,
    "zones": {ZONE: {"v5e": {"on_demand": 64, "preemptible": 64}}},
    "quotas": {
        "default": {"on_demand": {"zone": 64, "region": 64}, "preemptible": {"zone": 64, "region": 64}}
    },
    "latency": {"base_ms": 0, "jitter_ms": 0},
    "durations": {"node_create_s": 60, "node_delete_s": 10, "preemption_grace_s": 1},
}


@pytest.fixture
def sim_world() -> dict[str, Any]:
    return WORLD


@pytest.fixture
def app(sim_cli: InProcessCli, state_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    """A server on the CLI's simulator and ledger; ``--server SERVER`` reaches it."""
    settings = load_settings({"backend": "sim", "state_dir": state_dir})
    with open_session(settings, backend=sim_cli.backend) as session:
        client = TestClient(build_app(session, BundleStore(state_dir / "bundles"), None))
        monkeypatch.setattr(remote, "client", lambda url: ServerClient(url, transport=client._transport))
        yield client


def both(sim_cli: InProcessCli, *args: str) -> tuple[CliResult, CliResult]:
    """``tpuctl ARGS -o json`` here and through the server, each exit 0."""
    local = sim_cli(*args, "-o", "json")
    served = sim_cli("--server", SERVER, *args, "-o", "json")
    assert local.code == 0, local.output
    assert served.code == 0, served.output
    return local, served


@pytest.fixture
def billed(sim_cli: InProcessCli) -> None:
    """A spot slice on the ledger, ten minutes billed."""
    created = sim_cli("pod", "create", "v5e-8", "--spot", "--name", "a", "--zone", ZONE, "-o", "json")
    assert created.code == 0, created.output
    sim_cli.clock.advance(600)


@pytest.mark.usefixtures("app", "billed")
def test_reads_through_a_server_are_the_local_documents(sim_cli: InProcessCli) -> None:
    local, served = both(sim_cli, "cost", "report", "--group-by", "run")
    assert served.json == local.json
    assert served.json["totals"]["cost_usd"] > 0 and served.json["backend"] == "sim"
    for args in (("pod", "list"), ("pod", "describe", "a"), ("quota",), ("catalog", "prices"),
                 ("cost", "estimate", "v5e-8", "--hours", "2")):  # fmt: skip
        local, served = both(sim_cli, *args)
        assert served.json == local.json, args
    # By slice (the default), offline, over a window, the costliest group only.
    local, served = both(sim_cli, "cost", "report", "--no-reconcile", "--since", "1d", "--limit", "1")
    # Offline, this machine contacts no cloud and so names no project; the server names its own.
    here, there = local.json, served.json
    assert (here.pop("project"), there.pop("project")) == ("(not contacted)", "tpuctl-sim")
    assert there == here and len(there["groups"]) == 1


@pytest.mark.usefixtures("app")
def test_errors_through_a_server_exit_as_local_ones(sim_cli: InProcessCli) -> None:
    local = sim_cli("pod", "describe", "nope", "--zone", ZONE, "-o", "json")
    served = sim_cli("--server", SERVER, "pod", "describe", "nope", "--zone", ZONE, "-o", "json")
    assert (served.code, served.json["error"]) == (local.code, local.json["error"]) == (11, "not_found")
    assert served.json["message"] == local.json["message"]
    refused = sim_cli("--server", SERVER, "catalog", "prices", "--refresh")
    assert refused.code == 2 and "not carried through a tpuctl server" in refused.stderr


def test_a_path_the_server_does_not_serve_names_the_command(
    app: TestClient, sim_cli: InProcessCli, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        ServerClient, "quota", lambda self: self._call(dict, "GET", "/v1/no-such", command="quota")
    )
    refused = sim_cli("--server", SERVER, "quota", "-o", "json")
    assert refused.code == 2, refused.output
    assert refused.json["error"] == "usage" and "does not serve `quota`" in refused.json["message"]


@pytest.mark.slow
@pytest.mark.usefixtures("app")
def test_pod_create_delete_and_gc_through_a_server(sim_cli: InProcessCli, state_dir: Path) -> None:
    from tpuctl.store.ledger import Ledger

    args = ("pod", "create", "v5e-8", "--name", "c", "--zone", ZONE, "--spot", "--dry-run")
    local, served = both(sim_cli, *args)
    # The request id is the one thing that differs: the server's comes from the request's idempotency key.
    mine, its = local.json["plan"]["request"]["request_id"], served.json["plan"]["request"]["request_id"]
    assert mine != its and json.loads(local.stdout.replace(mine, its)) == served.json
    assert served.json["plan"]["verdict"] == "feasible"

    created = sim_cli("--server", SERVER, *args[:-1], "-o", "json")
    assert created.code == 0, created.output
    assert created.json["pod"]["name"] == "c" and created.json["placement"]["zone"] == ZONE
    with Ledger(state_dir) as ledger:
        (pod,) = ledger.list_pods(alive=True)
    assert (pod.name, pod.request_id) == ("c", created.json["placement"]["request_id"])

    refused = sim_cli("--server", SERVER, "pod", "delete", "c", "--zone", ZONE)  # no terminal to ask on
    assert refused.code == 2 and "pass -y to confirm" in refused.stderr
    deleted = sim_cli("--server", SERVER, "pod", "delete", "c", "--zone", ZONE, "-y", "-o", "json")
    assert deleted.code == 0, deleted.output
    assert deleted.json["deleted"] == [{"name": "c", "zone": ZONE}]
    assert sim_cli("pod", "list", "-o", "json").json["pods"] == []

    assert sim_cli("pod", "create", "v5e-8", "--spot", "--name", "g", "--zone", ZONE).code == 0
    sim_cli.admin.preempt(ZONE, "g", notice=False)  # now `pod gc` has a slice to collect
    local, served = both(sim_cli, "pod", "gc", "--dry-run")
    assert served.json == local.json and [g["name"] for g in served.json["gc"]] == ["g"]
    collected = sim_cli("--server", SERVER, "pod", "gc", "-y", "-o", "json")
    assert collected.code == 0, collected.output
    assert collected.json["deleted"] == ["g"] and sim_cli.cloud().list_nodes(None) == []

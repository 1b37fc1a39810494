"""`tpuctl server up|status|logs|down` at the command line: --dry-run plans, as text and as JSON; what is
refused before anything is asked of the cloud."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tpuctl.backends.sim import SIM_BUCKET
from tpuctl.testing.backend import InProcessCli
from tpuctl.testing.cli import Cli

GLOBAL = ("--backend", "gcp", "--project", "team-proj")


def test_up_dry_run_json_is_the_plan(cli: Cli) -> None:
    result = cli(
        *GLOBAL, "server", "up", "--zone", "us-central1-a", "--bucket", "team", "--dry-run", "-o", "json"
    )
    assert result.code == 0, result.stderr
    plan = json.loads(result.stdout)["plan"]
    assert plan["command"] == "up" and plan["machine_type"] == "e2-small"
    insert = plan["steps"][0]["request"]
    assert insert["method"] == "POST"
    assert (
        insert["url"]
        == "https://compute.googleapis.com/compute/v1/projects/team-proj/zones/us-central1-a/instances"
    )
    assert insert["body"]["scheduling"]["provisioningModel"] == "STANDARD"
    assert plan["backups"] == "gs://team/tpuctl-server/tpuctl-server/"
    assert plan["cost"]["total_usd_per_month"] == 17.88


def test_up_dry_run_text_says_how_to_reach_it_and_the_cost(cli: Cli) -> None:
    result = cli(*GLOBAL, "server", "up", "--zone", "us-central1-a", "--bucket", "team", "--dry-run")
    assert result.code == 0, result.stderr
    assert "--tunnel-through-iap -- -N -L 8471:127.0.0.1:8471" in result.stdout
    assert "cost: 17.88 USD per month at catalog prices" in result.stdout
    assert "Restart=on-failure" in result.stdout


def test_sqlite_without_a_bucket_is_refused(cli: Cli) -> None:
    result = cli(*GLOBAL, "server", "up", "--zone", "us-central1-a", "--dry-run")
    assert result.code == 2
    assert "needs the team bucket" in result.stderr


def test_an_unknown_machine_type_is_refused(cli: Cli) -> None:
    result = cli(
        *GLOBAL, "server", "up", "--zone", "us-central1-a", "--machine-type", "ct6e-standard-1t", "--dry-run"
    )
    assert result.code == 2
    assert "not a general-purpose type" in result.stderr


def test_up_plans_the_same_vm_units_and_commands_on_the_simulator_as_on_google(cli: Cli) -> None:
    """Nothing up puts on the VM says which cloud it is: the VM's own environment does (on the simulator,
    its logins'), so the insert body, the units and every command are the same text on both backends;
    only where the requests go differs."""

    def plan(backend: str, env: dict[str, str | None]) -> dict[str, Any]:
        result = cli(
            "--backend", backend, "--project", "team-proj", "server", "up", "--zone", "us-central1-a",
            "--bucket", "team", "--dry-run", "-o", "json", env=env,
        )  # fmt: skip
        assert result.code == 0, result.stderr
        document: dict[str, Any] = json.loads(result.stdout)["plan"]
        return document

    google = plan("gcp", {})
    sim = plan("sim", {"TPUCTL_SIM_URL": "http://127.0.0.1:8470"})
    assert sim["units"] == google["units"] and len(google["units"]) == 2
    assert [s.get("command") for s in sim["steps"]] == [s.get("command") for s in google["steps"]]
    assert [(s.get("request") or {}).get("body") for s in sim["steps"]] == [
        (s.get("request") or {}).get("body") for s in google["steps"]
    ]
    texts = [*google["units"].values(), *(s.get("command") or "" for s in google["steps"])]
    assert not [t for t in texts if "TPUCTL_BACKEND" in t or "TPUCTL_SIM_URL" in t]


def test_up_on_a_simulator_started_for_one_command_is_refused(cli: Cli) -> None:
    """The server on the VM keeps using the simulated cloud after up ends: only a served simulator
    keeps it up."""
    result = cli(
        "--backend", "sim", "--project", "p", "server", "up", "--zone", "us-central1-a", "--bucket", "t",
        env={"TPUCTL_SIM_URL": None},
    )  # fmt: skip
    assert result.code == 2
    assert "needs a served simulator" in result.stderr and "tpuctl sim serve" in result.stderr


def test_down_keeping_the_disk_is_a_plan_only(cli: Cli) -> None:
    result = cli(*GLOBAL, "server", "down", "--zone", "us-central1-a", "--bucket", "team", "--keep-disk")
    assert result.code == 2
    assert "--keep-disk is printed as a plan only" in result.stderr


def test_down_status_and_logs_plans(cli: Cli) -> None:
    down = cli(
        *GLOBAL,
        "server",
        "down",
        "--zone",
        "us-central1-a",
        "--bucket",
        "t",
        "--keep-disk",
        "--dry-run",
        "-o",
        "json",
    )
    assert down.code == 0, down.stderr
    steps = [s["what"] for s in json.loads(down.stdout)["plan"]["steps"]]
    assert steps[-2:] == ["keep the boot disk when the VM goes", "delete the VM"]
    status = cli(*GLOBAL, "server", "status", "--zone", "us-central1-a", "--dry-run", "-o", "json")
    assert status.code == 0, status.stderr
    assert "systemctl --user is-active tpuctl-server.service" in status.stdout
    logs = cli(*GLOBAL, "server", "logs", "--zone", "us-central1-a", "-f", "--dry-run", "-o", "json")
    assert logs.code == 0, logs.stderr
    assert (
        json.loads(logs.stdout)["plan"]["steps"][0]["command"]
        == "journalctl --user -u tpuctl-server.service --no-pager -f"
    )


def test_the_server_itself_still_takes_its_options(cli: Cli) -> None:
    result = cli("server", "--listen", "0.0.0.0:8471")
    assert result.code == 2 and "not a loopback address" in result.stderr


def test_backup_once_then_restore_onto_a_new_disk(sim_cli: InProcessCli, tmp_path: Path) -> None:
    """What the VM's units run: a copy of the live ledger to the bucket, and on a new VM the newest copy
    restored and reconciled before the server starts."""
    assert sim_cli("pod", "list").code == 0  # the ledger exists
    ledger = Path(sim_cli.backend.sim.state_dir) / "ledger.db"
    where = ("--bucket", SIM_BUCKET, "--prefix", "tpuctl-server/srv")
    copied = sim_cli("server", "backup", "--ledger", str(ledger), *where, "--once", "-o", "json")
    assert copied.code == 0, copied.stderr
    url = json.loads(copied.stdout)["url"]
    assert url.startswith(f"gs://{SIM_BUCKET}/tpuctl-server/srv/ledger-")
    restored_to = tmp_path / "new-vm" / "ledger.db"
    restored = sim_cli("server", "restore", "--ledger", str(restored_to), *where, "-o", "json")
    assert restored.code == 0, restored.stderr
    data = json.loads(restored.stdout)
    assert data["restored"]["url"] == url
    assert data["deleted_unknown"] == [] and data["recorded_gone"] == []
    assert restored_to.stat().st_size > 0
    nothing = sim_cli(
        "server",
        "restore",
        "--ledger",
        str(tmp_path / "x.db"),
        "--bucket",
        SIM_BUCKET,
        "--prefix",
        "none",
        "-o",
        "json",
    )
    assert nothing.code == 0 and json.loads(nothing.stdout)["restored"] is None

"""What server up|down|status|logs would do: the instances.insert body, the units, the steps."""

from __future__ import annotations

from tpuctl.hosts.service_unit import RestartPolicy, parse
from tpuctl.services.server_vm.plan import (
    LABEL_SERVER,
    ServerVmSpec,
    instance_body,
    plan_down,
    plan_up,
    server_unit,
)

BASE = "https://compute.googleapis.com"


def _spec(**changes: object) -> ServerVmSpec:
    fields: dict[str, object] = {"project": "p", "zone": "us-central1-a", "bucket": "team", **changes}
    return ServerVmSpec(**fields)  # type: ignore[arg-type]


def test_the_vm_is_standard_never_spot_and_live_migrates() -> None:
    body = instance_body(_spec())
    assert body["machineType"] == "projects/p/zones/us-central1-a/machineTypes/e2-small"
    assert body["scheduling"] == {
        "provisioningModel": "STANDARD",
        "preemptible": False,
        "automaticRestart": True,
        "onHostMaintenance": "MIGRATE",
    }
    assert body["serviceAccounts"][0]["scopes"] == ["https://www.googleapis.com/auth/cloud-platform"]
    assert body["labels"] == {LABEL_SERVER: "tpuctl-server"}
    assert "managed-by" not in body["labels"]  # no slice: pod gc must never take it for one


def test_up_restores_and_reconciles_before_the_units_start() -> None:
    plan = plan_up(_spec(), BASE)
    whats = [s.what for s in plan.steps]
    restore = next(i for i, w in enumerate(whats) if w.startswith("restore the newest ledger copy"))
    start = whats.index("start the units")
    assert restore < start
    assert plan.steps[0].request is not None
    assert plan.steps[0].request.url == f"{BASE}/compute/v1/projects/p/zones/us-central1-a/instances"
    assert set(plan.units) == {"tpuctl-server.service", "tpuctl-server-backup.service"}
    assert "--every 60" in plan.units["tpuctl-server-backup.service"]
    assert 'Environment="TPUCTL_PROJECT=p"' in plan.units["tpuctl-server-backup.service"]
    restore_command = plan.steps[restore].command
    assert restore_command is not None and "TPUCTL_PROJECT=p " in restore_command
    assert '"$HOME"/.local/share/tpuctl-server/env/bin/tpuctl server restore' in restore_command
    assert plan.steps[whats.index("start the units")].command == (
        'mkdir -p "$HOME/.local/state/tpuctl-server" && loginctl enable-linger && '
        "systemctl --user daemon-reload && systemctl --user enable --now "
        "tpuctl-server.service tpuctl-server-backup.service"
    )
    assert plan.reach[0].startswith("gcloud compute ssh tpuctl-server --zone us-central1-a --project p")
    assert "-L 8471:127.0.0.1:8471" in plan.reach[0]
    assert plan.cost is not None and plan.cost.total_usd == 17.88


def test_the_server_listens_on_loopback_and_restarts_on_failure() -> None:
    unit = parse("tpuctl-server", server_unit(_spec()).render())
    assert unit.exec_start[-3:] == ("server", "--listen", "127.0.0.1:8471")
    assert unit.restart is RestartPolicy.ON_FAILURE
    # A user unit: home-relative, the same text on Google and on a simulated VM (whose home is its disk).
    assert unit.environment["TPUCTL_DATABASE_URL"] == "sqlite:///%h/.local/state/tpuctl-server/ledger.db"
    assert unit.exec_start[0] == "%h/.local/share/tpuctl-server/env/bin/tpuctl"


def test_a_postgresql_url_is_not_copied_and_its_password_not_shown() -> None:
    spec = _spec(database="postgresql://srv:hunter2@db.internal/tpuctl", bucket=None)
    plan = plan_up(spec, BASE)
    assert list(plan.units) == ["tpuctl-server.service"]  # no copies
    assert not any(s.what.startswith("restore") for s in plan.steps)
    assert "hunter2" not in str(plan.to_dict())
    assert "hunter2" in server_unit(spec, reveal=True).render()  # only what goes onto the VM has it


def test_down_stops_then_takes_a_final_copy_then_deletes() -> None:
    plan = plan_down(_spec(), BASE, keep_disk=True)
    whats = [s.what for s in plan.steps]
    assert whats == [
        "stop the server",
        "stop the copies",
        "take a final copy of the stopped ledger",
        "keep the boot disk when the VM goes",
        "delete the VM",
    ]
    final = plan.steps[2].command
    assert final is not None and final.endswith("--prefix tpuctl-server/tpuctl-server --once")
    assert plan.steps[-1].request is not None and plan.steps[-1].request.method == "DELETE"

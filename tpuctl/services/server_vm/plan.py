"""What ``tpuctl server up|down|status|logs`` do, as data: the Compute Engine requests (the exact
``instances.insert`` body), the commands run on the VM over SSH, the unit files, how to reach the server
and what it costs. ``--dry-run`` prints these; nothing here calls anything.

The VM (docs/google-facts.md#server-vm): a general-purpose machine type with standard provisioning (never
spot: the server must outlive preemptions, it is what recovers the runs), live migration on host
maintenance, a balanced boot disk that holds the SQLite ledger, the project's default service account with
the cloud-platform scope (the server reaches the APIs with the VM's own credentials, from its metadata
server, as any tpuctl on Google does), and an external address for egress only (package installs): the
server listens on the VM's loopback, reached through an SSH port forward over IAP.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any, Final

from tpuctl import __version__
from tpuctl.catalog.server_vm_prices import ServerVmCost, server_vm_cost
from tpuctl.cloud.base import PlannedRequest
from tpuctl.hosts.service_unit import USER_UNIT_DIR, RestartPolicy, ServiceUnit
from tpuctl.hosts.setup import SetupSpec
from tpuctl.services.server_vm.backup import BACKUP_EVERY_S

DEFAULT_NAME: Final = "tpuctl-server"
DEFAULT_MACHINE_TYPE: Final = "e2-small"
DEFAULT_DISK_GB: Final = 20
SERVER_PORT: Final = 8471
#: Where the server keeps its state (its ledger, when SQLite), relative to the login user's home on the
#: VM's boot disk: the units are user units (``tpuctl.hosts.service_unit``), so every path is
#: home-relative (``%h/...`` in a unit, ``$HOME/...`` in a command).
STATE_SUBDIR: Final = ".local/state/tpuctl-server"
#: The link to the host setup's environment that holds the installed tpuctl (the environment's own path
#: hashes its inputs; the units name this link, which a later ``server up`` points at a newer one).
ENV_LINK: Final = ".local/share/tpuctl-server/env"
#: Where the wheel built on the laptop is copied on the VM.
WHEEL_SUBDIR: Final = ".tpuctl/wheels"
#: The label every server VM carries (its value: the server's name); not ``managed-by``: the VM is no
#: slice, and nothing that collects tpuctl's slices may take it for one.
LABEL_SERVER: Final = "tpuctl-server"
IMAGE_FAMILY: Final = "projects/debian-cloud/global/images/family/debian-12"
CLOUD_PLATFORM_SCOPE: Final = "https://www.googleapis.com/auth/cloud-platform"


@dataclass(frozen=True)
class ServerVmSpec:
    """One server VM as ``server up`` asks for it."""

    project: str
    zone: str
    name: str = DEFAULT_NAME
    machine_type: str = DEFAULT_MACHINE_TYPE
    database: str | None = None  # None: SQLite on the VM's disk, copied to ``bucket`` every minute
    bucket: str | None = None
    disk_gb: int = DEFAULT_DISK_GB
    version: str = __version__

    @property
    def region(self) -> str:
        return self.zone.rsplit("-", 1)[0]

    @property
    def sqlite_ledger(self) -> str:
        """The ledger's path as a unit names it (``%h``: the user's home)."""
        return f"%h/{STATE_SUBDIR}/ledger.db"

    @property
    def wheel_name(self) -> str:
        """The file name ``uv build`` gives tpuctl's wheel (pure Python: one wheel for every VM)."""
        return f"tpuctl-{self.version}-py3-none-any.whl"

    @property
    def backup_prefix(self) -> str:
        return f"tpuctl-server/{self.name}"

    def setup(self, locked: str) -> SetupSpec:
        """The host setup runs use: tpuctl's wheel (copied to the VM) with its locked dependencies
        (``locked``: ``uv export``'s pins), from the host's package index; then the link the units name."""
        wheel = f"tpuctl @ file://${{HOME}}/{WHEEL_SUBDIR}/{self.wheel_name}"  # uv expands ${HOME}
        link = f'mkdir -p "$HOME/{ENV_LINK.rsplit("/", 1)[0]}" && ln -sfn "$VIRTUAL_ENV" "$HOME/{ENV_LINK}"'
        return SetupSpec(runtime=None, requirements=f"{locked.rstrip()}\n{wheel}\n", commands=(link,))

    @property
    def tpuctl(self) -> str:
        """The installed tpuctl as a unit names it."""
        return f"%h/{ENV_LINK}/bin/tpuctl"


@dataclass(frozen=True)
class PlanStep:
    """One thing a command does: a cloud request, or a command on the VM over SSH."""

    what: str
    request: PlannedRequest | None = None
    command: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"what": self.what}
        if self.request is not None:
            out["request"] = self.request.to_dict()
        if self.command is not None:
            out["command"] = self.command
        return out


@dataclass(frozen=True)
class ServerVmPlan:
    """A command's steps, in order, and what the user is told at the end."""

    command: str
    spec: ServerVmSpec
    steps: list[PlanStep]
    units: dict[str, str] = field(default_factory=dict)  # file name -> text
    reach: list[str] = field(default_factory=list)
    cost: ServerVmCost | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "command": self.command,
            "name": self.spec.name,
            "project": self.spec.project,
            "zone": self.spec.zone,
            "machine_type": self.spec.machine_type,
            "ledger": server_unit(self.spec).environment["TPUCTL_DATABASE_URL"],
            "backups": f"gs://{self.spec.bucket}/{self.spec.backup_prefix}/" if self._copies else None,
            "steps": [s.to_dict() for s in self.steps],
            "units": self.units,
            "reach": self.reach,
            "cost": self.cost.to_dict() if self.cost else None,
        }

    @property
    def _copies(self) -> bool:
        return self.spec.database is None and self.spec.bucket is not None


def instance_body(spec: ServerVmSpec) -> dict[str, Any]:
    """The ``instances.insert`` body of the server VM."""
    zone_path = f"projects/{spec.project}/zones/{spec.zone}"
    return {
        "name": spec.name,
        "machineType": f"{zone_path}/machineTypes/{spec.machine_type}",
        "labels": {LABEL_SERVER: spec.name},
        "scheduling": {
            "provisioningModel": "STANDARD",
            "preemptible": False,
            "automaticRestart": True,
            "onHostMaintenance": "MIGRATE",
        },
        "disks": [
            {
                "boot": True,
                "autoDelete": True,
                "initializeParams": {
                    "sourceImage": IMAGE_FAMILY,
                    "diskSizeGb": str(spec.disk_gb),
                    "diskType": f"{zone_path}/diskTypes/pd-balanced",
                },
            }
        ],
        "networkInterfaces": [
            {
                "network": f"projects/{spec.project}/global/networks/default",
                # Egress only (the setup's package installs); nothing on the VM listens beyond loopback
                # but sshd, which the firewall opens to IAP's range alone.
                "accessConfigs": [{"type": "ONE_TO_ONE_NAT", "name": "External NAT"}],
            }
        ],
        "serviceAccounts": [{"email": "default", "scopes": [CLOUD_PLATFORM_SCOPE]}],
        "metadata": {
            "items": [
                {"key": "enable-oslogin", "value": "TRUE"},
                # The guest agent publishes the VM's SSH host keys as guest attributes only where they
                # are enabled (docs/google-facts.md#guest-attributes): tpuctl checks the key it meets.
                {"key": "enable-guest-attributes", "value": "TRUE"},
            ]
        },
    }


def _unit_env(spec: ServerVmSpec) -> dict[str, str]:
    """What both units run with: their state's place and the project. Nothing says which cloud: the VM's
    own environment does, by being on it (on the simulator, its logins' environment:
    ``tpuctl.sim.network``), so the units are the same text on both."""
    return {
        "XDG_STATE_HOME": f"%h/{STATE_SUBDIR}",
        "TPUCTL_PROJECT": spec.project,
        # Unbuffered: a unit's output goes to the journal through a pipe, where Python would hold it
        # back until the buffer fills, so a failing start would show nothing.
        "PYTHONUNBUFFERED": "1",
    }


def server_unit(spec: ServerVmSpec, *, reveal: bool = False) -> ServiceUnit:
    """The server itself: on loopback, its state on the boot disk, restarted 5 s after a failure. A
    PostgreSQL URL goes in the unit's environment (the file is installed mode 0600), never on the command
    line (``ps`` shows that to every user); ``reveal=False`` shows its password as *** (what --dry-run
    prints)."""
    from tpuctl.store.url import parse_database_url

    environment = _unit_env(spec)
    if spec.database is None:
        environment["TPUCTL_DATABASE_URL"] = f"sqlite:///{spec.sqlite_ledger}"
    else:
        url = parse_database_url(spec.database, "--database")
        environment["TPUCTL_DATABASE_URL"] = url.secret_url if reveal else url.text
    return ServiceUnit(
        name="tpuctl-server",
        description="tpuctl team server",
        exec_start=(spec.tpuctl, "server", "--listen", f"127.0.0.1:{SERVER_PORT}"),
        restart=RestartPolicy.ON_FAILURE,
        restart_sec=5,
        environment=environment,
        working_directory=f"%h/{STATE_SUBDIR}",
    )


def backup_unit(spec: ServerVmSpec) -> ServiceUnit | None:
    """The minute's copies of a SQLite ledger to the bucket; None with a database URL (nothing copied)."""
    if spec.database is not None or spec.bucket is None:
        return None
    return ServiceUnit(
        name="tpuctl-server-backup",
        description="tpuctl team server: ledger copies to the team bucket",
        exec_start=(
            spec.tpuctl,
            "server",
            "backup",
            "--ledger",
            spec.sqlite_ledger,
            "--bucket",
            spec.bucket,
            "--prefix",
            spec.backup_prefix,
            "--every",
            f"{BACKUP_EVERY_S:g}",
        ),
        restart=RestartPolicy.ON_FAILURE,
        restart_sec=10,
        environment=_unit_env(spec),
        working_directory=f"%h/{STATE_SUBDIR}",
    )


def units(spec: ServerVmSpec) -> list[ServiceUnit]:
    return [u for u in (server_unit(spec), backup_unit(spec)) if u is not None]


def reach_commands(spec: ServerVmSpec) -> list[str]:
    """How a laptop reaches the server: an SSH port forward through IAP, then tpuctl against it."""
    where = f"--zone {spec.zone} --project {spec.project}"
    return [
        f"gcloud compute ssh {spec.name} {where} --tunnel-through-iap -- -N "
        f"-L {SERVER_PORT}:127.0.0.1:{SERVER_PORT}",
        f"tpuctl --server http://127.0.0.1:{SERVER_PORT} runs list",
    ]


def shell(argv: tuple[str, ...] | list[str]) -> str:
    """``argv`` as a command line for the VM's login shell, a unit's ``%h`` spelled ``$HOME``."""
    return shlex.join(argv).replace("%h/", '"$HOME"/')


def copy_wheel_command(spec: ServerVmSpec) -> str:
    """Write the wheel sent on standard input where the setup's requirements name it."""
    return f'mkdir -p "$HOME/{WHEEL_SUBDIR}" && cat > "$HOME/{WHEEL_SUBDIR}/{spec.wheel_name}"'


def restore_command(spec: ServerVmSpec) -> str | None:
    """The newest copy restored and reconciled before the server starts (None: nothing copied)."""
    if spec.database is not None or spec.bucket is None:
        return None
    argv = [spec.tpuctl, "server", "restore", "--ledger", spec.sqlite_ledger, "--bucket", spec.bucket]
    argv += ["--prefix", spec.backup_prefix]
    return f'mkdir -p "$HOME/{STATE_SUBDIR}" && {_settings_prefix(spec)} {shell(argv)}'


def _settings_prefix(spec: ServerVmSpec) -> str:
    """The units' settings as a command's variable assignments (what restore and the final copy run
    with, outside the units; as ``_unit_env``, nothing says which cloud)."""
    return f'TPUCTL_PROJECT={shlex.quote(spec.project)} XDG_STATE_HOME="$HOME/{STATE_SUBDIR}"'


def install_unit_command(file_name: str) -> str:
    """Write the unit sent on standard input (mode 0600: a PostgreSQL URL may be in it)."""
    return (
        f'mkdir -p "$HOME/{USER_UNIT_DIR}" && install -m 600 /dev/stdin "$HOME/{USER_UNIT_DIR}/{file_name}"'
    )


def start_units_command(file_names: list[str]) -> str:
    """Lingering, so the user manager (and the units) run from boot with nobody logged in; then enabled
    and started. ``loginctl enable-linger`` of oneself is allowed to every user by logind's default
    polkit policy (org.freedesktop.login1.set-self-linger)."""
    names = " ".join(file_names)
    # The units' working directory must exist before they start (systemd fails them at CHDIR otherwise).
    return (
        f'mkdir -p "$HOME/{STATE_SUBDIR}" && loginctl enable-linger && systemctl --user daemon-reload && '
        f"systemctl --user enable --now {names}"
    )


READY_COMMAND: Final = f"curl -sf http://127.0.0.1:{SERVER_PORT}/readyz"
UNIT_STATE_COMMAND: Final = "systemctl --user is-active tpuctl-server.service"


def stop_unit_command(file_name: str) -> str:
    return f"systemctl --user stop {file_name}"


def final_copy_command(spec: ServerVmSpec) -> str | None:
    backup = backup_unit(spec)
    if backup is None:
        return None
    once = [*backup.exec_start[: backup.exec_start.index("--every")], "--once"]
    return f"{_settings_prefix(spec)} {shell(once)}"


def logs_command(*, follow: bool, lines: int = 200) -> str:
    return "journalctl --user -u tpuctl-server.service --no-pager" + (" -f" if follow else f" -n {lines}")


def plan_up(spec: ServerVmSpec, compute_base: str) -> ServerVmPlan:
    """``server up``: the VM, its setup, the ledger's restore and reconcile, the units started."""
    base = f"{compute_base.rstrip('/')}/compute/v1/projects/{spec.project}/zones/{spec.zone}"
    steps = [
        PlanStep("create the server VM", PlannedRequest("POST", f"{base}/instances", instance_body(spec))),
        PlanStep("wait until it is RUNNING", PlannedRequest("GET", f"{base}/instances/{spec.name}")),
        PlanStep(
            f"copy {spec.wheel_name} (built here, uv build) to the VM", command=copy_wheel_command(spec)
        ),
        PlanStep(
            "set the VM up as run hosts are (tpuctl's host setup: the wheel with its locked dependencies, "
            "from the host's package index)",
            command=f"<host setup: {spec.wheel_name} + uv.lock's pins>",
        ),
    ]
    restore = restore_command(spec)
    if restore is not None:
        steps.append(
            PlanStep(
                "restore the newest ledger copy from the bucket, then reconcile it with the cloud before "
                "the server starts",
                command=restore,
            )
        )
    rendered = {u.file_name: u.render() for u in units(spec)}
    for file_name in rendered:
        steps.append(PlanStep(f"install {file_name}", command=install_unit_command(file_name)))
    steps.append(PlanStep("start the units", command=start_units_command(list(rendered))))
    steps.append(PlanStep("wait until the server is ready", command=READY_COMMAND))
    return ServerVmPlan(
        "up",
        spec,
        steps,
        rendered,
        reach_commands(spec),
        server_vm_cost(spec.machine_type, spec.region, spec.disk_gb),
    )


def plan_down(spec: ServerVmSpec, compute_base: str, *, keep_disk: bool) -> ServerVmPlan:
    """``server down``: the service stopped, a final copy taken, the VM deleted (its disk kept if asked)."""
    base = f"{compute_base.rstrip('/')}/compute/v1/projects/{spec.project}/zones/{spec.zone}"
    steps = [PlanStep("stop the server", command=stop_unit_command("tpuctl-server.service"))]
    backup = backup_unit(spec)
    final = final_copy_command(spec)
    if backup is not None and final is not None:
        steps.append(PlanStep("stop the copies", command=stop_unit_command(backup.file_name)))
        steps.append(PlanStep("take a final copy of the stopped ledger", command=final))
    if keep_disk:
        steps.append(
            PlanStep(
                "keep the boot disk when the VM goes",
                PlannedRequest(
                    "POST",
                    f"{base}/instances/{spec.name}/setDiskAutoDelete?autoDelete=false&deviceName=persistent-disk-0",
                ),
            )
        )
    steps.append(PlanStep("delete the VM", PlannedRequest("DELETE", f"{base}/instances/{spec.name}")))
    return ServerVmPlan("down", spec, steps)


def plan_status(spec: ServerVmSpec, compute_base: str) -> ServerVmPlan:
    base = f"{compute_base.rstrip('/')}/compute/v1/projects/{spec.project}/zones/{spec.zone}"
    steps = [
        PlanStep("the VM's state", PlannedRequest("GET", f"{base}/instances/{spec.name}")),
        PlanStep("the service's state", command=UNIT_STATE_COMMAND),
        PlanStep("the server's readiness", command=READY_COMMAND),
    ]
    if backup_unit(spec) is not None:
        steps.append(
            PlanStep(
                "the last copy's time", PlannedRequest("GET", f"gs://{spec.bucket}/{spec.backup_prefix}/")
            )
        )
    return ServerVmPlan("status", spec, steps)


def plan_logs(spec: ServerVmSpec, *, follow: bool) -> ServerVmPlan:
    return ServerVmPlan("logs", spec, [PlanStep("the unit's journal", command=logs_command(follow=follow))])

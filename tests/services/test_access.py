"""Which key a new slice's metadata carries (the state dir's, or a run's own), whether a slice's ``ssh-keys``
let a key in (the key type and body; the comment does not matter), and who tpuctl logs in as: through OS
Login (on for the node, else the project; the key imported for the caller with an expiry, renewed once
half spent; the login the profile's POSIX name) or through ``ssh-keys`` as ``tpuctl``. Against the
in-process simulator, whose OS Login, tokeninfo and project metadata are Google's shapes."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import pytest

from tpuctl.catalog import CapacityType
from tpuctl.cloud.base import Node
from tpuctl.cloud.instances import VmInstance
from tpuctl.errors import PermissionDeniedError, UsageError
from tpuctl.hosts.ssh import DEFAULT_USERNAME, KeyPair, ensure_key_pair
from tpuctl.services.access import (
    PLAN_PUBLIC_KEY,
    host_login,
    ssh_key_metadata,
    ssh_keys_authorize,
    vm_login,
)
from tpuctl.testing.backend import InProcessCli

if TYPE_CHECKING:
    from tpuctl.services.session import Session

PRINCIPAL = "sim-user@example.com"
POSIX = "sim_user_example_com"
OS_LOGIN_WORLD = {"os_login": True}


@dataclass
class StateDirOnly:
    state_dir: Path


def _node(metadata: dict[str, str], name: str = "pod-a") -> Node:
    return Node(name, "us-central1-a", "v5litepod-8", "READY", CapacityType.ON_DEMAND, metadata=metadata)


def test_a_runs_key_goes_in_the_metadata_and_is_the_one_accepted(tmp_path: Path) -> None:
    session = cast("Session", StateDirOnly(tmp_path))
    run_key = KeyPair.generate(comment="tpuctl-run-x")
    metadata = ssh_key_metadata(session, plan=False, public_openssh=run_key.public_openssh)
    assert metadata == {"ssh-keys": f"tpuctl:{run_key.public_openssh}"}
    node = _node(metadata)
    assert ssh_keys_authorize(node, run_key.public_openssh)
    # Only the type and body count: the same key under another comment is the same key.
    body = " ".join(run_key.public_openssh.split()[:2])
    assert ssh_keys_authorize(node, f"{body} elsewhere")
    assert not ssh_keys_authorize(node, ensure_key_pair(tmp_path).public_openssh)
    assert not ssh_keys_authorize(node, KeyPair.generate("other").public_openssh)


def test_the_state_dirs_key_by_default_and_a_placeholder_in_a_plan(tmp_path: Path) -> None:
    session = cast("Session", StateDirOnly(tmp_path))
    assert ssh_key_metadata(session, plan=True) == {"ssh-keys": f"tpuctl:{PLAN_PUBLIC_KEY}"}
    assert not (tmp_path / "ssh").exists()  # a plan made no key
    state_key = ensure_key_pair(tmp_path)
    assert ssh_key_metadata(session, plan=False) == {"ssh-keys": f"tpuctl:{state_key.public_openssh}"}


# --- who tpuctl logs in as ---------------------------------------------------------------------------


@pytest.fixture
def session(sim_cli: InProcessCli, state_dir: Path) -> Iterator[Session]:
    """A session over the in-process simulator (its world: ``sim_world``), a key TTL of 1000 s."""
    from tpuctl.services.session import open_session
    from tpuctl.settings import load_settings

    settings = load_settings({"backend": "sim", "state_dir": state_dir, "os_login_key_ttl": 1000})
    with open_session(settings, backend=sim_cli.backend) as opened:
        yield opened


def _imported(sim_cli: InProcessCli) -> dict[str, Any]:
    keys: dict[str, Any] = sim_cli.sim.engine.login_profile(PRINCIPAL)["sshPublicKeys"]
    return keys


def test_with_os_login_off_tpuctl_logs_in_through_ssh_keys_and_imports_nothing(
    session: Session, sim_cli: InProcessCli
) -> None:
    key = KeyPair.generate("run")
    node = _node(ssh_key_metadata(session, plan=False, public_openssh=key.public_openssh))
    login = host_login(session, [node], key)
    assert login.username == DEFAULT_USERNAME and login.renew is None
    assert login.authorized_by.startswith("the slice's ssh-keys metadata (OS Login off")
    assert "OS Login is off" in login.refused_fix
    assert _imported(sim_cli) == {}
    # A slice whose ssh-keys lack the key is refused before any connection, naming the fix.
    with pytest.raises(UsageError, match="does not authorize the run's SSH key") as info:
        host_login(session, [_node({})], key)
    assert "pod create" in (info.value.fix or "")


@pytest.mark.parametrize("sim_world", [OS_LOGIN_WORLD])
def test_with_os_login_on_for_the_project_the_key_is_imported_to_expire_and_the_login_is_posix(
    session: Session, sim_cli: InProcessCli
) -> None:
    key = KeyPair.generate("run")
    # The slice's ssh-keys carry the key too: OS Login ignores them.
    node = _node(ssh_key_metadata(session, plan=False, public_openssh=key.public_openssh))
    now = sim_cli.clock.now()
    login = host_login(session, [node], key)
    assert login.username == POSIX
    assert "OS Login (enable-oslogin in the metadata of project tpuctl-sim)" in login.authorized_by
    assert PRINCIPAL in login.authorized_by
    assert "roles/compute.osAdminLogin" in login.refused_fix and PRINCIPAL in login.refused_fix
    (entry,) = _imported(sim_cli).values()
    assert entry["key"] == " ".join(key.public_openssh.split()[:2])
    assert int(entry["expirationTimeUsec"]) == int((now + 1000) * 1_000_000)
    # Hosts accept it under the POSIX name only, while it lasts.
    engine = sim_cli.sim.engine
    assert engine.oslogin.accepted_keys(POSIX) == [entry["key"]]
    assert engine.oslogin.accepted_keys(DEFAULT_USERNAME) == []


@pytest.mark.parametrize("sim_world", [OS_LOGIN_WORLD])
def test_the_import_is_renewed_before_a_connection_once_half_its_life_is_spent(
    session: Session, sim_cli: InProcessCli
) -> None:
    key = KeyPair.generate("run")
    login = host_login(session, [_node({})], key)
    assert login.renew is not None
    first = int(next(iter(_imported(sim_cli).values()))["expirationTimeUsec"])
    sim_cli.clock.advance(400)  # under half of the 1000 s: nothing to do
    login.renew()
    assert int(next(iter(_imported(sim_cli).values()))["expirationTimeUsec"]) == first
    sim_cli.clock.advance(200)  # past half: imported again, the expiry moved (by a patch: see the sim)
    login.renew()
    assert int(next(iter(_imported(sim_cli).values()))["expirationTimeUsec"]) == first + 600_000_000
    sim_cli.clock.advance(2000)  # long expired: hosts refuse it until the next renewal
    assert sim_cli.sim.engine.oslogin.accepted_keys(POSIX) == []
    login.renew()
    assert sim_cli.sim.engine.oslogin.accepted_keys(POSIX) != []


@pytest.mark.parametrize("sim_world", [OS_LOGIN_WORLD])
def test_a_nodes_own_setting_overrides_the_projects(session: Session, sim_cli: InProcessCli) -> None:
    key = KeyPair.generate("run")
    off = _node({**ssh_key_metadata(session, plan=False, public_openssh=key.public_openssh),
                 "enable-oslogin": "FALSE"})  # fmt: skip
    login = host_login(session, [off], key)
    assert login.username == DEFAULT_USERNAME
    assert "OS Login off (enable-oslogin in the metadata of pod-a)" in login.authorized_by
    assert _imported(sim_cli) == {}
    with pytest.raises(UsageError, match="OS Login is on for some slices of the run and off for others"):
        host_login(session, [off, _node({}, "pod-b")], key)


def test_a_node_turning_os_login_on_is_enough(session: Session, sim_cli: InProcessCli) -> None:
    login = host_login(session, [_node({"enable-oslogin": "true"})], KeyPair.generate("run"))
    assert login.username == POSIX and "the metadata of pod-a" in login.authorized_by
    assert len(_imported(sim_cli)) == 1


def test_a_project_tpuctl_may_not_read_is_assumed_off_and_the_refusal_says_so(
    session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    def denied(project: str) -> bool | None:
        raise PermissionDeniedError("Required 'compute.projects.get' permission for 'projects/tpuctl-sim'")

    monkeypatch.setattr(session.os_login(), "project_says", denied)
    key = KeyPair.generate("run")
    node = _node(ssh_key_metadata(session, plan=False, public_openssh=key.public_openssh))
    login = host_login(session, [node], key)
    assert login.username == DEFAULT_USERNAME
    assert "could not be read" in login.authorized_by
    assert "compute.projects.get" in login.refused_fix and "roles/compute.viewer" in login.refused_fix


@pytest.mark.parametrize("sim_world", [{"os_login": True, "principal": "someone@example.org"}])
def test_an_import_into_another_accounts_profile_is_refused_naming_os_login(
    session: Session, sim_cli: InProcessCli, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The credentials' account is not the one the simulator acts for: its OS Login refuses, as Google's
    # refuses an import into another account's profile.
    monkeypatch.setattr(session.os_login(), "caller", lambda: PRINCIPAL)
    with pytest.raises(PermissionDeniedError) as info:
        host_login(session, [_node({})], KeyPair.generate("run"))
    assert "OS Login is on for project tpuctl-sim" in info.value.message
    assert "roles/compute.osLogin" in (info.value.fix or "")


# --- a general-purpose VM (the team server's) -------------------------------------------------------


def _vm(metadata: dict[str, str]) -> VmInstance:
    return VmInstance("srv", "us-central1-a", "RUNNING", "e2-small", "10.0.0.2", None, metadata)


def test_a_vm_with_os_login_on_takes_the_key_imported_for_the_caller(
    session: Session, sim_cli: InProcessCli
) -> None:
    key = KeyPair.generate("server")
    login = vm_login(
        session, _vm({"enable-oslogin": "TRUE", "ssh-keys": f"tpuctl:{key.public_openssh}"}), key
    )
    assert login.username == POSIX and "enable-oslogin in the metadata of VM srv" in login.authorized_by
    (entry,) = _imported(sim_cli).values()
    assert entry["key"] == " ".join(key.public_openssh.split()[:2])


def test_a_vm_with_os_login_off_takes_only_its_ssh_keys_lines(
    session: Session, sim_cli: InProcessCli
) -> None:
    key = KeyPair.generate("server")
    login = vm_login(
        session, _vm({"enable-oslogin": "FALSE", "ssh-keys": f"admin:{key.public_openssh}"}), key
    )
    assert login.username == "admin" and _imported(sim_cli) == {}
    with pytest.raises(UsageError, match="neither through OS Login") as info:
        vm_login(session, _vm({"enable-oslogin": "FALSE"}), key)
    assert "enable-oslogin=TRUE" in (info.value.fix or "")

"""A simulated VM's login environment: built from scratch, with its metadata server's address and the
simulated network's variables, which tell a tpuctl there which cloud it is in and that it is on a VM."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpuctl.settings import Backend, load_settings
from tpuctl.sim.network import network_env
from tpuctl.sim.vms.layout import VM_MARKER
from tpuctl.sim.vms.sshd import HostRef, LoginSetup, login_env

API = "http://127.15.0.9:8470"


def _login(tmp_path: Path) -> dict[str, str]:
    host = HostRef("p", "us-central1-a", "n", "1234", 0, "127.16.0.5", tmp_path / "disk")
    network = network_env(
        mirror_url="http://127.15.0.9:3141/", storage_url="http://127.15.0.9:9023", api_url=API
    )
    return login_env(host, "alice", tmp_path / "home", LoginSetup(tmp_path / "image", 8080, network))


def test_a_login_names_the_simulated_apis_and_the_vms_metadata_server(tmp_path: Path) -> None:
    env = _login(tmp_path)
    assert (env["TPUCTL_BACKEND"], env["TPUCTL_SIM_URL"]) == ("sim", API)
    assert env["GCE_METADATA_HOST"] == "127.16.0.5:8080"
    assert env[VM_MARKER] == "1234/0"


def test_a_tpuctl_in_that_login_uses_the_simulator_there_as_the_vm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in _login(tmp_path).items():
        if name.startswith("TPUCTL_"):
            monkeypatch.setenv(name, value)
    settings = load_settings({"state_dir": tmp_path / "state"})
    assert settings.resolved_backend is Backend.SIM and settings.sim_url == API
    assert settings.sim_vm == "1234/0"  # its clients call as the VM's service account

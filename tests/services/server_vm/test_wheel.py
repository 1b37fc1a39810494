"""tpuctl's wheel for the server VM, built offline from this checkout, and its dependencies' pins."""

from __future__ import annotations

from pathlib import Path

from tpuctl.services.server_vm.plan import ServerVmSpec
from tpuctl.services.server_vm.wheel import build_server_wheel


def test_the_wheel_is_the_one_the_setup_names_with_the_locks_pins(tmp_path: Path) -> None:
    spec = ServerVmSpec(project="p", zone="us-central1-a", bucket="team")
    wheel = build_server_wheel(tmp_path)
    assert wheel.path == tmp_path / spec.wheel_name and wheel.path.stat().st_size > 100_000
    pins = {line.split("==")[0]: line for line in wheel.locked.splitlines() if "==" in line}
    assert {"fastapi", "uvicorn", "sqlalchemy", "asyncssh"} <= set(pins)
    assert "tpuctl" not in pins and "pytest" not in pins  # the project and its test extra are not pinned
    requirements = spec.setup(wheel.locked).requirements
    assert requirements is not None
    assert requirements.endswith(f"tpuctl @ file://${{HOME}}/.tpuctl/wheels/{spec.wheel_name}\n")

"""Which key a new slice's metadata carries (the state dir's, or a run's own) and whether a slice lets a
key in: its ``ssh-keys`` lines (the key type and body; the comment does not matter) or OS Login."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

from tpuctl.catalog import CapacityType
from tpuctl.cloud.base import Node
from tpuctl.hosts.ssh import KeyPair, ensure_key_pair
from tpuctl.services.access import PLAN_PUBLIC_KEY, authorizes_tpuctl, ssh_key_metadata

if TYPE_CHECKING:
    from tpuctl.services.session import Session


@dataclass
class StateDirOnly:
    state_dir: Path


def _node(metadata: dict[str, str]) -> Node:
    return Node("pod-a", "us-central1-a", "v5litepod-8", "READY", CapacityType.ON_DEMAND, metadata=metadata)


def test_a_runs_key_goes_in_the_metadata_and_is_the_one_accepted(tmp_path: Path) -> None:
    session = cast("Session", StateDirOnly(tmp_path))
    run_key = KeyPair.generate(comment="tpuctl-run-x")
    metadata = ssh_key_metadata(session, plan=False, public_openssh=run_key.public_openssh)
    assert metadata == {"ssh-keys": f"tpuctl:{run_key.public_openssh}"}
    node = _node(metadata)
    assert authorizes_tpuctl(session, node, public_openssh=run_key.public_openssh)
    # Only the type and body count: the same key under another comment is the same key.
    body = " ".join(run_key.public_openssh.split()[:2])
    assert authorizes_tpuctl(session, node, public_openssh=f"{body} elsewhere")
    assert not authorizes_tpuctl(session, node)  # the state dir's key is not on it
    assert not authorizes_tpuctl(session, node, public_openssh=KeyPair.generate("other").public_openssh)


def test_the_state_dirs_key_by_default_a_placeholder_in_a_plan_and_os_login_lets_any_in(
    tmp_path: Path,
) -> None:
    session = cast("Session", StateDirOnly(tmp_path))
    assert ssh_key_metadata(session, plan=True) == {"ssh-keys": f"tpuctl:{PLAN_PUBLIC_KEY}"}
    assert not (tmp_path / "ssh").exists()  # a plan made no key
    state_key = ensure_key_pair(tmp_path)
    node = _node(ssh_key_metadata(session, plan=False))
    assert node.metadata == {"ssh-keys": f"tpuctl:{state_key.public_openssh}"}
    assert authorizes_tpuctl(session, node)
    oslogin = _node({"enable-oslogin": "TRUE"})
    assert authorizes_tpuctl(session, oslogin, public_openssh=KeyPair.generate("x").public_openssh)

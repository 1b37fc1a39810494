"""Fixtures of the host setup tests: the simulator's stock image and its package mirror."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from setup_helpers import WHEELHOUSE

from tpuctl.sim.mirror import PackageMirror, distributions
from tpuctl.sim.vms.disks import ensure_image


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The simulator's stock image: this machine's base interpreter with nothing installed, no pip."""
    return ensure_image(tmp_path_factory.mktemp("vm"))


@pytest.fixture(scope="module")
def mirror_url() -> Iterator[str]:
    names = distributions(WHEELHOUSE)
    if not any(n.startswith("uv-") for n in names) or not any(n.startswith("jax-") for n in names):
        pytest.fail(f"the wheelhouse {WHEELHOUSE} is not primed: run scripts/setup")
    mirror = PackageMirror(WHEELHOUSE)
    yield mirror.start()
    mirror.stop()

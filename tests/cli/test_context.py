"""The backend marker: real Google chosen by GOOGLE_CLOUD_PROJECT (or CLOUDSDK_CORE_PROJECT) alone is
announced on stderr, in every output format; an explicit --project is not."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tpuctl.backends.gcp import GcpBackend
from tpuctl.cloud.base import TpuCloud
from tpuctl.sim import default_world
from tpuctl.testing.cli import Cli
from tpuctl.testing.cloud import InProcessSim


@pytest.fixture
def fake_google(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The gcp backend, its TPU API the simulator in this process (never the internet, no socket)."""
    with InProcessSim(tmp_path / "google", default_world()) as sim:

        def open_cloud(self: GcpBackend, state_dir: Path, closers: list[Callable[[], None]]) -> TpuCloud:
            return sim.cloud(project=self.project)

        monkeypatch.setattr(GcpBackend, "open_cloud", open_cloud)
        yield


@pytest.mark.parametrize(
    ("env", "args", "announced"),
    [
        ({"GOOGLE_CLOUD_PROJECT": "tpuctl-sim"}, (), "GOOGLE_CLOUD_PROJECT"),
        ({"CLOUDSDK_CORE_PROJECT": "tpuctl-sim"}, ("-o", "json"), "CLOUDSDK_CORE_PROJECT"),
        ({"GOOGLE_CLOUD_PROJECT": "tpuctl-sim"}, ("-o", "json"), "GOOGLE_CLOUD_PROJECT"),
        ({"GOOGLE_CLOUD_PROJECT": "tpuctl-sim"}, ("--project=tpuctl-sim",), None),
        ({"TPUCTL_PROJECT": "tpuctl-sim"}, (), None),
    ],
)
def test_google_chosen_by_an_ambient_project_is_announced(
    fake_google: None, cli: Cli, env: dict[str, str], args: tuple[str, ...], announced: str | None
) -> None:
    globals_ = [a for a in args if a.startswith("--project")]
    result = cli(*globals_, "pod", "list", *[a for a in args if a not in globals_], env=env)
    assert result.code == 0, result.stderr
    if announced:
        assert "tpuctl-sim" in result.stderr and f"taken from {announced}" in result.stderr
    else:
        assert "taken from" not in result.stderr
        assert "gcp" in result.stderr or "-o" in args

"""The backend marker: real Google chosen by GOOGLE_CLOUD_PROJECT (or CLOUDSDK_CORE_PROJECT) alone is
announced on stderr, in every output format; an explicit --project is not."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tpuctl.backends.gcp import GcpBackend
from tpuctl.cloud.base import TpuCloud
from tpuctl.cloud.tpu_api import TpuApiCloud
from tpuctl.sim import SimAdminClient, default_world
from tpuctl.testing.cli import Cli


@pytest.fixture
def fake_google(serve_sim: Callable[..., SimAdminClient], monkeypatch: pytest.MonkeyPatch) -> None:
    """The gcp backend, its TPU API served by the simulator on loopback (never the internet)."""
    url = serve_sim(default_world(), point_cli=False).base_url

    def open_cloud(self: GcpBackend, state_dir: Path, closers: list[Callable[[], None]]) -> TpuCloud:
        return TpuApiCloud.for_simulator(project=self.project, base_url=url)

    monkeypatch.setattr(GcpBackend, "open_cloud", open_cloud)


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

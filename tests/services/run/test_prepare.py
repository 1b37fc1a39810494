"""The run's plan states the hosts' Python: the image's, the one the run's environment is made with, and
what the setup does where they differ. Through `tpuctl run --dry-run -o json` on the in-process
simulator."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from tpuctl.hosts.pythons import ImagePython
from tpuctl.testing.backend import InProcessBackend, InProcessCli

IAP = "gcloud compute start-iap-tunnel %n %p --listen-on-stdin --zone=%z --project=p"


def planned_python(sim_cli: InProcessCli, tmp_path: Path, *extra: str) -> dict[str, Any]:
    script = tmp_path / "proj" / "train.py"
    script.parent.mkdir(exist_ok=True)
    script.write_text("print('hi')\n")
    result = sim_cli("run", str(script), "--type", "v5e-8", "--dry-run", "-o", "json", *extra)
    assert result.code == 0, result.output
    return dict(result.json["plan"]["setup"]["host_python"])


def google_images(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Make the simulator's images Google's (python3.10 for v5e's runtime), recording the images asked
    about."""
    asked: list[str] = []

    def image_python(self: InProcessBackend, image: str) -> ImagePython:
        asked.append(image)
        return ImagePython({"v2-alpha-tpuv5-lite": "3.10"}.get(image), downloads=True)

    monkeypatch.setattr(InProcessBackend, "image_python", image_python)
    return asked


def test_the_simulators_image_has_the_python_the_runtime_needs(sim_cli: InProcessCli, tmp_path: Path) -> None:
    this = f"{sys.version_info.major}.{sys.version_info.minor}"
    planned = planned_python(sim_cli, tmp_path)
    assert (planned["image"], planned["environment"], planned["handling"]) == (this, "3.11", None)
    # The simulator's hosts never download a Python: a simulator on another interpreter could not set up.
    assert (planned["warning"] is None) == (this == "3.11")
    # No environment to make: the image's python3 runs the program.
    bare = planned_python(sim_cli, tmp_path, "--no-runtime-deps")
    assert (bare["image"], bare["environment"], bare["handling"]) == (this, None, None)


def test_a_mismatch_says_how_the_environment_gets_its_python(
    sim_cli: InProcessCli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    asked = google_images(monkeypatch)
    planned = planned_python(sim_cli, tmp_path)
    assert asked == ["v2-alpha-tpuv5-lite"]  # the runtime version the slice would boot
    assert (planned["image"], planned["environment"], planned["warning"]) == ("3.10", "3.11", None)
    # The simulator's default bucket keeps the environment: one host downloads, the others restore.
    assert "on the one host that builds it" in planned["handling"]


def test_a_mismatch_on_hosts_without_external_ips_warns(
    sim_cli: InProcessCli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    google_images(monkeypatch)
    planned = planned_python(sim_cli, tmp_path, "--ssh-proxy-command", IAP)
    assert planned["warning"].startswith("the hosts get no external IPs")

"""`tpuctl run --dry-run`'s text plan: its Python lines (the image's, the environment's, and how a
difference is handled), on the in-process simulator."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpuctl.hosts.pythons import ImagePython
from tpuctl.testing.backend import InProcessBackend, InProcessCli

IAP = "gcloud compute start-iap-tunnel %n %p --listen-on-stdin --zone=%z --project=p"


def python_lines(sim_cli: InProcessCli, tmp_path: Path, *extra: str) -> list[str]:
    script = tmp_path / "proj" / "train.py"
    script.parent.mkdir(exist_ok=True)
    script.write_text("print('hi')\n")
    result = sim_cli("run", str(script), "--type", "v5e-8", "--dry-run", *extra)
    assert result.code == 0, result.output
    lines = result.stdout.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("python: "))
    end = next(i for i in range(first + 1, len(lines)) if not lines[i].startswith("  "))
    return lines[first:end]


def test_a_matching_python_is_one_line(
    sim_cli: InProcessCli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        InProcessBackend, "image_python", lambda self, image: ImagePython("3.11", downloads=False)
    )
    assert python_lines(sim_cli, tmp_path) == [
        "python: the image has python3.11; the run's environment uses python3.11"
    ]


def test_a_mismatch_says_how_it_is_handled_and_warns_where_it_cannot_be(
    sim_cli: InProcessCli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        InProcessBackend, "image_python", lambda self, image: ImagePython("3.10", downloads=True)
    )
    first, handling, warning = python_lines(sim_cli, tmp_path, "--ssh-proxy-command", IAP)
    assert first == "python: the image has python3.10; the run's environment uses python3.11"
    assert handling.startswith("  where the image has no python3.11, uv downloads a managed CPython 3.11")
    assert warning.startswith("  warning: the hosts get no external IPs")

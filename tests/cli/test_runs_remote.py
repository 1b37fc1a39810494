"""How `run --server` ends once the run has: as a local run would, by how the run ended."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tpuctl.cli.render import Output
from tpuctl.cli.runs_remote import render_end
from tpuctl.client.api import ServerError
from tpuctl.server.wire import RunDescriptionOut


def ended(status: str, reason: str | None = None) -> RunDescriptionOut:
    fields: dict[str, Any] = {
        "run_id": "run-1", "status": status, "program": "train.py", "args": [], "pod": "p", "zone": "z",
        "accelerator_type": "v5litepod-8", "capacity": "spot", "exit_code": None, "created_at": None,
        "ended_at": None, "duration_s": 12.5, "restarts": 0, "preemptions": 0, "labels": {}, "detail": {},
        "segments": [], "timeline": [], "recovery": {}, "supervisor_state": "none", "supervisor": None,
        "reason": reason, "host_exits": [], "series": {},  "lease_history": [],
    }  # fmt: skip
    return RunDescriptionOut(**fields)


@pytest.mark.parametrize(("status", "code"), [("failed", 8), ("cancelled", 130), ("budget_exceeded", 7)])
def test_a_run_that_ended_badly_exits_as_a_local_run_would(status: str, code: int) -> None:
    with pytest.raises(ServerError) as caught:
        render_end(Output(fmt="table"), ended(status, reason="worker 0 exited 3"))
    assert caught.value.exit_code == code
    assert caught.value.message == f"run run-1 {status}: worker 0 exited 3"
    assert "tpuctl runs describe run-1" in (caught.value.fix or "")


def test_a_succeeded_run_prints_its_document_and_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    render_end(Output(fmt="json"), ended("succeeded"))
    assert json.loads(capsys.readouterr().out)["run"]["status"] == "succeeded"

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


def test_logs_through_a_server_print_as_local_logs_do_with_every_flag() -> None:
    import io

    from tpuctl.cli.run_reading import LogStyle
    from tpuctl.cli.runs_remote import _print
    from tpuctl.server.wire import LogLineOut, LogsOut

    event = 'TPUCTL_EVENT {"event": "step", "step": 6, "step_time_s": 0.012}'
    lines = [
        LogLineOut(worker=0, seq=0, at=0.0, text="hello"),
        LogLineOut(worker=10, seq=0, at=1.5, text=event),
    ]
    page = LogsOut(run_id="run-1", lines=lines, cursor="0:0,10:0", live=False)

    def printed(style: LogStyle) -> list[str]:
        stream = io.StringIO()
        _print(page, style, stream)
        return stream.getvalue().splitlines()

    wide = LogStyle().for_hosts(16)
    assert printed(wide)[0] == "w0  | hello"  # padded to the widest worker, as locally
    assert printed(wide)[1] == "w10 | [tpuctl] step step=6 step_time_s=0.012"  # an event in words
    assert printed(LogStyle(raw=True).for_hosts(16))[1] == f"w10 | {event}"
    assert printed(LogStyle(timestamps=True, one_worker=True))[0] == "1970-01-01T00:00:00.000Z hello"

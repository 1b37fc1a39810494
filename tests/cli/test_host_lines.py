"""What of a host's output people read: plumbing left out (whole, or glued to other lines), events in
words."""

from __future__ import annotations

import pytest

from tpuctl.cli.host_lines import event_words, shown

GLOO = "[Gloo] Rank 3 is connected to 15 peer ranks. Expected number of connected peer ranks is : 15"


@pytest.mark.parametrize(
    "line",
    [
        GLOO,
        # Written at once by several threads: the fragments that escaped a line-start match.
        "[Gloo] Rank 5 is connected to 7 peer ranks. Expected number of connected peer ranks is : 7"
        "[Gloo] Rank ",
        "4[Gloo] Rank 7 is connected to 7 peer ranks. Expected number of connected peer ranks is : 7",
        " is connected to 7 peer ranks. Expected number of connected peer ranks is : 7",
        GLOO + GLOO,
        "[Gloo] Rank 0 is connected to [Gloo] Rank ",  # two cut lines glued (seen on a 4-host start)
        "I1127 07:40:23.621661   22970 google_auth_provider.cc:181] Running on GCE, using service account x",
        "W1127 04:30:11.855330     585 preemption_notifier.cc:90] SIGTERM caught at 2026-11-27T04:30:11",
        "I1127 04:30:11.900000     585 preemption_sync_manager.cc:120] Will begin preemption sync protocol",
        "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
        "WARNING absl: [process=1][thread=MainThread] Reached preemption sync point, step=5",
        "W1127 07:50:00.123456 1400 multihost.py:437] [process=0][thread=save_finalize] Reached preemption "
        "sync point, step=5",
    ],
)
def test_plumbing_stays_off_the_console(line: str) -> None:
    assert shown(line) is None


@pytest.mark.parametrize(
    ("line", "kept"),
    [
        ("step 3 loss 2.1", "step 3 loss 2.1"),
        ("step 3 loss 2.1" + GLOO, "step 3 loss 2.1"),
        (GLOO + "step 4 loss 2.0", "step 4 loss 2.0"),
        ("step 3 loss 2.1[Gloo] Rank ", "step 3 loss 2.1"),
        ("we use [Gloo] for peer ranks", "we use [Gloo] for peer ranks"),
        ("4", "4"),  # a number alone is the program's, not a Gloo fragment
        # A warning or an error from C++ is the program's business (tensorstore without credentials).
        ("E1127 07:27:45.556505 21811 google_auth_provider.cc:188] Could not find the credentials file",
         "E1127 07:27:45.556505 21811 google_auth_provider.cc:188] Could not find the credentials file"),
        ("W1127 07:27:45.556505 21811 cpu_client.cc:9] slow",
         "W1127 07:27:45.556505 21811 cpu_client.cc:9] slow"),
    ],
)  # fmt: skip
def test_program_lines_are_kept_without_what_was_glued_to_them(line: str, kept: str) -> None:
    assert shown(line) == kept


def test_events_read_as_words_and_unknown_ones_as_their_fields() -> None:
    said = [
        event_words(e)
        for e in (
            {"event": "start", "step": 6, "restored": 6, "skipped": [], "restart_count": 1, "steps": 30},
            {"event": "start", "step": 0, "restored": None, "skipped": [{"step": 8, "reason": "incomplete"}]},
            {"event": "step", "step": 7, "dt": 0.01234, "loss": 5.08},
            {"event": "notice", "worker": 2, "source": "metadata", "t": 1.0},
            {"event": "preempted", "step": 9, "checkpoint": "saved", "save_s": 0.4},
            {"event": "preempted", "step": 9, "checkpoint": "none", "save_s": None},
            {"event": "maintenance", "worker": 0, "value": "TERMINATE_ON_HOST_MAINTENANCE", "t": 1.0},
            {"event": "preempted", "step": 4, "checkpoint": "saved", "reason": "maintenance"},
            {"event": "done", "step": 30},
            {"event": "exception", "type": "ValueError", "message": "bad lr", "worker": 0},
            {"event": "checkpoint", "step": 4, "path": "gs://b/4"},
            {"event": "step", "step": 1},  # no dt: said as its fields
        )
    ]
    assert said == [
        "[tpuctl] started at step 6 of 30 (restored step 6, restart 1)",
        "[tpuctl] started at step 0 (nothing restored); skipped step 8 (incomplete)",
        "[tpuctl] step 7 took 0.012 s, loss 5.08",
        "[tpuctl] preemption notice on host 2 (metadata)",
        "[tpuctl] stopped for a preemption at step 9: checkpoint saved (0.4 s to save)",
        "[tpuctl] stopped for a preemption at step 9: no checkpoint",
        "[tpuctl] host maintenance notice on host 0 (TERMINATE_ON_HOST_MAINTENANCE)",
        "[tpuctl] stopped for a host maintenance at step 4: checkpoint saved",
        "[tpuctl] done at step 30",
        "[tpuctl] raised ValueError: bad lr",
        "[tpuctl] checkpoint step=4 path=gs://b/4",
        "[tpuctl] step step=1",
    ]

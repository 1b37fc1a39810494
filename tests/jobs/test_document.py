"""A run request as a job file, and back: the same request, over every field a job file holds."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import yaml

from tpuctl.catalog import CapacityType, Catalog
from tpuctl.jobs.document import document_from_run_request
from tpuctl.jobs.load import load_job_text
from tpuctl.jobs.request import build
from tpuctl.services.placement import Strategy
from tpuctl.services.placement_choices import PlacementChoices
from tpuctl.services.run.model import RecoveryPolicy, RunRequest

#: RunRequest's fields a job file does not hold (tpuctl's own bookkeeping, hidden options), and those the
#: settings decide from the file's value (bucket, setup, requirements, ProxyCommand: ``HostFlags``).
NOT_IN_FILE = {"run_id", "deadline_at", "python", "ssh_remote_root", "executor"}
VIA_SETTINGS = {"bucket", "setup", "requirements", "ssh_proxy_command"}


def test_every_job_field_survives_the_round_trip(tmp_path: Path) -> None:
    request = RunRequest(
        command="python3 -m x",
        args=("--lr", "3"),
        workdir=str(tmp_path),  # a workdir must exist where the file is loaded
        env=("A=1",),
        secret_names=("TOKEN",),
        priority="production",
        workspace="ml",
        labels={"team": "ml", "job": "lm"},
        accelerator_type="v5e-16",
        other_accelerator_types=("v6e-8",),
        type_preference="cheapest",
        slices=2,
        placement=PlacementChoices(
            zones=("us-central1-a",),
            region="us-central1",
            capacity_types=(CapacityType.SPOT,),
            reserved="r1",
            max_price=30.0,
            queued=True,
            valid_for_s=600.0,
            strategy=Strategy.RACE,
            race_k=2,
        ),
        keep_pod=True,
        checkpoint_every=50,
        checkpoint_dir="gs://b/c",
        timeout_s=7200.0,
        grace_s=3.0,
        max_hours=6.0,
        bundle_limit_bytes=32 * 1024 * 1024,
        runtime_deps=False,
        assumed_price_per_hour=12.0,
        bucket="b",
        setup=("echo hi",),
        requirements="/r.txt",
        ssh_proxy_command="nc %h %p",
    )
    policy = RecoveryPolicy(max_restarts=2, max_preemptions=9)
    text = yaml.safe_dump(document_from_run_request(request, budget_usd=40.0, policy=policy))
    loaded = load_job_text(text, "saved.yaml")
    again = build(loaded.values, catalog=Catalog.load(), source=loaded.source, environ={"TOKEN": "t"})
    for field in dataclasses.fields(RunRequest):
        if field.name in NOT_IN_FILE | VIA_SETTINGS:
            continue
        assert getattr(again.request, field.name) == getattr(request, field.name), field.name
    flags = again.host_flags
    assert (flags.bucket, flags.setup, flags.requirements, flags.ssh_proxy_command) == (
        "b", ("echo hi",), "/r.txt", "nc %h %p"
    )  # fmt: skip
    assert (again.budget_usd, again.policy) == (40.0, policy)
    assert dict(again.secret_values) == {"TOKEN": "t"}

"""The job file's format: SkyPilot's task YAML where the concept is the same (docs/jobs.md), with
tpuctl's own keys beside it. Structure and types only: the values are checked afterwards by the same
functions as the flags (``tpuctl.params``, through ``jobs.request``), so a value reads the same from
either. ``JobFile.model_json_schema()`` is the published schema (`tpuctl job schema`).

Strict: a string where a number belongs, or a key the format does not have, is an error, never
coerced or ignored. SkyPilot keys tpuctl does not support are refused by ``jobs.unsupported`` before
this model sees the file, with what to do instead.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

#: A whole number, or a string the flags' parser reads (durations: ``2h``, ``90m``, ``3600``).
Duration = float | str


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class AcceleratorArgs(_Strict):
    """SkyPilot's ``resources.accelerator_args``: only what a TPU VM slice takes."""

    runtime_version: str | None = Field(
        default=None, description="The TPU software version (image) of a new slice, e.g. v2-alpha-tpuv5-lite."
    )
    tpu_vm: Literal[True] | None = Field(
        default=None, description="True (TPU VMs, the only architecture tpuctl runs on); false is refused."
    )


class JobRecovery(_Strict):
    """SkyPilot's ``resources.job_recovery``: how often a failing program is restarted."""

    max_restarts_on_errors: int | None = Field(
        default=None, ge=0, description="Restart a failing program at most this many times (--max-restarts)."
    )
    # Refused by ``jobs.unsupported`` with what to do instead; kept here so the schema knows the names.
    recover_on_exit_codes: list[int] | None = Field(
        default=None,
        description="Not supported: tpuctl restarts on any failure, up to max_restarts_on_errors.",
    )


class AcceleratorChoice(_Strict):
    """One entry of ``resources.any_of`` or ``resources.ordered``: a slice type."""

    accelerators: str = Field(description="A slice type, e.g. tpu-v6e-8 or tpu-v5litepod-16.")


#: ``accelerators``: one type; a list (tried in that order, then by price); or a set ``{a, b}`` (YAML's
#: mapping with empty values: the cheapest wins).
Accelerators = str | list[str] | dict[str, None]


class Resources(_Strict):
    accelerators: Accelerators | None = Field(
        default=None,
        description="tpu-v6e-8, tpu-v5litepod-16, v5e-16; a list in preference order; or a set "
        "{tpu-v5e-16, tpu-v6e-8} where the cheapest wins.",
    )
    any_of: list[AcceleratorChoice] | None = Field(
        default=None, description="Any of these types, cheapest first."
    )
    ordered: list[AcceleratorChoice] | None = Field(
        default=None, description="These types, in this order first."
    )
    use_spot: bool | None = Field(default=None, description="Spot capacity (--spot).")
    accelerator_args: AcceleratorArgs | None = None
    cloud: Literal["gcp", "GCP"] | None = Field(
        default=None, description="gcp: the only cloud tpuctl places on."
    )
    infra: str | None = Field(default=None, description="gcp, gcp/REGION or gcp/REGION/ZONE.")
    region: str | None = Field(default=None, description="Consider this region's zones only (--region).")
    zone: str | None = Field(default=None, description="Place in this zone (--zone).")
    max_hourly_cost: float | None = Field(default=None, description="USD per hour cap for the whole request.")
    job_recovery: JobRecovery | None = None
    labels: dict[str, str] | None = Field(
        default=None, description="Labels on the run and its slices (--label)."
    )
    # tpuctl's own placement keys (the placement flags, spelled as keys).
    zones: list[str] | None = Field(
        default=None, description="Place in any of these zones (--zone, repeated)."
    )
    capacity: list[str] | None = Field(
        default=None, description="Allowed capacity types: on-demand, spot, preemptible, reserved, queued."
    )
    reservation: str | None = Field(default=None, description="Draw on this reservation (--reserved).")
    queued: bool | None = Field(default=None, description="Ask through a queued resource (--queued).")
    valid_for: Duration | None = Field(
        default=None, description="How long a queued request waits (--valid-for)."
    )
    strategy: str | None = Field(default=None, description="cheapest or race (--strategy).")
    race_k: int | None = Field(default=None, description="Zones queued in at once with race (--race-k).")
    api: str | None = Field(default=None, description="tpu or compute: the Google API that places the slice.")
    network: str | None = None
    subnetwork: str | None = None
    tags: list[str] | None = None
    service_account: str | None = None
    pod: str | None = Field(default=None, description="Run on this existing READY slice (--pod).")


class FileMount(_Strict):
    """A ``file_mounts`` entry: a ``gs://`` source copied onto every host at setup (mode COPY)."""

    source: str = Field(description="gs://BUCKET/PATH, copied to the mount's path on every host.")
    mode: Literal["COPY"] | None = Field(
        default=None, description="COPY (the default); MOUNT modes are refused."
    )


class JobFile(_Strict):
    """A run, described once. SkyPilot's task keys, then tpuctl's own."""

    name: str | None = Field(
        default=None, description="The job's name, recorded as the run's label job=NAME."
    )
    workdir: str | None = Field(
        default=None, description="Directory shipped to every host, the program's cwd."
    )
    num_nodes: Literal[1] | None = Field(
        default=None, description="1 only: a slice's hosts are one node in tpuctl (use slices for several)."
    )
    resources: Resources | None = None
    envs: dict[str, str | int | float | bool | None] | None = Field(
        default=None,
        description="The program's environment; a null value must be given with --env KEY=VALUE.",
    )
    secrets: dict[str, str | None] | None = Field(
        default=None, description="Secret variables; a null value is taken from the submitting environment."
    )
    file_mounts: dict[str, str | FileMount] | None = Field(
        default=None, description="Host path -> gs:// source copied there at setup (a string is the source)."
    )
    setup: str | list[str] | None = Field(
        default=None, description="Shell commands run on every host at setup."
    )
    run: str | None = Field(default=None, description='The shell command run on every host (args: "$@").')
    # tpuctl's own keys.
    script: str | None = Field(default=None, description="A Python script to run instead of run:.")
    example: str | None = Field(default=None, description="A program bundled with tpuctl instead: lm.")
    args: list[str] | None = Field(
        default=None, description='Arguments for the program (run: gets them as "$@").'
    )
    slices: int | None = Field(default=None, ge=1, description="Slices joined into one job (multislice).")
    budget: float | None = Field(default=None, description="Stop before the run spends more USD than this.")
    assume_price_per_hour: float | None = None
    bucket: str | None = Field(default=None, description="Cloud Storage bucket for checkpoints.")
    checkpoint_every: int | None = Field(default=None, description="Checkpoint every N steps.")
    checkpoint_dir: str | None = Field(
        default=None, description="gs:// directory the program checkpoints to."
    )
    max_preemptions: int | None = Field(default=None, description="Recover from at most N preemptions.")
    max_hours: float | None = Field(default=None, description="End the run this many hours after it starts.")
    timeout: Duration | None = Field(default=None, description="Stop the program after this long (2h, 30m).")
    grace: Duration | None = Field(
        default=None, description="Between SIGTERM and SIGKILL when stopping hosts."
    )
    requirements: str | None = Field(
        default=None, description="pip requirements file installed on every host."
    )
    runtime_deps: bool | None = Field(
        default=None, description="Install the bundled runtime's JAX, optax, orbax."
    )
    keep_pod: bool | None = Field(default=None, description="Keep the slice the run created.")
    max_bundle_mb: float | None = None
    ssh_proxy_command: str | None = None
    priority: Literal["production", "interactive", "batch"] | None = Field(
        default=None,
        description="The run's band in a server's queue: production, then interactive, then batch (the "
        "default).",
    )
    workspace: str | None = Field(default=None, description="Recorded; takes effect with a server.")

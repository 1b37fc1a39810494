"""Where a run's checkpoints live: a ``gs://`` directory every host can reach, on every backend.

A host's disk dies with it and a recovery lands on fresh VMs (maybe in another zone), and a multi-host
restore reads what every host wrote: only a bucket serves both. So a checkpoint directory is
``--checkpoint-dir gs://...`` as given, else ``gs://<bucket>/tpuctl/runs/<run id>/checkpoints`` with the
bucket from ``--bucket`` / the profile, else the backend's own (the simulator's emulator has one). A run
that may be preempted with no bucket anywhere is refused before anything is created: its work would be
lost at the first preemption. Checked here, at the edge of the run service, before any cloud call.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from tpuctl.errors import UsageError

if TYPE_CHECKING:
    from tpuctl.catalog import CapacityType
    from tpuctl.services.run.model import RunRequest, Target
    from tpuctl.services.session import Session

#: Bucket names as Cloud Storage allows them (https://cloud.google.com/storage/docs/buckets#naming),
#: without the dotted (domain) form's extra rules.
_BUCKET_RE = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")
_FIX = (
    "name a bucket every host can write: --checkpoint-dir gs://BUCKET/PATH, --bucket BUCKET, or "
    "`bucket: BUCKET` in the profile"
)


def checkpoint_dir(session: Session, request: RunRequest, run_id: str, target: Target) -> str:
    """The run's checkpoint directory ('' when the run cannot checkpoint: no bucket and it cannot be
    preempted). Raises UsageError (exit 2) for a local path or a preemptible run with no bucket."""
    if request.checkpoint_dir:
        return _given(request.checkpoint_dir)
    bucket = request.bucket or session.backend.default_bucket
    if bucket:
        return f"{_run_prefix(_bucket(bucket), run_id)}/checkpoints"
    _refuse_preemptible([target.capacity] if target.existing is not None else _placement_capacities(target))
    return ""


def bucket_of(checkpoint_dir: str) -> str | None:
    """The bucket a run's checkpoint directory is in (``gs://<bucket>/...``); None for a run with none."""
    if not checkpoint_dir.startswith("gs://"):
        return None
    return checkpoint_dir.removeprefix("gs://").partition("/")[0]


def placed_near(target: Target, checkpoint_dir: str) -> Target:
    """``target`` with its placement told the bucket of ``checkpoint_dir``: zones in the bucket's location
    rank first among equally priced ones, and the plan says what a far zone costs per checkpoint
    (``tpuctl.services.placement_bucket``). Unchanged for a slice that exists, or a run with no bucket."""
    bucket = bucket_of(checkpoint_dir)
    if target.placement is None or bucket is None:
        return target
    return dataclasses.replace(
        target, placement=dataclasses.replace(target.placement, checkpoint_bucket=bucket)
    )


def compilation_cache_dir(checkpoint_dir: str, run_id: str) -> str | None:
    """Where the run's programs keep JAX's persistent compilation cache: beside the checkpoints, in the
    same bucket (``gs://<bucket>/tpuctl/runs/<run id>/compilation-cache``). None without a bucket.

    Why: every recovery starts the program on fresh VMs, whose own disks hold no cache, and compiling
    the step again is part of what each preemption costs (seconds on the simulator's CPU, minutes for a
    large model on TPU). The bucket outlives the VMs, so a restarted program reads its compiled step
    back instead (MaxText's ``jax_cache_dir`` on gs:// does the same)."""
    bucket = bucket_of(checkpoint_dir)
    return None if bucket is None else f"{_run_prefix(bucket, run_id)}/compilation-cache"


def _run_prefix(bucket: str, run_id: str) -> str:
    """The run's own prefix in a bucket: its checkpoints and compilation cache live under it."""
    return f"gs://{bucket}/tpuctl/runs/{run_id}"


def refuse_unrecoverable(
    request: RunRequest, *, bucket: str | None, default_bucket: str | None, defaults: Sequence[CapacityType]
) -> None:
    """What ``checkpoint_dir`` would refuse, checked before the backend is opened (no credentials, no
    request): a local ``--checkpoint-dir``, and a run that makes a preemptible slice (its capacity types,
    else the profile's ``defaults``) with no bucket anywhere. A run on an existing slice is checked once
    the slice's capacity is known."""
    if request.checkpoint_dir:
        _given(request.checkpoint_dir)
        return
    if bucket or default_bucket or request.pod is not None:
        return
    _refuse_preemptible(list(request.placement.capacity_types or defaults))


def _refuse_preemptible(capacities: Sequence[CapacityType]) -> None:
    """A run that may be preempted and has no bucket would lose its work at the first preemption."""
    if any(c.is_preemptible for c in capacities):
        raise UsageError(
            f"a {'/'.join(c.value for c in capacities)} run checkpoints to a bucket, and none is named: a "
            "preempted VM's disk is gone and the run would restart from step 0",
            field="checkpoint_dir",
            fix=_FIX,
        )


def _placement_capacities(target: Target) -> list[CapacityType]:
    assert target.placement is not None
    return list(target.placement.capacity_types)


def _given(path: str) -> str:
    if not path.startswith("gs://"):
        where = "a relative path" if not path.startswith("/") else "a path on one host's own disk"
        raise UsageError(
            f"--checkpoint-dir {path} is {where}: a preempted host's disk is gone, and the other hosts "
            "cannot read it",
            field="checkpoint_dir",
            value=path,
            fix=_FIX,
        )
    bucket, _, rest = path.removeprefix("gs://").partition("/")
    _bucket(bucket)
    return f"gs://{bucket}/{rest.strip('/')}".rstrip("/")


def _bucket(name: str) -> str:
    bucket = name.removeprefix("gs://").strip("/")
    if not _BUCKET_RE.match(bucket):
        raise UsageError(
            f"{name!r} is not a Cloud Storage bucket name",
            field="bucket",
            value=name,
            fix="3-222 lowercase letters, digits, '-', '_' or '.', starting and ending with a letter or "
            "digit, e.g. my-team-checkpoints",
        )
    return bucket

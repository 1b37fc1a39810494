"""SkyPilot task keys tpuctl does not support, refused by name with what to do instead: a task that
needs one must not run differently from what its author meant (docs/jobs.md lists them)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Final

from tpuctl.jobs.source import KeyPath

_ON_TPU_VM = "a TPU VM's host is fixed by its slice type; choose the type with resources.accelerators"

#: Key path (``*``: any key) -> why tpuctl refuses it and what to do instead.
UNSUPPORTED: Final[Mapping[KeyPath, str]] = {
    ("num_nodes",): "tpuctl runs a job on every host of its slice: a slice type names its hosts (a v5e-16 "
    "is 4 hosts, each running `run:`, told apart by TPUCTL_WORKER_ID), so num_nodes is always 1; for "
    "several slices joined into one job (a multislice) use `slices: N`",
    ("resources", "cpus"): _ON_TPU_VM,
    ("resources", "memory"): _ON_TPU_VM,
    ("resources", "instance_type"): _ON_TPU_VM,
    ("resources", "disk_size"): "a TPU VM's boot disk is the runtime image's; drop disk_size",
    ("resources", "disk_tier"): "a TPU VM's boot disk is the runtime image's; drop disk_tier",
    ("resources", "image_id"): "choose the TPU software with resources.accelerator_args.runtime_version",
    ("resources", "ports"): "tpuctl opens no ports; reach a host with `tpuctl pod ssh`",
    ("resources", "autostop"): "tpuctl deletes a run's slices when it ends (keep one with keep_pod: true)",
    ("resources", "network_tier"): "drop network_tier; choose the hosts' network with resources.network",
    ("resources", "accelerator_args", "tpu_name"): "tpuctl names a run's slices after the run; to use an "
    "existing slice give resources.pod",
    ("resources", "job_recovery", "recover_on_exit_codes"): "tpuctl restarts a failing program on any "
    "exit status, up to job_recovery.max_restarts_on_errors; drop recover_on_exit_codes",
    ("resources", "job_recovery", "strategy"): "tpuctl recovers by placing the run again in any allowed "
    "zone, cheapest first; drop strategy",
    ("resources", "any_of", "*", "use_spot"): "give use_spot once, in resources: every type of the set is "
    "placed with the same capacity choices",
    ("file_mounts", "*", "mode"): "MOUNT and MOUNT_CACHED (a bucket mounted with gcsfuse) are not "
    "built: use mode COPY (copied onto every host at setup), or read gs:// paths from the program; "
    "checkpoints go to `bucket`/`checkpoint_dir`",
    ("file_mounts", "*", "name"): "tpuctl does not create buckets for a mount: give an existing gs:// source",
    ("file_mounts", "*", "store"): "a file mount's source is a gs:// URL: give it as source",
    ("service",): "tpuctl runs jobs, not services; drop service",
    ("docker",): "tpuctl runs the program in the runtime image's Python environment; drop docker",
    ("volumes",): "use file_mounts with a gs:// source (copied at setup)",
    ("config",): "tpuctl's settings come from its profile (`tpuctl config`), not the task",
}

#: Values of an otherwise supported key that are refused: key path -> (allowed values, why).
ALLOWED_VALUES: Final[Mapping[KeyPath, tuple[tuple[Any, ...], str]]] = {
    ("num_nodes",): ((1,), UNSUPPORTED[("num_nodes",)]),
    ("resources", "accelerator_args", "tpu_vm"): (
        (True,),
        "TPU Nodes (tpu_vm: false: a separate host VM drives the TPU) are not supported; tpuctl runs on "
        "TPU VMs only: drop tpu_vm",
    ),
    ("file_mounts", "*", "mode"): (("COPY", "copy"), UNSUPPORTED[("file_mounts", "*", "mode")]),
}


def refused(data: Mapping[str, Any]) -> Iterator[tuple[KeyPath, str]]:
    """Every key (with its path) that ``data`` gives and tpuctl refuses, with the fix."""
    yield from _walk(data, ())


def _walk(value: Any, where: KeyPath) -> Iterator[tuple[KeyPath, str]]:
    if isinstance(value, Mapping):
        for key, item in value.items():
            path = (*where, key)
            pattern = _pattern(path)
            allowed = ALLOWED_VALUES.get(pattern)
            if allowed is not None:
                if item not in allowed[0] and item is not None:
                    yield path, allowed[1]
            elif pattern in UNSUPPORTED:
                yield path, UNSUPPORTED[pattern]
            yield from _walk(item, path)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _walk(item, (*where, index))


def _pattern(path: KeyPath) -> KeyPath:
    """``path`` with every key under a free-form mapping (file_mounts) or a list index written ``*``."""
    out: list[str | int] = []
    for part in path:
        free = bool(out) and out[-1] in ("file_mounts", "any_of", "ordered") and len(out) in (1, 2)
        out.append("*" if isinstance(part, int) or free else part)
    return tuple(out)

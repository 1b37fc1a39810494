"""The bundled runtime's batch rule: the global batch is the run's, the split is the slice's.

A run that may land on several slice types (a job's accelerator set, a recovery onto another type)
trains on whatever device count the current slice has. What must not change with it is the global batch:
it sets the optimisation (the loss, the gradient's noise, the learning rate that suits them) and which
rows each step reads (``models.lm.batch_for_step`` is keyed by step and global batch), so a run restored
from a checkpoint on another type carries on the same trajectory. What changes is how each step's global
batch is computed: split over the devices, then, on each device, into micro-batches whose gradients are
accumulated (``train.TrainStep``'s ``grad_accum_steps``).

The rule (``plan_batch``): the fewest micro-batches, at least ``min_grad_accum``, that split the global
batch evenly over the devices with at most ``device_batch`` rows per device per micro-batch (the memory
bound: the rows one device computes at once). Half the devices, twice the micro-batches; twice the
devices, half (while at least ``min_grad_accum``). A device count that does not divide the global batch
cannot keep it, and is refused (``BatchSplitError``) rather than silently changing the batch.

Plain Python, no JAX: a launcher or a test can ask it for any device count.
"""

from __future__ import annotations

from dataclasses import dataclass


class BatchSplitError(ValueError):
    """The global batch cannot be computed on this many devices under the run's limits."""


@dataclass(frozen=True)
class BatchPlan:
    """How one step's ``global_batch`` rows are computed: ``devices`` x ``grad_accum_steps`` micro-batches
    x ``device_batch`` rows."""

    global_batch: int
    devices: int
    grad_accum_steps: int

    @property
    def device_batch(self) -> int:
        """Rows one device computes at once (one micro-batch)."""
        return self.global_batch // (self.devices * self.grad_accum_steps)

    def describe(self) -> str:
        """``global batch 32 = 8 devices x 2 micro-batches x 2 rows``."""
        return (
            f"global batch {self.global_batch} = {self.devices} devices x {self.grad_accum_steps} "
            f"micro-batches x {self.device_batch} rows"
        )


def plan_batch(
    global_batch: int, devices: int, *, device_batch: int | None = None, min_grad_accum: int = 1
) -> BatchPlan:
    """The split of ``global_batch`` over ``devices`` (see the module docstring): the fewest micro-batches
    n >= ``min_grad_accum`` with ``devices * n`` dividing the global batch and at most ``device_batch``
    rows per device in each (None: no bound). ``BatchSplitError`` saying what to change when none fits."""
    if (
        global_batch < 1
        or devices < 1
        or min_grad_accum < 1
        or (device_batch is not None and device_batch < 1)
    ):
        raise BatchSplitError(
            f"need a global batch, devices, micro-batches and rows per device of 1 or more, got "
            f"{global_batch}, {devices}, {min_grad_accum}, {device_batch}"
        )
    if global_batch % devices:
        raise BatchSplitError(
            f"the global batch {global_batch} does not split evenly over {devices} devices, so this slice "
            "cannot keep it: choose a global batch that is a multiple of the device count of every slice "
            "type the run may use (their least common multiple)"
        )
    per_device = global_batch // devices
    for n in range(min_grad_accum, per_device + 1):
        if per_device % n == 0 and (device_batch is None or per_device // n <= device_batch):
            return BatchPlan(global_batch, devices, n)
    raise BatchSplitError(
        f"the global batch {global_batch} gives each of {devices} devices {per_device} rows, which do not "
        f"split into {min_grad_accum} or more equal micro-batches"
        + ("" if device_batch is None else f" of at most {device_batch} rows")
        + ": lower the minimum of micro-batches, or raise the global batch"
    )

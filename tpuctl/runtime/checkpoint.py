"""Checkpointing of the train state with orbax: periodic, asynchronous, atomic, keep-last-N, verified.

Orbax does the heavy lifting: ``CheckpointManager`` writes each step into a temporary directory and
renames it into place when complete (so a crash mid-save never leaves a half-written step that looks
finished), saves asynchronously, and prunes old steps. What we add:

- A content checksum of every array, saved as a second item of the same step (so it commits with the
  state, atomically), with each array's shape and dtype. After reading a step back we recompute it on
  device and compare: a truncated, corrupted or partially copied step is detected instead of silently
  resuming from garbage.
- Fallback: if the latest step cannot be read or fails the check, we log
  ``checkpoint step S unreadable (reason); falling back to step S'`` and try the previous one.
- Multi-host agreement: every process reads its own shards, so one host may fail where another
  succeeds. Processes vote after each attempt and all move on together; the checksum is computed on
  the global arrays, so its verdict is the same everywhere.

Directories are passed to orbax as given: ``gs://...`` on Google and on the simulator (whose GCS emulator
tensorstore reaches through ``TENSORSTORE_GCS_HTTP_URL`` and gcsfs through ``FSSPEC_GCS_ENDPOINT_URL``), or an
absolute local path (tests, a single machine). A relative path is refused: orbax refuses it too (``ValueError:
Checkpoint path should be absolute``), but only at the first save.
"""

# jax leaves parts of its public API unannotated (PartitionSpec, ShapeDtypeStruct, ...).
# mypy: disable-error-code="no-untyped-call"

from __future__ import annotations

import json
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

PyTree = Any
log = logging.getLogger(__name__)

STATE_ITEM = "state"
VERIFY_ITEM = "verify"
# The verification record's file in its item directory, named when saving so that a restore can read it
# directly (orbax's default name for a JsonCheckpointHandler item, so steps saved before still read).
_VERIFY_FILE = "metadata"
_VERIFY_FORMAT = 1


# Checksums --------------------------------------------------------------------------------------------


def _leaf_checksum(x: jax.Array) -> jax.Array:
    """A position-weighted sum of the array's words, mod 2**32.

    Integer adds and multiplies wrap exactly, so the sum is associative: the same value comes out
    however the array is sharded and whatever order the partial sums are combined in. The odd weights
    (2i+1) are invertible mod 2**32, so any single changed word changes the result, and swapped words
    are caught too. Computed elementwise over the array's own shape (no ravel), so a sharded array is
    reduced where it lies rather than gathered.
    """
    if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):  # typed PRNG keys: checksum their raw words
        x = jax.random.key_data(x)
    if x.dtype == jnp.bool_:
        x = x.astype(jnp.uint8)
    size = x.dtype.itemsize
    if size == 8:
        words = jax.lax.bitcast_convert_type(x, jnp.uint32)  # adds a trailing axis of 2
    elif size == 4:
        words = jax.lax.bitcast_convert_type(x, jnp.uint32)
    elif size == 2:
        words = jax.lax.bitcast_convert_type(x, jnp.uint16).astype(jnp.uint32)
    elif size == 1:
        words = jax.lax.bitcast_convert_type(x, jnp.uint8).astype(jnp.uint32)
    else:
        raise TypeError(f"cannot checksum dtype {x.dtype}")
    index = jnp.zeros(words.shape, jnp.uint32)
    stride = 1
    for axis in reversed(range(words.ndim)):
        index = index + jax.lax.broadcasted_iota(jnp.uint32, words.shape, axis) * jnp.uint32(stride % 2**32)
        stride *= words.shape[axis]
    weights = index * jnp.uint32(2) + jnp.uint32(1)
    return jnp.sum(words * weights, dtype=jnp.uint32)


@jax.jit
def _tree_checksums(tree: PyTree) -> list[jax.Array]:
    return [_leaf_checksum(x) for x in jax.tree.leaves(tree)]


# The same checksum computed on the host, for arrays that live in host memory (the CPU backend: the
# simulator, tests, benchmarks). XLA's CPU integer reductions run at a few hundred MB/s, slower than the
# disk; numpy's are SIMD and read the buffers in place (no copy). Same value, so a step saved on one
# platform verifies on another. The weighted sum is rewritten per shard so that no index array is built:
# for a block of words w at global offset ``base`` with global strides G,
#     sum w*(2*idx + 1) = (2*base + 1)*sum(w) + 2 * sum_a G_a * sum_k k * (w summed over all axes but a)[k]
# which is a handful of plain reductions (one per axis), all mod 2**32.

_U32 = np.uint32
_MOD = 2**32
_HOST_WORDS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint32}


# Any block gives the same value. 1024 words keep the column sums' accumulator (4 KiB) in L1: 16 arrays of
# 16 MiB summed in 22 ms with blocks of 1024 against 33 ms with 4096 (medians of 15, simulator box).
_BLOCKS = (1024, 256, 64)


def _host_block_sum(words: np.ndarray, start: tuple[int, ...], global_shape: tuple[int, ...]) -> int:
    strides, n = [], 1
    for d in reversed(global_shape):
        strides.append(n)
        n *= d
    strides.reverse()
    base = sum(s * g for s, g in zip(start, strides, strict=True)) % _MOD
    if words.ndim == 0:
        return int(words) * (2 * base + 1) % _MOD
    shape = list(words.shape)
    # A long last axis is viewed as (rows, block) so that its weights come from two short marginals.
    for block in _BLOCKS:
        if shape[-1] > block and shape[-1] % block == 0:
            shape[-1:] = [shape[-1] // block, block]
            strides[-1:] = [strides[-1] * block, strides[-1]]
            words = words.reshape(shape)
            break
    weighted, total = 0, 0
    for axis in range(words.ndim):
        others = tuple(a for a in range(words.ndim) if a != axis)
        marginal = words.sum(axis=others, dtype=_U32) if others else words.astype(_U32)
        if axis == 0:
            total = int(marginal.sum(dtype=_U32))
        k = np.arange(shape[axis], dtype=_U32)
        weighted += int((k * marginal).sum(dtype=_U32)) * strides[axis]
    return (2 * weighted + (2 * base + 1) * total) % _MOD


Block = tuple[np.ndarray, tuple[int, ...], tuple[int, ...]]


def _host_blocks(x: jax.Array) -> list[Block]:
    """``_host_block_sum`` arguments for each shard of ``x`` this process holds a primary copy of: their
    sums add up to this process's part of ``_leaf_checksum(x)``."""
    if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    blocks = []
    for shard in x.addressable_shards:
        if shard.replica_id != 0:
            continue
        data = np.asarray(shard.data)  # CPU: a view of the device buffer
        if data.dtype == np.bool_:
            data = data.view(np.uint8)
        words = data.view(_HOST_WORDS[data.dtype.itemsize])
        start = tuple(s.indices(d)[0] for s, d in zip(shard.index, x.shape, strict=True))
        shape = tuple(x.shape)
        if data.dtype.itemsize == 8:  # two words per element, low first (as bitcast_convert_type)
            words, start, shape = words.reshape((*data.shape, 2)), (*start, 0), (*shape, 2)
        blocks.append((words, start, shape))
    return blocks


# Numpy releases the GIL while it sums, so the shards are summed on a few threads at once (largest first);
# small trees are summed inline, where starting threads would cost more than it saves.
_CHECKSUM_THREADS = 4
_CHECKSUM_THREADS_MIN_BYTES = 8 << 20


def _host_leaf_checksums(leaves: list[jax.Array]) -> list[int]:
    """This process's part of ``_leaf_checksum`` of each leaf."""
    jobs = [(i, block) for i, x in enumerate(leaves) for block in _host_blocks(x)]
    workers = min(_CHECKSUM_THREADS, os.cpu_count() or 1, len(jobs))
    if workers > 1 and sum(block[0].nbytes for _, block in jobs) >= _CHECKSUM_THREADS_MIN_BYTES:
        jobs.sort(key=lambda job: -job[1][0].nbytes)
        with ThreadPoolExecutor(workers, thread_name_prefix="checksum") as pool:
            sums = list(pool.map(lambda job: _host_block_sum(*job[1]), jobs))
    else:
        sums = [_host_block_sum(*block) for _, block in jobs]
    values = [0] * len(leaves)
    for (i, _), value in zip(jobs, sums, strict=True):
        values[i] = (values[i] + value) % _MOD
    return values


def _on_host(x: Any) -> bool:
    if not isinstance(x, jax.Array):
        return False
    size = (jax.random.key_data(x) if jnp.issubdtype(x.dtype, jax.dtypes.prng_key) else x).dtype.itemsize
    return size in _HOST_WORDS and all(getattr(d, "platform", None) == "cpu" for d in x.sharding.device_set)


def checksums(tree: PyTree) -> dict[str, int]:
    """Checksum of every array leaf, keyed by its path in the tree (same value on every process)."""
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    paths = [jax.tree_util.keystr(p) for p, _ in flat]
    leaves = [x for _, x in flat]
    # The choice depends only on the platform, so every process takes the same branch.
    if leaves and all(_on_host(x) for x in leaves):
        partial = np.array(_host_leaf_checksums(leaves), dtype=np.uint64)
        if jax.process_count() > 1:
            from jax.experimental import multihost_utils

            partial = (
                np.asarray(multihost_utils.process_allgather(partial))
                .reshape(-1, len(leaves))
                .sum(axis=0, dtype=np.uint64)
            )
        values = [int(v) % _MOD for v in partial]
    else:
        values = [int(v) for v in jax.device_get(_tree_checksums(tree))]
    return dict(zip(paths, values, strict=True))


# Multi-host vote --------------------------------------------------------------------------------------


def _all_processes_ok(ok: bool) -> bool:
    if jax.process_count() == 1:
        return ok
    from jax.experimental import multihost_utils

    votes = multihost_utils.process_allgather(np.asarray(ok, dtype=np.int32))
    return bool(np.all(votes))


# The manager ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Skipped:
    step: int
    reason: str
    #: The step is intact but its state's tree, shapes or dtypes are not the target's (another model, or
    #: a state whose shapes depend on the device count): not damage, so not a reason to fall back.
    misfit: bool = False


class CheckpointMisfitError(ValueError):
    """The run's checkpoints hold a state of other shapes than the one it restores into."""


@dataclass
class RestoreResult:
    """What ``restore_latest`` found: the restored ``step`` and ``state`` (None if nothing usable), and
    every newer step it had to skip, with why."""

    step: int | None
    state: PyTree | None
    skipped: list[Skipped] = field(default_factory=list)


def _abstract(target: PyTree) -> PyTree:
    """ShapeDtypeStructs (with shardings) for a target given as arrays or as ShapeDtypeStructs."""

    def one(x: Any) -> Any:
        if isinstance(x, jax.ShapeDtypeStruct):
            return x
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None))

    return jax.tree.map(one, target)


def _path_names(path: tuple[Any, ...]) -> tuple[str, ...]:
    """Key path as plain names: NamedTuple fields and dict keys read alike (orbax stores both as dicts)."""
    names = []
    for k in path:
        for attr in ("name", "key", "idx"):
            if hasattr(k, attr):
                names.append(str(getattr(k, attr)))
                break
        else:
            names.append(str(k))
    return tuple(names)


Layout = dict[tuple[str, ...], tuple[tuple[int, ...], str]]


def _dtype_name(dtype: Any) -> str:
    try:
        return str(np.dtype(dtype))
    except TypeError:  # typed PRNG keys have no numpy dtype
        return str(dtype)


def _layout(tree: PyTree) -> Layout:
    return {
        _path_names(p): (tuple(x.shape), _dtype_name(x.dtype))
        for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]
    }


def _layout_record(tree: PyTree) -> list[list[Any]]:
    """``_layout(tree)`` as JSON for the verification record: ``[names, shape, dtype]`` per leaf."""
    return [[list(names), list(shape), dtype] for names, (shape, dtype) in _layout(tree).items()]


def _recorded_layout(record: Any) -> Layout | None:
    """The layout a verification record carries, or None for a record written before it had one."""
    if not isinstance(record, list):
        return None
    return {
        tuple(str(n) for n in names): (tuple(int(d) for d in shape), str(dtype))
        for names, shape, dtype in record
    }


def _layout_mismatch(have: Layout, want: Layout) -> str | None:
    """Why a step whose leaves are ``have`` cannot restore into a target of ``want``, or None if it can."""
    missing, extra = sorted(want.keys() - have.keys()), sorted(have.keys() - want.keys())
    if missing or extra:
        first = "/".join((missing or extra)[0])
        return f"tree differs from the target ({len(missing)} missing, {len(extra)} unexpected, e.g. {first})"
    for key in sorted(want):
        if have[key] != want[key]:
            (h_shape, h_dtype), (w_shape, w_dtype) = have[key], want[key]
            return f"{'/'.join(key)} is {h_dtype}{list(h_shape)}, target {w_dtype}{list(w_shape)}"
    return None


def _short(exc: BaseException) -> str:
    """One line for the log, with the cause (orbax wraps the tensorstore error that says what is wrong).

    Tensorstore messages run to kilobytes of spec dump after the "See full" marker; cut it.
    """

    def one(e: BaseException) -> str:
        text = " ".join(str(e).split()).split(" See full TensorStore details")[0]
        return f"{type(e).__name__}: {text}"

    text = one(exc)
    cause = exc.__cause__ or exc.__context__
    if cause is not None:
        text += f" <- {one(cause)}"
    return text if len(text) <= 400 else text[:397] + "..."


_replica_slicing_checked = False


def _no_replica_slicing_on_cpu() -> None:
    """On CPU devices (the simulator), save each shard whole from its first replica.

    Orbax's default "replica-parallel" save splits every replicated shard among its replicas, which
    slices each array on device: one small XLA program per array and slice, compiled on the process's
    first save. On the CPU backend that compile took 6.7 s of a 7 s first save of the tiny LM's state
    (0.2 s without), and the first save of a run is often the one on a preemption notice, racing the
    grace period. Replicas on CPU share one host's memory and disk, so the split buys nothing there.
    Accelerators keep orbax's default. Done once per process (it sets orbax's global handler for jax.Array).
    """
    global _replica_slicing_checked
    if _replica_slicing_checked:
        return
    _replica_slicing_checked = True
    if jax.devices()[0].platform != "cpu":
        return
    absl_log = logging.getLogger("absl")
    level = absl_log.level
    absl_log.setLevel(logging.ERROR)  # orbax warns about overriding a registered handler
    try:
        ocp.type_handlers.register_type_handler(
            jax.Array, ocp.type_handlers.ArrayHandler(use_replica_parallel=False), override=True
        )
    finally:
        absl_log.setLevel(level)


# Restores read with a TensorStore context of their own. Orbax gives every array read the default context,
# whose file I/O pool is 128 threads wide: each array's read becomes its own pread stream, and on a local
# disk a dozen concurrent 16 MiB streams defeat the kernel's per-file readahead and contend on the page
# cache (2-core simulator box, a 256 MiB step of 16 arrays read back cold, medians of 13-15 runs paired
# with a plain read: default 0.28 s with 0.24-0.30 s of CPU, 2 streams 0.22-0.26 s with 0.19-0.22 s of
# CPU; 1 stream was no better than 2, 4 and 8 worse). Two streams keep the disk busy while a finished
# read is copied out. The limit applies to the "file" kvstore only: gs:// reads go through GCS's pool.
_READ_FILE_IO_CONCURRENCY = 2


class _ReadContextArrayHandler(ocp.type_handlers.TypeHandler):  # type: ignore[misc]  # orbax is untyped
    """The registered ``jax.Array`` handler, reading with ``context`` instead of orbax's default.

    Delegates everything to the handler registered for ``jax.Array`` at construction (orbax's, or the
    CPU one from ``_no_replica_slicing_on_cpu``), so reads behave exactly as before apart from the
    TensorStore context the arrays are opened with. Used only in the registry of the restore handler:
    saves and anything else in the process keep the global registry.
    """

    def __init__(self, context: Any) -> None:
        self._inner = ocp.type_handlers.get_type_handler(jax.Array)
        self._context = context

    def typestr(self) -> str:
        return str(self._inner.typestr())

    async def metadata(self, infos: Any) -> Any:
        return await self._inner.metadata(infos)

    async def serialize(self, values: Any, infos: Any, args: Any = None) -> Any:
        return await self._inner.serialize(values, infos, args)

    async def deserialize(self, infos: Any, args: Any = None) -> Any:
        for info in infos:  # ParamInfos are made afresh for each restore call; nothing else sees them
            info.ts_context = self._context
        return await self._inner.deserialize(infos, args)

    def __getattr__(self, name: str) -> Any:  # optional TypeHandler methods (memory_size, finalize, ...)
        return getattr(self._inner, name)


def _read_verify_record(step_dir: epath.Path) -> Any:
    """The verification record saved with the step in ``step_dir``.

    Read in one request: ``JsonCheckpointHandler.restore`` asks whether the file exists and then opens it,
    and gcsfs's open asks for the object's details first, three requests in the line before the state is
    read (each a round trip to GCS). A missing file raises FileNotFoundError from the read just the same.
    """
    path = step_dir / VERIFY_ITEM / _VERIFY_FILE
    text = os.fspath(path)
    if "://" not in text:
        return json.loads(path.read_bytes())
    # epath's own filesystem for the URL (gcsfs for gs://): the one orbax reads the step through.
    return json.loads(epath.backend.fsspec_backend.fs(text).cat_file(text))


def checkpoint_directory(directory: str | epath.PathLike) -> str:
    """``directory`` as a string, checked: a URL (``gs://bucket/...``) or an absolute local path.

    Raises ValueError naming the path and the fix for a relative one (it would land in whatever directory
    each host's process starts in, and no host but the one that wrote it could restore from it).
    """
    text = os.fspath(directory)
    if "://" in text or os.path.isabs(text):
        return text
    raise ValueError(
        f"checkpoint directory {text!r} is a relative path: checkpoints need a location every host can "
        "reach after a recovery; use a bucket (gs://BUCKET/PREFIX) or an absolute path"
    )


class Checkpointer:
    """Periodic, asynchronous, verified checkpoints of a train state in ``directory``.

    ``maybe_save(step, state)`` after every step saves when ``step`` is a multiple of
    ``save_interval_steps``; ``save(step, state, force=True)`` saves now (e.g. at the end, or on a
    preemption notice); ``restore_latest(target)`` brings back the newest readable step. Keep the last
    ``max_to_keep`` steps. Call ``wait()`` (or ``close()``) before exiting: saves complete in the
    background. All methods must be called by every process of the job, in the same order.
    """

    def __init__(
        self,
        directory: str | epath.PathLike,
        *,
        save_interval_steps: int = 100,
        max_to_keep: int = 3,
        async_save: bool = True,
        delete_unreadable: bool = True,
    ) -> None:
        if save_interval_steps < 1:
            raise ValueError(f"save_interval_steps must be >= 1, got {save_interval_steps}")
        if max_to_keep < 1:
            raise ValueError(f"max_to_keep must be >= 1, got {max_to_keep}")
        self.directory = epath.Path(checkpoint_directory(directory))
        self.delete_unreadable = delete_unreadable
        # Given to the manager too, so that the steps we list for a restore are the ones it would list.
        self._name_format = ocp.step.standard_name_format()
        options = ocp.CheckpointManagerOptions(
            step_name_format=self._name_format,
            save_decision_policy=ocp.checkpoint_managers.FixedIntervalPolicy(save_interval_steps),
            preservation_policy=ocp.checkpoint_managers.LatestN(max_to_keep),
            enable_async_checkpointing=async_save,
            create=True,
            # Leftover tmp dirs of a save that crashed are never valid steps; clear them at start-up.
            cleanup_tmp_directories=True,
        )
        # Train state is mostly float weights and optimizer moments, which zstd barely shrinks; orbax's
        # default compression cost ~2/3 of save time and ~half of restore time for no saving on disk.
        # OCDBT stays on (a few large files per step instead of one tree per array, which matters on
        # GCS); its writes are fsynced by tensorstore, so a committed step is durable.
        _no_replica_slicing_on_cpu()
        handlers = {
            STATE_ITEM: ocp.PyTreeCheckpointHandler(use_ocdbt=True, use_compression=False),
            VERIFY_ITEM: ocp.JsonCheckpointHandler(filename=_VERIFY_FILE),
        }
        self._manager = ocp.CheckpointManager(self.directory, options=options, item_handlers=handlers)
        # Orbax clears those tmp dirs in a background future and awaits it only at the next save, so a
        # restore right after start-up could still see them (and a loaded machine made the test flaky).
        # It is one directory listing: finish it here.
        await_cleanup = getattr(self._manager, "_maybe_await_cleanup_tmp_directory", None)
        if callable(await_cleanup):
            await_cleanup()
        # Our read context only narrows local-file reads (see _READ_FILE_IO_CONCURRENCY); a gs:// step
        # reads through orbax's shared default context, whose GCS connections a fresh context of ours
        # would have to open again on every restore.
        self._read_registry: Any = None
        if self.directory.as_uri().startswith("file:"):
            read_context = ocp.type_handlers.get_ts_context(
                use_ocdbt=True, file_io_concurrency_limit=_READ_FILE_IO_CONCURRENCY
            )
            self._read_registry = ocp.type_handlers.create_type_handler_registry(
                (jax.Array, _ReadContextArrayHandler(read_context))
            )

    # Saving ---------------------------------------------------------------------------------------

    def should_save(self, step: int) -> bool:
        return bool(self._manager.should_save(step))

    def save(self, step: int, state: PyTree, *, force: bool = False) -> bool:
        """Start saving ``state`` as ``step`` (returns once the arrays are copied off the devices).

        Without ``force`` this follows the save interval; with it, saves unless ``step`` already exists.
        Returns whether a save was started.
        """
        if not force and not self.should_save(step):
            return False
        if step in self._manager.all_steps():
            return False
        verify = {
            "format": _VERIFY_FORMAT,
            "step": step,
            "checksums": checksums(state),
            "layout": _layout_record(state),
        }
        args = ocp.args.Composite(
            **{
                STATE_ITEM: ocp.args.PyTreeSave(state),
                VERIFY_ITEM: ocp.args.JsonSave(verify),
            }
        )
        return bool(self._manager.save(step, args=args, force=True))

    def maybe_save(self, step: int, state: PyTree) -> bool:
        return self.save(step, state, force=False)

    def wait(self) -> None:
        """Block until every started save is durable (committed and renamed into place)."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()

    # Restoring ------------------------------------------------------------------------------------

    def all_steps(self) -> list[int]:
        """Committed steps, oldest first (tmp dirs of unfinished saves are not steps)."""
        self._manager.reload()
        return sorted(self._manager.all_steps())

    def _committed_step_dirs(self) -> dict[int, epath.Path]:
        """Committed steps and their directories, oldest first, as ``all_steps`` finds them.

        For restoring: one listing and one commit check per step (orbax's own test of a finished step),
        where ``manager.reload()`` also reads every step's commit time and metrics (5 more requests a
        step, ~10 ms through the emulator and more on GCS, before the first byte of state), and where
        ``find_step_path`` then checks the chosen step's commit again. The manager is reloaded only when
        its list differs, so it still sees what the bucket holds before it next saves or prunes.
        """
        found = self._name_format.find_all(self.directory)
        dirs = {m.step: m.path for m in sorted(found, key=lambda m: m.step)}
        if set(dirs) != set(self._manager.all_steps()):
            self._manager.reload()
        return dirs

    def latest_step(self) -> int | None:
        steps = self.all_steps()
        return steps[-1] if steps else None

    def _step_dir(self, step: int) -> epath.Path:
        return ocp.step.find_step_path(self.directory, self._name_format, step=step)

    def _read(
        self, step: int, target: PyTree, step_dir: epath.Path | None = None
    ) -> tuple[PyTree | None, dict[str, Any] | None, str | None, bool]:
        """Read one step on this process (in ``step_dir`` when the caller has found it already): the
        state, its verification record, why it is unusable, and whether that is a misfit (its layout is
        not the target's; the same verdict on every process, from the same record). Handler-level reads,
        not ``CheckpointManager.restore``: the latter ends in a cross-process barrier that a process
        which failed to read would never reach."""
        try:
            if step_dir is None:
                step_dir = self._step_dir(step)
            verify = _read_verify_record(step_dir)
            # Shapes and dtypes first: a clear reason, and no doomed read of every array (which also
            # leaves orbax's reader tasks failing noisily in the background). They come from the record
            # we saved with the step; orbax's metadata has them too, but reading it opens every array
            # (10 ms for 16 arrays, before the restore opens them all again), so it is only asked for
            # steps saved before the record carried the layout.
            have = _recorded_layout(verify.get("layout")) if isinstance(verify, dict) else None
            if have is None:
                have = _layout(ocp.StandardCheckpointHandler().metadata(step_dir / STATE_ITEM))
            want = _layout(target)
            mismatch = _layout_mismatch(have, want)
            if mismatch is not None:
                return None, None, mismatch, True
            state = self._restore_state(step_dir / STATE_ITEM, _abstract(target))
            # What came back must be what was asked for: orbax's CPU handler, for one, returns a typed
            # PRNG key as its raw uint32 words, which the checksum (computed on those words) would pass.
            mismatch = _layout_mismatch(_layout(state), want)
            if mismatch is not None:
                return None, None, f"restored {mismatch}", False
            return state, verify, None, False
        except Exception as exc:  # any failure to read means this step is not usable
            return None, None, _short(exc), False

    def _restore_state(self, directory: epath.Path, abstract: PyTree) -> PyTree:
        if all(getattr(x, "sharding", None) is not None for x in jax.tree.leaves(abstract)):
            # StandardRestore's arguments for a target whose leaves all carry a sharding (every leaf read
            # as a jax.Array), on a handler with the registry that reads with our TensorStore context.
            handler = (
                ocp.PyTreeCheckpointHandler(type_handler_registry=self._read_registry)
                if self._read_registry is not None
                else ocp.PyTreeCheckpointHandler()
            )
            return handler.restore(
                directory,
                args=ocp.args.PyTreeRestore(
                    item=abstract, restore_args=ocp.checkpoint_utils.construct_restore_args(abstract)
                ),
            )
        # A leaf without a sharding takes its saved sharding from the checkpoint's metadata (or comes back
        # as numpy): StandardRestore's own logic, with orbax's registry and context.
        return ocp.StandardCheckpointHandler().restore(directory, args=ocp.args.StandardRestore(abstract))

    def _verify(self, step: int, state: PyTree, verify: Any) -> str | None:
        if not isinstance(verify, dict) or verify.get("format") != _VERIFY_FORMAT:
            return "missing or unknown verification record"
        if verify.get("step") != step:
            return f"verification record is for step {verify.get('step')}"
        expected: dict[str, int] = verify.get("checksums", {})
        actual = checksums(state)
        if set(expected) != set(actual):
            return "tree structure differs from the verification record"
        bad = [p for p in actual if actual[p] != expected[p]]
        if bad:
            return f"checksum mismatch in {len(bad)} array(s), first {bad[0]}"
        return None

    def _try(
        self, step: int, target: PyTree, step_dir: epath.Path | None = None
    ) -> tuple[PyTree | None, str | None, bool]:
        """The step's state, or why not and whether that is a misfit (see ``_read``)."""
        state, verify, reason, misfit = self._read(step, target, step_dir)
        if not _all_processes_ok(reason is None):
            return None, reason or "another process could not read it", misfit
        # Every process holds its shards now, so the (collective) checksum can run everywhere.
        reason = self._verify(step, state, verify)
        return (None, reason, False) if reason else (state, None, False)

    def restore_latest(self, target: PyTree, *, refuse_misfit: bool = False) -> RestoreResult:
        """Restore the newest step that reads back intact, into ``target``'s shapes/dtypes/shardings.

        ``target`` is a state of the right structure (arrays or ``jax.ShapeDtypeStruct``s with
        shardings, e.g. ``TrainStep.abstract_state(...)``). The shardings may differ from the saved
        ones (another sharding, another device count: the arrays are laid out anew); the global shapes
        and dtypes may not. Steps newer than the one restored that failed are logged, reported in the
        result and, once an older step has restored (``delete_unreadable``), deleted so that training
        can save those step numbers again.

        With ``refuse_misfit``, a newest step that is intact but of other shapes than ``target``
        raises ``CheckpointMisfitError`` naming it and the first difference, instead of falling back
        (an older step of the same run has the same shapes) or starting fresh: what a run restored on
        another slice type wants, rather than training from step 0 over its own checkpoints.
        """
        result = RestoreResult(None, None)
        dirs = self._committed_step_dirs()
        steps = list(dirs)
        for i in range(len(steps) - 1, -1, -1):
            step = steps[i]
            state, reason, misfit = self._try(step, target, dirs[step])
            if reason is None:
                result.step, result.state = step, state
                break
            if misfit and refuse_misfit:
                raise CheckpointMisfitError(
                    f"checkpoint step {step} in {self.directory} holds a train state of other shapes than "
                    f"this run's ({reason}); it restores across device counts and shardings, not across "
                    "shapes: resume with the model settings it was written with, or start over in "
                    "another checkpoint directory"
                )
            result.skipped.append(Skipped(step, reason, misfit))
            after = f"falling back to step {steps[i - 1]}" if i else "no earlier checkpoint; starting fresh"
            log.warning("checkpoint step %d unreadable (%s); %s", step, reason, after)
        # Only once an older step restored: that proves the target fits the checkpoints, so the skipped
        # ones are damaged rather than, say, written by a different model the user has since changed.
        if result.skipped and result.step is not None and self.delete_unreadable:
            for s in result.skipped:
                self._manager.delete(s.step)
            self._manager.reload()
        if result.step is not None:
            log.info("restored checkpoint step %d from %s", result.step, self.directory)
        return result

    def latest_good_step(self, target: PyTree) -> int | None:
        """The newest step that reads back intact (reads it fully; deletes nothing)."""
        dirs = self._committed_step_dirs()
        for step, step_dir in reversed(dirs.items()):
            _, reason, _ = self._try(step, target, step_dir)
            if reason is None:
                return step
        return None

    def restore(self, step: int, target: PyTree) -> PyTree:
        """Restore exactly ``step`` (verified); raises ``ValueError`` if it is unreadable."""
        state, reason, _ = self._try(step, target)
        if reason is not None:
            raise ValueError(f"checkpoint step {step} unreadable ({reason})")
        return state


def abstract_like(state: PyTree) -> PyTree:
    """Restore target from a live state: shapes, dtypes and shardings, no data."""
    return _abstract(state)


__all__ = [
    "CheckpointMisfitError",
    "Checkpointer",
    "RestoreResult",
    "Skipped",
    "abstract_like",
    "checkpoint_directory",
    "checksums",
]

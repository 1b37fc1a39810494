"""Checkpoints in a bucket: the Checkpointer saves to and restores from gs:// through the simulator's GCS
emulator (tensorstore via TENSORSTORE_GCS_HTTP_URL, gcsfs via STORAGE_EMULATOR_HOST, as on a simulated
host), refuses relative directories, and costs little over orbax's bare save and restore of the same state
through the same bucket (the figures are printed; run with -s)."""

# jax leaves parts of its public API unannotated.
# mypy: disable-error-code="no-untyped-call"

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tpuctl.sim.network import network_env
from tpuctl.sim.storage import DEFAULT_BUCKET, StorageEmulator


@pytest.fixture
def bucket(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[str]:
    emulator = StorageEmulator()
    url = emulator.start()
    for name, value in network_env(mirror_url="http://127.0.0.1:9/", storage_url=url).items():
        monkeypatch.setenv(name, value)
    # Nothing may land on the local disk: the working directory is an empty folder we check afterwards.
    monkeypatch.chdir(tmp_path)
    yield f"gs://{DEFAULT_BUCKET}"
    emulator.stop()
    assert list(tmp_path.iterdir()) == []


def _state(mib: int = 8, leaves: int = 8) -> dict[str, Any]:
    import jax.numpy as jnp

    n = mib * (1 << 20) // 4 // leaves
    return {f"w{i}": jnp.arange(n, dtype=jnp.float32) * (i + 1) for i in range(leaves)} | {
        "step": jnp.int32(7)
    }


@pytest.mark.parametrize("path", ["ckpt", "runs/r1/checkpoints", "./x"])
def test_relative_directory_is_refused(path: str) -> None:
    from tpuctl.runtime.checkpoint import Checkpointer

    with pytest.raises(ValueError, match=rf"'{path}' is a relative path.*gs://BUCKET"):
        Checkpointer(path)


def test_save_and_restore_through_the_bucket(bucket: str) -> None:
    import jax
    import numpy as np
    from etils import epath

    from tpuctl.runtime.checkpoint import Checkpointer, abstract_like

    directory = f"{bucket}/tpuctl/runs/r1/checkpoints"
    state = _state(2, 4)
    ckpt = Checkpointer(directory, save_interval_steps=10, max_to_keep=2)
    for step in (10, 20, 30):
        assert ckpt.maybe_save(step, jax.tree.map(lambda x, s=step: x + s, state))
    ckpt.close()
    assert sorted(p.name for p in epath.Path(directory).iterdir()) == ["20", "30"]
    again = Checkpointer(directory)
    result = again.restore_latest(abstract_like(state))
    again.close()
    assert result.step == 30 and result.skipped == []
    for key, value in state.items():
        assert result.state is not None
        np.testing.assert_array_equal(np.asarray(result.state[key]), np.asarray(value + 30))


def _timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _ours(directory: str, state: Any, target: Any) -> tuple[float, float]:
    from tpuctl.runtime.checkpoint import Checkpointer

    ckpt = Checkpointer(directory)

    def save_durably() -> None:
        ckpt.save(1, state, force=True)
        ckpt.wait()

    save = _timed(save_durably)
    ckpt.close()
    fresh = Checkpointer(directory)  # as after a restart
    restore = _timed(lambda: fresh.restore_latest(target))
    fresh.close()
    return save, restore


def _bare(directory: str, state: Any, target: Any) -> tuple[float, float]:
    import orbax.checkpoint as ocp

    plain = ocp.StandardCheckpointer()
    path = f"{directory}/1"
    save = _timed(lambda: (plain.save(path, state), plain.wait_until_finished()))
    restore = _timed(lambda: plain.restore(path, target))
    plain.close()
    return save, restore


def test_overhead_against_bare_orbax(bucket: str) -> None:
    """Save (until durable) and restore (read back, and for tpuctl verified) with the Checkpointer against
    orbax's StandardCheckpointer on the same state in the same bucket: one untimed warm-up of each, then
    rounds alternating which goes first; medians of 4."""
    from tpuctl.runtime.checkpoint import abstract_like

    state = _state()
    target = abstract_like(state)
    _ours(f"{bucket}/warm-ours", state, target)
    _bare(f"{bucket}/warm-bare", state, target)
    ours: list[tuple[float, float]] = []
    bare: list[tuple[float, float]] = []
    for i in range(4):
        order = [(ours, _ours), (bare, _bare)]
        for into, run in order if i % 2 == 0 else order[::-1]:
            into.append(run(f"{bucket}/{run.__name__}{i}", state, target))
    for k, what in enumerate(("save", "restore")):
        o = statistics.median(r[k] for r in ours)
        b = statistics.median(r[k] for r in bare)
        print(f"8 MiB gs:// {what}: tpuctl {o:.3f} s, bare orbax {b:.3f} s, ratio (bare/tpuctl) {b / o:.2f}")
        # Not a speed assertion (the machine is shared); a sanity bound that catches a pathology.
        assert o < 10 * b + 1.0

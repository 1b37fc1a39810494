"""Checkpoints in a bucket: the Checkpointer saves to and restores from gs:// through the simulator's GCS
emulator (tensorstore via TENSORSTORE_GCS_HTTP_URL, gcsfs via FSSPEC_GCS_ENDPOINT_URL, as on a simulated
host) and refuses relative directories. What it costs over orbax's bare save and restore through the same
bucket is a benchmark: scripts/bench_checkpoint_gcs.py."""

# jax leaves parts of its public API unannotated.
# mypy: disable-error-code="no-untyped-call"

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tpuctl.sim import default_world
from tpuctl.sim.iam import ADC_TOKEN
from tpuctl.sim.network import caller_storage_env, network_env
from tpuctl.sim.storage import DEFAULT_BUCKET, StorageEmulator


@pytest.fixture
def bucket(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[str]:
    emulator = StorageEmulator(default_world)
    url = emulator.start()
    home = tmp_path / "credentials"
    home.mkdir()
    env = network_env(mirror_url="http://127.0.0.1:9/", storage_url=url) | caller_storage_env(
        ADC_TOKEN, home, "tpuctl-sim"
    )
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    import fsspec.config
    from etils import epath

    # fsspec reads its FSSPEC_* variables once, at import, and etils keeps the filesystem it made with
    # them: a host's program starts with them set, but this process meets a new emulator every test.
    conf: dict[str, dict[str, str]] = {}
    fsspec.config.set_conf_env(conf)
    monkeypatch.setattr(fsspec.config, "conf", conf)
    epath.backend.fsspec_backend._get_filesystem.cache_clear()
    # Nothing may land on the local disk: the working directory is an empty folder we check afterwards.
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    yield f"gs://{DEFAULT_BUCKET}"
    emulator.stop()
    assert list(work.iterdir()) == []


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


def test_restore_finds_steps_saved_after_the_checkpointer_started(bucket: str) -> None:
    """A restore lists the bucket afresh, and the manager learns of what it found: saving a step that
    another Checkpointer wrote meanwhile is refused as existing, not written over."""
    import jax
    import numpy as np

    from tpuctl.runtime.checkpoint import Checkpointer, abstract_like

    directory = f"{bucket}/tpuctl/runs/r2/checkpoints"
    state = _state(1, 2)
    early = Checkpointer(directory)
    assert early.all_steps() == []
    writer = Checkpointer(directory)
    for step in (1, 2):
        assert writer.save(step, jax.tree.map(lambda x, s=step: x + s, state), force=True)
    writer.close()
    result = early.restore_latest(abstract_like(state))
    assert result.step == 2 and result.skipped == [] and result.state is not None
    np.testing.assert_array_equal(np.asarray(result.state["w1"]), np.asarray(state["w1"] + 2))
    assert early.save(2, state, force=True) is False
    assert early.latest_good_step(abstract_like(state)) == 2
    early.close()


def test_missing_verification_record_falls_back_to_the_previous_step(bucket: str) -> None:
    import jax
    from etils import epath

    from tpuctl.runtime.checkpoint import Checkpointer, abstract_like

    directory = f"{bucket}/tpuctl/runs/r3/checkpoints"
    state = _state(1, 2)
    ckpt = Checkpointer(directory)
    for step in (1, 2):
        assert ckpt.save(step, jax.tree.map(lambda x, s=step: x + s, state), force=True)
    ckpt.close()
    records = list((epath.Path(directory) / "2" / "verify").iterdir())
    assert records, "the step has a verification record"
    for record in records:
        record.unlink()
    again = Checkpointer(directory)
    result = again.restore_latest(abstract_like(state))
    again.close()
    assert result.step == 1
    [skipped] = result.skipped
    assert skipped.step == 2 and "FileNotFoundError" in skipped.reason

"""Run environments kept from one simulated bucket to the next, as a team's bucket keeps them between runs.

A run's first host builds the runtime's environment and stores it in the run's bucket
(``tpuctl.hosts.envstore``); every later run with the same inputs restores it instead. Each test starts a
fresh simulator with an empty bucket, so without this every test that runs the bundled runtime would
build and store the same ~700 MB environment again: on a 2-core machine ~9 s of a test's ~12 s of setup.
``StoredEnvs`` keeps what one simulator's bucket stored under ``tpuctl/envs/`` (``harvest``) and puts it
into the next one's bucket before its emulator starts (``seed``): the objects and their metadata as the
emulator wrote them, the archives hard-linked (no copy). The run then finds its environment stored, as a
second run in a real project does, and takes the restore path (the one every recovery and every
non-building host takes); the tests of building and storing start from an empty bucket (``fresh``).

Only the environments' prefix is kept (never a run's checkpoints or anything else), and only an
environment whose record (``stored.json``) was written: a store cut short left none, and is not kept.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tpuctl.hosts.envstore import env_prefix
from tpuctl.sim.storage import DEFAULT_BUCKET

#: Every environment's objects are below this prefix (``env_prefix`` of any key).
_ENVS_PREFIX = env_prefix("")
_RECORD = "stored.json"
_INDEX = "objects.json"


@dataclass(frozen=True)
class StoredEnvs:
    """Environments kept in ``keep_dir`` (one directory per test session and process)."""

    keep_dir: Path

    def harvest(self, storage_dir: Path, bucket: str = DEFAULT_BUCKET) -> int:
        """Keep every complete environment of ``bucket`` in the emulator data at ``storage_dir`` that is not
        kept yet; returns how many objects were newly kept. Call it once the emulator has stopped."""
        from gcp_storage_emulator.storage import STORAGE_DIR, Storage

        if not (storage_dir / STORAGE_DIR / ".meta").exists():
            return 0
        try:
            storage = Storage(data_dir=str(storage_dir.absolute()))
        except ValueError:  # its index caught mid-rewrite by a process still serving it: keep nothing now
            return 0
        objects: dict[str, Any] = (storage.objects.get(bucket) or {}).copy()
        complete = {name.rsplit("/", 1)[0] for name in objects if _is_record(name)}
        kept = self._index()
        added = 0
        for name, meta in objects.items():
            if name in kept or not name.startswith(_ENVS_PREFIX) or name.rsplit("/", 1)[0] not in complete:
                continue
            source = _object_file(storage, bucket, name)
            target = self.keep_dir / "objects" / name
            target.parent.mkdir(parents=True, exist_ok=True)
            _link_or_copy(source, target)
            kept[name] = meta
            added += 1
        if added:
            self._write_index(kept)
        return added

    def seed(self, storage_dir: Path, bucket: str = DEFAULT_BUCKET) -> int:
        """Put every kept environment into ``bucket`` of the emulator data at ``storage_dir`` (created as the
        simulator creates it when missing); returns how many objects were added. Call it before an emulator
        over ``storage_dir`` starts: it reads its index only then."""
        from gcp_storage_emulator.handlers.buckets import create_bucket
        from gcp_storage_emulator.storage import Storage

        kept = self._index()
        if not kept:
            return 0
        storage_dir.mkdir(mode=0o700, parents=True, exist_ok=True)  # private, as StorageEmulator makes it
        storage = Storage(data_dir=str(storage_dir.absolute()))
        create_bucket(bucket, storage)  # what the emulator does at its start; nothing if it exists
        present = storage.objects.setdefault(bucket, {})
        added = 0
        for name, meta in kept.items():
            if name in present:
                continue
            target = _object_file(storage, bucket, name)
            target.parent.mkdir(parents=True, exist_ok=True)
            _link_or_copy(self.keep_dir / "objects" / name, target)
            present[name] = meta
            added += 1
        if added:
            storage._write_config_to_file()  # the emulator's own index writer, in its own format
        return added

    def _index(self) -> dict[str, Any]:
        try:
            index: dict[str, Any] = json.loads((self.keep_dir / _INDEX).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        return index

    def _write_index(self, kept: dict[str, Any]) -> None:
        self.keep_dir.mkdir(parents=True, exist_ok=True)
        temporary = self.keep_dir / f".{_INDEX}.tmp"
        temporary.write_text(json.dumps(kept), encoding="utf-8")
        temporary.replace(self.keep_dir / _INDEX)


def _is_record(name: str) -> bool:
    return name.startswith(_ENVS_PREFIX) and name.endswith("/" + _RECORD)


def _object_file(storage: Any, bucket: str, name: str) -> Path:
    path: Path = storage._store._disk_path(storage._object_path(bucket, name))
    return path


def _link_or_copy(source: Path, target: Path) -> None:
    """``target`` names ``source``'s content: a hard link where the file system allows one (archives are
    written once and never rewritten in place), else a copy."""
    with contextlib.suppress(FileNotFoundError):
        target.unlink()
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


__all__ = ["StoredEnvs"]

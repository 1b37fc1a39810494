"""Where an uploaded program waits for the run that names it: content-addressed files
(``<state dir>/server/bundles/<sha256>.tar.gz``, 0600), checked against their digest on the way in.
Once a run is recorded, its bundle is the ledger's (any replica reads it there); these files are only
the hand-over between the upload and the submission, and are pruned a day after their last upload (not
at once: two clients may submit the same program at the same moment, each after its own upload)."""

from __future__ import annotations

import contextlib
import hashlib
from pathlib import Path
from typing import Final

from tpuctl.server.problems import RequestProblem
from tpuctl.store.paths import atomic_write_bytes, ensure_private_dir

#: The largest bundle the server takes: what the ledger stores per run (``runstate.MAX_BLOB_BYTES``).
MAX_BUNDLE_BYTES: Final = 64 * 1024 * 1024
#: How long an uploaded bundle is kept after its last upload.
KEEP_S: Final = 24 * 3600.0


class BundleStore:
    def __init__(self, directory: Path) -> None:
        self._dir = directory

    def put(self, sha256: str, data: bytes) -> int:
        """Keep ``data`` under its digest; 400 when ``sha256`` is not its digest, 413 when too big."""
        if len(data) > MAX_BUNDLE_BYTES:
            raise too_large(len(data))
        actual = hashlib.sha256(data).hexdigest()
        if actual != sha256:
            raise RequestProblem(
                f"the body's SHA-256 is {actual}, not the {sha256} the path names",
                status=400,
                field="sha256",
                value=sha256,
                fix="PUT the bundle at /v1/bundles/<the SHA-256 of the body>",
            )
        ensure_private_dir(self._dir)
        atomic_write_bytes(self._path(sha256), data)
        return len(data)

    def get(self, sha256: str) -> bytes:
        """The bundle; 409 (upload it first) when it is not here."""
        try:
            return self._path(sha256).read_bytes()
        except FileNotFoundError:
            raise RequestProblem(
                f"no bundle {sha256} was uploaded to this server",
                status=409,
                field="bundle_sha256",
                value=sha256,
                fix=f"PUT the bundle at /v1/bundles/{sha256} first",
            ) from None

    def prune(self, *, now: float, keep_s: float = KEEP_S) -> list[str]:
        """Remove the bundles last uploaded more than ``keep_s`` before ``now``; their digests."""
        removed = []
        for path in self._dir.glob("*.tar.gz") if self._dir.is_dir() else ():
            with contextlib.suppress(FileNotFoundError):  # another request pruned it meanwhile
                if path.stat().st_mtime < now - keep_s:
                    path.unlink()
                    removed.append(path.name.removesuffix(".tar.gz"))
        return removed

    def _path(self, sha256: str) -> Path:
        return self._dir / f"{sha256}.tar.gz"


def too_large(size: int) -> RequestProblem:
    return RequestProblem(
        f"the bundle is {size} bytes, more than the {MAX_BUNDLE_BYTES} a run's bundle may be",
        status=413,
        field="bundle",
        value=size,
        fix="leave large files out of the program's directory (.tpuctlignore) and read them from a bucket",
    )

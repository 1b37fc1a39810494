"""The key that encrypts a run's secrets in the ledger, and the encryption itself.

A run's secrets (its per-run SSH private key; later the job file's secrets) must be readable by whichever
supervisor owns the run, on any machine, so they live in the ledger; but the ledger is a file (or a
database) that backups, copies and colleagues see, so they live there only encrypted, and the key never
does. Fernet (``cryptography``): AES-128-CBC with an HMAC-SHA256 over it, a random IV per message, one
well-reviewed construction with no parameter to get wrong.

Where the key comes from, first found wins:

* ``TPUCTL_SECRET_KEY``: the key itself (urlsafe base64 of 32 bytes), for the supervisors of a team that
  share one ledger and must share one key (put it in each one's secret store, not in a config file);
* the ``secret_key_file`` setting (default ``<state_dir>/secret.key``), created 0600 with a fresh key the
  first time it is needed.

Each ciphertext is stored with the key's id (a hash of the key, not the key), so a supervisor holding
another key is told so plainly instead of getting a decryption failure.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hashlib
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final

from tpuctl.errors import SecretKeyError
from tpuctl.params import LABEL, ParamError
from tpuctl.store.paths import fsync_dir

if TYPE_CHECKING:
    from cryptography.fernet import Fernet

#: The environment variable that holds the key itself.
SECRET_KEY_ENV: Final = "TPUCTL_SECRET_KEY"
#: The key file's name in a state directory (the default of ``secret_key_file``).
SECRET_KEY_FILENAME: Final = "secret.key"
_KEY_BYTES: Final = 32
_GENERATE: Final = 'python -c "from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())"'


@dataclass(frozen=True)
class SecretKey:
    """A Fernet key and where it came from (named in every error about it)."""

    key: bytes = field(repr=False)
    #: ``TPUCTL_SECRET_KEY`` or ``secret_key_file /path``: what a user changes to use another key.
    source: str

    @property
    def key_id(self) -> str:
        """A public id of the key (16 hex digits of a hash of it): which key encrypted a secret."""
        return hashlib.sha256(b"tpuctl secret key id\0" + self.key).hexdigest()[:16]

    def _fernet(self) -> Fernet:
        from cryptography.fernet import Fernet  # a heavy import, only where a secret is handled

        return Fernet(self.key)

    def encrypt(self, plaintext: bytes) -> bytes:
        return self._fernet().encrypt(plaintext)

    def decrypt(self, ciphertext: bytes, *, key_id: str, what: str) -> bytes:
        """The plaintext of ``ciphertext`` (which the key ``key_id`` made); ``SecretKeyError`` naming
        ``what`` and this key's source when this is another key or the ciphertext was altered."""
        from cryptography.fernet import InvalidToken

        if key_id != self.key_id:
            raise SecretKeyError(
                f"{what} was encrypted with another key (id {key_id}) than the one from {self.source} "
                f"(id {self.key_id})",
                fix=f"set {SECRET_KEY_ENV} (or the secret_key_file setting) to the key of the supervisors "
                "that wrote it",
            )
        try:
            return self._fernet().decrypt(ciphertext)
        except InvalidToken:
            raise SecretKeyError(
                f"{what} does not decrypt with the key from {self.source} (id {self.key_id}): the stored "
                "ciphertext was altered",
                fix="store the secret again (it cannot be recovered from the ledger)",
            ) from None


def generate_key() -> bytes:
    """A fresh random key, as Fernet writes one (urlsafe base64 of 32 random bytes)."""
    return base64.urlsafe_b64encode(os.urandom(_KEY_BYTES))


def parse_secret_key(text: str, param: str = "secret_key") -> bytes:
    """``text`` as a Fernet key (urlsafe base64 of 32 bytes); a ``ParamError`` naming ``param`` otherwise.
    The value itself is never repeated in the error: it is a secret, even when malformed."""
    raw = text.strip().encode("ascii", errors="replace")
    try:
        decoded = base64.urlsafe_b64decode(raw)
    except (binascii.Error, ValueError):
        decoded = b""
    if len(decoded) != _KEY_BYTES:
        raise ParamError(
            f"{LABEL} is not a secret key (urlsafe base64 of 32 bytes, 44 characters)",
            param=param,
            value="(hidden)",
            fix=f"generate one with {_GENERATE}",
        )
    return raw


def key_from_env(text: str) -> SecretKey:
    return SecretKey(parse_secret_key(text, param=SECRET_KEY_ENV), SECRET_KEY_ENV)


def load_secret_key(*, env_key: str | None, key_file: Path) -> SecretKey:
    """The key in force: ``env_key`` (the value of ``TPUCTL_SECRET_KEY``) when set, else the key in
    ``key_file``, created with a fresh key (0600) when absent."""
    if env_key:
        return key_from_env(env_key)
    source = f"secret_key_file {key_file}"
    if not key_file.exists():
        _create_key_file(key_file)
    try:
        text = key_file.read_text(encoding="ascii")
    except (OSError, UnicodeDecodeError) as exc:
        raise SecretKeyError(
            f"cannot read the secret key file {key_file}: {exc}",
            fix="check its owner and mode (0600), or point the secret_key_file setting at another file",
        ) from None
    try:
        key = parse_secret_key(text)
    except ParamError:
        raise SecretKeyError(
            f"the secret key file {key_file} does not hold a secret key",
            fix=f"put the key there (generate one with {_GENERATE}), or point secret_key_file elsewhere",
        ) from None
    return SecretKey(key, source)


def _create_key_file(path: Path) -> None:
    """Write a fresh key to ``path`` unless another process does first: the key goes to a private temp
    file, fully written and fsynced, which is then hard-linked into place (fails if ``path`` exists), so
    two tpuctl processes never each use a key of their own and nobody reads half a key."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)  # 0600
    tmp = Path(tmp_name)
    try:
        try:
            os.write(fd, generate_key() + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)
    finally:
        tmp.unlink()
    fsync_dir(path.parent)

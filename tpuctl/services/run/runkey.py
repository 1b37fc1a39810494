"""The run's SSH key: the one key pair every supervisor of a run logs in to its hosts with, on any machine.

A run that creates its slices gets a fresh ed25519 key pair when it is recorded; its public key goes in
the ``ssh-keys`` metadata of every slice the run creates. A run on the user's own ``--pod`` (made by ``pod
create`` with the state dir's key) takes that state dir's key pair as its own, so that a supervisor on
another machine reaches the same hosts. Either way the private key is in the ledger only encrypted
(``Ledger.put_secret``, with the key of ``store.secrets``), and a supervisor holds it in memory only:
it is never written in plain text to the ledger, a bucket, a log or a file of the run. A plan creates no
key (it shows ``access.PLAN_PUBLIC_KEY``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tpuctl.hosts.ssh import KeyPair
    from tpuctl.services.run.model import PreparedRun
    from tpuctl.services.session import Session
    from tpuctl.settings import Settings
    from tpuctl.store.secrets import SecretKey

#: The name of the run's private key among its secrets in the ledger.
SECRET_NAME = "ssh_key"


def secret_key(settings: Settings) -> SecretKey:
    """The key that encrypts runs' secrets: ``TPUCTL_SECRET_KEY``, else the ``secret_key_file``."""
    from tpuctl.store.secrets import load_secret_key

    env_key = None if settings.secret_key is None else settings.secret_key.get_secret_value()
    return load_secret_key(env_key=env_key, key_file=settings.resolved_secret_key_file)


def store_run_key(session: Session, prepared: PreparedRun) -> KeyPair:
    """Make (or, for a run on the user's own slices, take the state dir's) key pair of ``prepared``'s
    run and store its private key, encrypted, in the ledger."""
    from tpuctl.hosts.ssh import KeyPair, ensure_key_pair

    if prepared.target.creates:
        key = KeyPair.generate(comment=f"tpuctl-run-{prepared.run_id}")
    else:
        key = ensure_key_pair(session.state_dir)
    session.ledger.put_secret(prepared.run_id, SECRET_NAME, key.private_bytes(), secret_key(session.settings))
    return key


def load_run_key(session: Session, run_id: str) -> KeyPair:
    """The run's key pair from the ledger, decrypted in memory (``SecretKeyError`` naming the setting to
    change when it was stored with another key); the state dir's for a run recorded before runs had
    keys of their own (its slices carry that one)."""
    from tpuctl.hosts.ssh import KeyPair, ensure_key_pair

    stored = session.ledger.get_secret(run_id, SECRET_NAME, secret_key(session.settings))
    if stored is None:
        return ensure_key_pair(session.state_dir)
    return KeyPair.from_private_openssh(stored)

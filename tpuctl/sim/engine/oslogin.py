"""OS Login (oslogin v1) as the simulator serves it: the world's principal imports SSH keys, hosts with OS
Login on accept exactly those keys (unexpired) under the principal's POSIX account, and ignore ``ssh-keys``.

Shapes follow google/cloud/oslogin/v1/oslogin.proto and google/cloud/oslogin/common/common.proto
(googleapis/googleapis): ImportSshPublicKeyResponse {loginProfile}, LoginProfile {name, posixAccounts,
sshPublicKeys (map fingerprint -> SshPublicKey)}, PosixAccount {primary, username, uid, gid,
homeDirectory, shell, gecos, systemId, accountId, operatingSystemType, name}, SshPublicKey {key,
expirationTimeUsec, fingerprint, name}. Public keys are identified by their SHA-256 fingerprint.

Whether OS Login is on for a host: the node's (instance's) ``enable-oslogin`` metadata where it is set,
else the project's (:func:`project_metadata`: ``enable-oslogin=TRUE`` when the world's ``os_login`` is on),
as https://cloud.google.com/compute/docs/oslogin/set-up-oslogin has it.

The caller is the account of the request's token (``tpuctl.sim.iam``; tpuctl's own clients send the
world's ``principal``'s, and the tokeninfo endpoint names it). Where Google's rule is not documented, the
simulator is the stricter reading:

- a key is imported only into the caller's own profile (another account's: 403 PERMISSION_DENIED);
- importing a key already in the profile leaves its expiry as it was (moving it takes
  ``users.sshPublicKeys.patch``, as gcloud's ``os-login ssh-keys update --ttl`` does);
- a key past its ``expirationTimeUsec`` lets no one in (it stays listed in the profile).
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Mapping
from typing import Any

from tpuctl.sim.api_errors import ApiError, invalid_argument, not_found
from tpuctl.sim.engine.context import Context
from tpuctl.sim.world import World

_NON_ALNUM = re.compile(r"[^A-Za-z0-9]")


def posix_username(email: str) -> str:
    """The POSIX user name OS Login gives ``email``: every character that is not a letter or a digit
    becomes ``_`` (alice@example.com -> alice_example_com; https://cloud.google.com/compute/docs/connect/
    add-ssh-keys: "combining the username and domain from the email")."""
    return _NON_ALNUM.sub("_", email)


def project_metadata(world: World) -> dict[str, str]:
    """The project's common instance metadata (Compute Engine ``projects.get``): the world's OS Login and
    guest attributes switches, as the keys a project sets them with."""
    metadata = {"enable-oslogin": "TRUE"} if world.os_login else {}
    if world.guest_attributes:
        metadata["enable-guest-attributes"] = "TRUE"
    return metadata


def os_login_enabled(world: World, metadata: Mapping[str, str]) -> bool:
    """OS Login on a host whose own metadata is ``metadata``: its ``enable-oslogin`` where set (TRUE in
    any case is on, any other value off, as gcloud reads it), else the project's."""
    value = metadata.get("enable-oslogin")
    if value is None:
        value = project_metadata(world).get("enable-oslogin", "FALSE")
    return str(value).strip().upper() == "TRUE"


def fingerprint(key: str) -> str:
    """The key's SHA-256 fingerprint, hex (of the decoded key blob)."""
    fields = key.split()
    try:
        blob = base64.b64decode(fields[1], validate=True)
    except (IndexError, ValueError):
        raise invalid_argument(
            "Invalid SSH public key: expected 'keytype base64 [comment]'.", "key"
        ) from None
    return hashlib.sha256(blob).hexdigest()


def _expiry_usec(body: Mapping[str, Any]) -> int | None:
    raw = body.get("expirationTimeUsec")
    if raw in (None, ""):
        return None
    try:
        usec = int(str(raw))
    except ValueError:
        raise invalid_argument(
            f"Invalid value at 'ssh_public_key.expiration_time_usec' (TYPE_INT64), {raw!r}",
            "ssh_public_key.expiration_time_usec",
        ) from None
    return usec or None  # 0: never expires


class OsLogin:
    """users.importSshPublicKey, users.sshPublicKeys.patch, users.getLoginProfile, and what hosts
    accept."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def tokeninfo(self, email: str) -> dict[str, Any]:
        """What OAuth's tokeninfo answers for a token of ``email``."""
        return {
            "email": email,
            "email_verified": "true",
            "scope": "https://www.googleapis.com/auth/cloud-platform "
            "https://www.googleapis.com/auth/userinfo.email",
            "expires_in": "3599",
        }

    def import_key(
        self, email: str, body: Mapping[str, Any], project: str | None, caller: str | None = None
    ) -> dict[str, Any]:
        self._own_profile(email, caller)
        raw = body.get("key")
        if not isinstance(raw, str) or not raw.strip():
            raise invalid_argument("ssh_public_key.key is required.", "ssh_public_key.key")
        key = " ".join(raw.split()[:2])
        fp = fingerprint(key)
        expires = _expiry_usec(body)
        with self.ctx.db.write() as conn:
            # An existing key keeps its expiry (see the module docstring).
            conn.execute(
                "INSERT OR IGNORE INTO oslogin_keys (email, fingerprint, key, expires_usec) "
                "VALUES (?, ?, ?, ?)",
                (email, fp, key, expires),
            )
        return {"loginProfile": self.login_profile(email, project, caller)}

    def update_key(
        self, email: str, fp: str, body: Mapping[str, Any], update_mask: str, caller: str | None = None
    ) -> dict[str, Any]:
        self._own_profile(email, caller)
        fields = {f.strip() for f in update_mask.split(",") if f.strip()} or {"key", "expirationTimeUsec"}
        if not fields <= {"key", "expirationTimeUsec", "expiration_time_usec"}:
            raise invalid_argument(f"Invalid update mask: {update_mask!r}", "update_mask")
        with self.ctx.db.write() as conn:
            row = conn.execute(
                "SELECT key, expires_usec FROM oslogin_keys WHERE email = ? AND fingerprint = ?", (email, fp)
            ).fetchone()
            if row is None:
                raise not_found(f"users/{email}/sshPublicKeys/{fp}")
            expires = row["expires_usec"]
            if fields & {"expirationTimeUsec", "expiration_time_usec"}:
                expires = _expiry_usec(body)
            conn.execute(
                "UPDATE oslogin_keys SET expires_usec = ? WHERE email = ? AND fingerprint = ?",
                (expires, email, fp),
            )
        return _key_json(email, fp, row["key"], expires)

    def login_profile(self, email: str, project: str | None, caller: str | None = None) -> dict[str, Any]:
        self._own_profile(email, caller)
        with self.ctx.db.read() as conn:
            rows = conn.execute(
                "SELECT fingerprint, key, expires_usec FROM oslogin_keys WHERE email = ? "
                "ORDER BY fingerprint",
                (email,),
            ).fetchall()
        project = project or self.ctx.world.project
        username = posix_username(email)
        uid = str(1000 + int(hashlib.sha256(email.encode()).hexdigest()[:8], 16) % 2_000_000_000)
        return {
            "name": email,
            "posixAccounts": [
                {
                    "primary": True,
                    "username": username,
                    "uid": uid,
                    "gid": uid,
                    "homeDirectory": f"/home/{username}",
                    "shell": "/bin/bash",
                    "gecos": "",
                    "systemId": "",
                    "accountId": project,
                    "operatingSystemType": "LINUX",
                    "name": f"users/{email}/projects/{project}",
                }
            ],
            "sshPublicKeys": {
                r["fingerprint"]: _key_json(email, r["fingerprint"], r["key"], r["expires_usec"])
                for r in rows
            },
        }

    def accepted_keys(self, username: str) -> list[str]:
        """The unexpired keys imported for the account whose POSIX name is ``username``."""
        now_usec = int(self.ctx.clock() * 1_000_000)
        with self.ctx.db.read() as conn:
            rows = conn.execute("SELECT email, key, expires_usec FROM oslogin_keys ORDER BY email").fetchall()
        return [
            r["key"]
            for r in rows
            if posix_username(r["email"]) == username
            and (r["expires_usec"] is None or r["expires_usec"] > now_usec)
        ]

    def _own_profile(self, email: str, caller: str | None) -> None:
        """Only the caller's own profile (``caller``: the request's account; None, a call from inside
        the simulator, is the world's principal)."""
        principal = caller or self.ctx.world.principal
        if email != principal:
            raise ApiError(
                403,
                "PERMISSION_DENIED",
                f"The caller {principal} does not have permission to access the OS Login profile of "
                f"users/{email}.",
            )


def _key_json(email: str, fp: str, key: str, expires_usec: int | None) -> dict[str, Any]:
    out: dict[str, Any] = {"key": key, "fingerprint": fp, "name": f"users/{email}/sshPublicKeys/{fp}"}
    if expires_usec is not None:
        out["expirationTimeUsec"] = str(expires_usec)
    return out

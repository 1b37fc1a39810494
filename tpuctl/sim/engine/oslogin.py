"""OS Login (oslogin v1) as the simulator serves it: users import SSH keys, hosts with OS Login on accept
exactly those keys for the user's POSIX account.

Shapes follow google/cloud/oslogin/v1/oslogin.proto and google/cloud/oslogin/common/common.proto
(googleapis/googleapis): ImportSshPublicKeyResponse {loginProfile}, LoginProfile {name, posixAccounts,
sshPublicKeys (map fingerprint -> SshPublicKey)}, PosixAccount {primary, username, uid, gid,
homeDirectory, shell, gecos, systemId, accountId, operatingSystemType, name}. Public keys are identified
by their SHA-256 fingerprint (SshPublicKey.fingerprint).
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Mapping
from typing import Any

from tpuctl.sim.api_errors import invalid_argument
from tpuctl.sim.engine.context import Context

_NON_ALNUM = re.compile(r"[^A-Za-z0-9]")


def posix_username(email: str) -> str:
    """The POSIX user name OS Login gives ``email``: every character that is not a letter or a digit
    becomes ``_`` (alice@example.com -> alice_example_com; https://cloud.google.com/compute/docs/oslogin
    "the username is ... the email address with non-alphanumeric characters replaced by underscores")."""
    return _NON_ALNUM.sub("_", email)


def os_login_enabled(world_os_login: bool, metadata: Mapping[str, str]) -> bool:
    """Metadata ``enable-oslogin`` wins when set (TRUE/FALSE, any case), else the world's project-wide
    setting (https://cloud.google.com/compute/docs/oslogin/set-up-oslogin)."""
    value = str(metadata.get("enable-oslogin", "")).strip().upper()
    if value in ("TRUE", "FALSE"):
        return value == "TRUE"
    return world_os_login


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


class OsLogin:
    """users.importSshPublicKey and users.getLoginProfile."""

    def __init__(self, ctx: Context) -> None:
        self.ctx = ctx

    def import_key(self, email: str, key: str, project: str | None) -> dict[str, Any]:
        key = " ".join(key.split()[:2])
        fp = fingerprint(key)
        with self.ctx.db.write() as conn:
            conn.execute(
                "INSERT OR REPLACE INTO oslogin_keys (email, fingerprint, key) VALUES (?, ?, ?)",
                (email, fp, key),
            )
        return {"loginProfile": self.login_profile(email, project)}

    def login_profile(self, email: str, project: str | None) -> dict[str, Any]:
        with self.ctx.db.read() as conn:
            rows = conn.execute(
                "SELECT fingerprint, key FROM oslogin_keys WHERE email = ? ORDER BY fingerprint", (email,)
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
                r["fingerprint"]: {
                    "key": r["key"],
                    "fingerprint": r["fingerprint"],
                    "name": f"users/{email}/sshPublicKeys/{r['fingerprint']}",
                }
                for r in rows
            },
        }

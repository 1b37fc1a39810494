"""A team server end to end: `tpuctl server --workspaces FILE` as a process over a served simulator, and
CLI processes acting as simulated principals (their credentials files from the simulator's issuer, in
GOOGLE_APPLICATION_CREDENTIALS). Team-a: a1 member, a2 viewer, lead admin; team-b: b1 member and a CI
service account. No token: 401; a2 cancelling a1's run: 403; b1 describing it: 404, and b1's `runs list`
has none of team-a's; `tpuctl audit` (lead's) shows each.

The runs are in the ledger as a submission records them (principal, workspace) and already ended, so no
replica places them: what is under test is who may see and change them, not their running.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from server_place import CI, TEAM_WORKSPACES, Place

from tpuctl.store.records import RunStatus

A_RUN = "run-20261127-100000-aaaa"
B_RUN = "run-20261127-100001-bbbb"


@pytest.mark.slow  # a server and six CLI processes: ~17 s on a shared machine
def test_a_team_server_authenticates_hides_refuses_and_audits(place: Place, tmp_path: Path) -> None:
    workspaces = tmp_path / "workspaces.yaml"
    workspaces.write_text(TEAM_WORKSPACES)
    with place.ledger() as ledger:
        ledger.create_run(A_RUN, script="prog.py", status=RunStatus.FAILED, principal="a1@example.com",
                          workspace="team-a")  # fmt: skip
        ledger.create_run(B_RUN, script="prog.py", status=RunStatus.FAILED, principal=CI, workspace="team-b")
    place.start_server("--workspaces", str(workspaces))

    # No token: 401, before anything is looked at.
    bare = httpx.post(f"{place.url}/v1/runs/{A_RUN}/cancel", timeout=10)
    assert bare.status_code == 401 and bare.headers["www-authenticate"].startswith("Bearer")

    def as_(email: str, *args: str) -> subprocess.CompletedProcess[str]:
        path = tmp_path / f"{email}.json"
        if not path.exists():
            path.write_text(json.dumps(place.admin.credentials(email)))
        env = {**place.client_env, "GOOGLE_APPLICATION_CREDENTIALS": str(path)}
        argv = [sys.executable, "-m", "tpuctl", *args]
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60, check=False)

    forbidden = as_("a2@example.com", "runs", "cancel", A_RUN)
    assert forbidden.returncode == 13, forbidden.stderr
    assert "a2@example.com is a viewer of workspace team-a" in forbidden.stderr

    hidden = as_("b1@example.com", "runs", "describe", A_RUN)
    assert hidden.returncode == 11 and f"no run {A_RUN!r}" in hidden.stderr, hidden.stderr
    listed = as_("b1@example.com", "runs", "list", "-o", "json")
    assert listed.returncode == 0, listed.stderr
    assert [r["run_id"] for r in _json(listed.stdout)["runs"]] == [B_RUN]

    audit = as_("lead@example.com", "audit", "-o", "json")
    assert audit.returncode == 0, audit.stderr
    rows = [(e["principal"], e["action"], e["target"], e["status"]) for e in _json(audit.stdout)["entries"]]
    assert ("(anonymous)", "runs.cancel", A_RUN, 401) in rows
    assert ("a2@example.com", "runs.cancel", A_RUN, 403) in rows
    assert ("b1@example.com", "runs.describe", A_RUN, 404) in rows
    workspaces_of_ci = as_(CI, "workspace", "list", "-o", "json")
    assert [w["name"] for w in _json(workspaces_of_ci.stdout)["workspaces"]] == ["team-b"]


def _json(text: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(text[text.index("{") :])
    return document

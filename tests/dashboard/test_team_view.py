"""A team server's pages as one workspace's member sees them, in Debian's Chromium: `tpuctl server`'s app
with a workspace file (ID tokens verified by google-auth against a served simulator's issuer) reached
through `tpuctl dashboard --server`'s loopback proxy, whose client signs in as b1 of team-b with the
simulator's gcloud-style credentials. Team-a's run is never on b1's pages, nor in the JSON b1's token
reads; team-b's is."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest
from loopback import serving
from recorded_runs import LIVE, RUN, Attempt, record_run

from tpuctl.store.records import PreemptionKind

if TYPE_CHECKING:
    from playwright.sync_api import Page

    from tpuctl.services.session import Session
    from tpuctl.sim import SimServer

WORKSPACES = """\
workspaces:
  team-a:
    members:
      a1@example.com: member
  team-b:
    members:
      b1@example.com: viewer
"""


@pytest.fixture
def idp(tmp_path: Path) -> Iterator[SimServer]:
    """A served simulator: the issuer whose certificates the server fetches and whose token endpoint b1's
    credentials name."""
    from tpuctl.sim import SimServer

    with SimServer(tmp_path / "idp") as server:
        yield server


@pytest.fixture
def team_pages(session: Session, idp: SimServer, tmp_path: Path) -> Iterator[str]:
    """Team-a's RUN and team-b's LIVE in the ledger; the team server's app over it, on loopback."""
    from tpuctl.cloud.identity import IdentityIssuer
    from tpuctl.server.app import build_app
    from tpuctl.server.auth import AuthConfig, Authenticator
    from tpuctl.server.bundles import BundleStore
    from tpuctl.teams.workspaces import load_workspaces

    now = session.clock()
    preempted_once = [
        Attempt("p-1", now - 7200, now - 6000, 40, PreemptionKind.NOTICE),
        Attempt("p-2", now - 5900, now - 4000, 80, None),
    ]
    record_run(session.ledger, RUN, preempted_once, workspace="team-a")
    record_run(
        session.ledger, LIVE, [Attempt("q-1", now - 600, now, 5, None)], finished=False, workspace="team-b"
    )
    path = tmp_path / "workspaces.yaml"
    path.write_text(WORKSPACES)
    config = AuthConfig(workspaces=load_workspaces(path), audience="http://tpuctl.test",
                        issuer=IdentityIssuer.at(idp.url))  # fmt: skip
    with serving(
        build_app(session, BundleStore(tmp_path / "bundles"), None, auth=Authenticator(config))
    ) as url:
        yield url


def test_a_team_b_viewers_browser_never_shows_team_as_runs(
    team_pages: str, idp: SimServer, tmp_path: Path, page: Page, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tpuctl.client.api import ServerClient
    from tpuctl.dashboard.proxy import proxy_app
    from tpuctl.sim.issuer import issuer_of

    credentials = tmp_path / "b1.json"
    credentials.write_text(json.dumps(issuer_of(idp.engine).credentials_file("b1@example.com", idp.url)))
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(credentials))
    assert httpx.get(f"{team_pages}/", timeout=10).status_code == 401  # the pages need a token too

    with ServerClient(team_pages) as client, serving(proxy_app(client)) as proxy:
        for path in ("/", "/slices?gone=30d", "/money?group_by=run", "/money?group_by=workspace"):
            page.goto(f"{proxy}{path}")
            html = page.content()
            assert RUN not in html and "team-a" not in html, path
        page.goto(f"{proxy}/")
        assert page.locator(f'[data-run="{LIVE}"]').count() == 1  # team-b's own run is there
        assert page.locator('[data-workspace="team-b"]').count() == 1
        hidden, own = page.goto(f"{proxy}/runs/{RUN}"), None
        assert hidden is not None and hidden.status == 404  # as a run that does not exist
        own = page.goto(f"{proxy}/runs/{LIVE}")
        assert own is not None and own.status == 200

        # The JSON the same token reads: none of team-a's either.
        token = client._identity.token().token
    listed = httpx.get(f"{team_pages}/v1/runs", headers={"Authorization": f"Bearer {token}"}, timeout=10)
    assert [r["run_id"] for r in listed.json()["runs"]] == [LIVE]
    report = httpx.get(f"{team_pages}/v1/cost/report", params={"group_by": "run"},
                       headers={"Authorization": f"Bearer {token}"}, timeout=30)  # fmt: skip
    assert report.status_code == 200, report.text
    assert RUN not in report.text and "team-a" not in report.text

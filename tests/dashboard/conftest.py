"""The dashboard's fixtures: a session on the in-process simulator (frozen clock) with recorded runs, the
pages served on loopback by uvicorn in a thread, and Debian's Chromium driven by Playwright (one browser
per test module; a fresh context, with every non-loopback request failing the test, per test).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from loopback import serving
from recorded_runs import record_both

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page, Route

    from tpuctl.services.session import Session
    from tpuctl.testing.backend import InProcessCli

CHROMIUM = Path("/usr/bin/chromium")
#: Debian's Chromium, headless, as root (no sandbox), talking to nothing but what the page asks for.
CHROMIUM_ARGS = (
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
)  # fmt: skip
LOOPBACK_PREFIXES = ("http://127.0.0.1:", "http://[::1]:", "http://localhost:")


@pytest.fixture
def session(sim_cli: InProcessCli, state_dir: Path) -> Iterator[Session]:
    """A session on ``sim_cli``'s simulator and ledger (what `tpuctl dashboard` opens)."""
    from tpuctl.services.session import open_session
    from tpuctl.settings import load_settings

    with open_session(load_settings({"state_dir": state_dir}), backend=sim_cli.backend) as sess:
        yield sess


@pytest.fixture
def recorded(session: Session) -> Session:
    """The session with RUN and LIVE recorded (``recorded_runs.record_both``)."""
    record_both(session.ledger, session.clock())
    return session


@pytest.fixture
def served(session: Session) -> Iterator[str]:
    """The dashboard's pages over ``session`` on a loopback port: their base URL."""
    from tpuctl.dashboard.serve import dashboard_app

    with serving(dashboard_app(session, live_every_s=0.2)) as url:  # a live page polls every 0.2 s
        yield url


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """Debian's Chromium (never one Playwright downloads). Missing, the tests FAIL saying how to install
    it. One per test module, not per process: Playwright's sync API keeps an event loop running on this
    thread while it is open, and a later test of another module that runs its own (``asyncio.run``: the
    simulated VMs' SSH tests) would find it and fail."""
    if not CHROMIUM.exists():
        pytest.fail(
            f"the dashboard's browser tests need Debian's Chromium at {CHROMIUM}; as root run: "
            "apt-get update && apt-get install -y chromium (.ci/run does)",
            pytrace=False,
        )
    from playwright.sync_api import sync_playwright

    # A fresh profile: launch() gives the browser a new temporary user-data dir of its own (and removes
    # it at close), so nothing of this machine's Chromium profile is read.
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=list(CHROMIUM_ARGS))
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    """A fresh page; any request it makes to an address not on this machine is refused, and fails the test."""
    context = browser.new_context()
    outside: list[str] = []

    def guard(route: Route, *_: Any) -> None:
        url = route.request.url
        if url.startswith(LOOPBACK_PREFIXES) or url.startswith(("data:", "about:")):
            route.continue_()
        else:
            outside.append(url)
            route.abort()

    context.route("**/*", guard)
    page = context.new_page()
    try:
        yield page
    finally:
        context.close()
    assert not outside, f"the page asked for addresses off this machine: {outside}"

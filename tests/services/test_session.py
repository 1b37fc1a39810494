"""A session's catalog carries the refreshed prices: after `catalog prices --refresh`, a placement's
estimate, price cap and the price recorded in the ledger are the refreshed ones, not the bundled table."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import respx
from allocator_helpers import InProcessEnv

from tpuctl.store.ledger import Ledger
from tpuctl.testing.backend import InProcessCli
from tpuctl.testing.cli import CliResult

Cli = Callable[..., CliResult]
ZONE = "us-central1-a"
BILLING = "https://billing.test"
REFRESHED = 4.44  # USD per chip-hour, spot v5e in us-central1 (the bundled table says 0.245)


def _refresh(cli: Cli, env: InProcessEnv) -> None:
    sku = {
        "skuId": "X", "description": "Preemptible TpuV5e chip", "serviceRegions": ["us-central1"],
        "category": {"usageType": "OnDemand", "resourceGroup": "TPU"},
        "pricingInfo": [{"pricingExpression": {"usageUnit": "h", "tieredRates": [
            {"unitPrice": {"currencyCode": "USD", "units": "4", "nanos": 440000000}}]}}],
    }  # fmt: skip
    respx.get(f"{BILLING}/v1/services/6F81-5844-456A/skus").respond(200, json={"skus": [sku]})
    respx.get(f"{BILLING}/v1/services/E000-3F24-B8AA/skus").respond(200, json={"skus": []})
    result = cli(
        "catalog", "prices", "--refresh", "--billing-url", BILLING, "-g", "v5e", "-o", "json", env=env
    )
    assert result.code == 0, result.stderr


@respx.mock
def test_a_placement_uses_the_refreshed_price(
    in_process_sim: Callable[..., InProcessEnv], cli: Cli, state_dir: Path
) -> None:
    env = in_process_sim()
    _refresh(cli, env)
    create = ("pod", "create", "v5e-16", "--spot", "--zone", ZONE, "--name", "priced", "-o", "json")

    plan = cli(*create, "--dry-run", env=env).json["plan"]
    assert plan["chosen"]["price_per_chip_hour"] == REFRESHED
    assert plan["estimated_price_per_hour"] == REFRESHED * 16

    capped = cli(*create, "--max-price", "10", "--dry-run", env=env)  # 71.04 USD/h refreshed, 3.92 bundled
    assert capped.json["plan"]["feasible"] is False

    made = cli(*create, env=env)
    assert made.code == 0, made.stderr
    with Ledger(state_dir) as ledger:
        pod = ledger.get_pod("priced", zone=ZONE)
    assert pod is not None and pod.price_per_chip_hour == REFRESHED


def test_a_ledger_that_cannot_be_opened_closes_what_the_session_had_opened(
    sim_cli: InProcessCli, state_dir: Path
) -> None:
    import pytest

    from tpuctl.services.session import open_session
    from tpuctl.settings import load_settings
    from tpuctl.store.records import LedgerError

    closed: list[str] = []

    class Recording:
        """The in-process backend, its cloud's closing recorded."""

        def __getattr__(self, name: str) -> Any:
            return getattr(sim_cli.backend, name)

        def open_cloud(self, state: Path, closers: list[Callable[[], None]]) -> Any:
            cloud = sim_cli.backend.open_cloud(state, closers)
            closers.append(lambda: closed.append("cloud"))
            return cloud

    down = "postgresql://alice:pw@127.0.0.1:9/ledger?connect_timeout=2"
    settings = load_settings({"backend": "sim", "state_dir": state_dir, "database": down})
    with pytest.raises(LedgerError, match="cannot be reached"):
        open_session(settings, backend=Recording())  # type: ignore[arg-type]
    assert closed == ["cloud"]


def test_a_copy_for_another_actor_shares_the_clients_opened_on_first_use(tmp_path: Path) -> None:
    """A server's per-request session (``dataclasses.replace``) opens nothing again, whichever copy asks
    first, and the clients close with the server's."""
    import dataclasses

    from tpuctl.services.session import Session
    from tpuctl.teams.actor import Actor

    opened: list[object] = []

    class Backend:
        def open_os_login(self, cloud: object, closers: list[Callable[[], None]]) -> object:
            opened.append(object())
            closers.append(lambda: opened.append("closed"))
            return opened[-1]

    nothing: Any = None
    server = Session(settings=nothing, backend=cast(Any, Backend()), catalog=nothing, cloud=nothing,
                     ledger=nothing, state_dir=tmp_path)  # fmt: skip
    first = dataclasses.replace(server, actor=Actor("a1@example.com"))
    second = dataclasses.replace(server, actor=Actor("b1@example.com"))
    assert first.os_login() is second.os_login() is server.os_login() is opened[0]
    server.close()
    assert opened[1:] == ["closed"]

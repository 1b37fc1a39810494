"""What every command does the same way through a `tpuctl server` (``--server URL``): open the client,
and say which backend and project the server worked on, as a local command says its own."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from tpuctl.cli.render import Output
    from tpuctl.client.api import ServerClient
    from tpuctl.server.wire_views import ServedBy


def client(server: str) -> ServerClient:
    """The client of the server at ``server`` (tests replace this to reach an app in process)."""
    from tpuctl.client.api import ServerClient

    return ServerClient(server)


def banner(out: Output, served: ServedBy, server: str) -> None:
    """The backend marker of the server's session (its documents' envelope names it too)."""
    out.backend_banner(served.backend, served.project, f", through tpuctl server {server}")

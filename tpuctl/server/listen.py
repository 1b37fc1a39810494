"""Where `tpuctl server` listens: ``HOST:PORT``, on a loopback address only unless the server
authenticates its callers (a workspace file): without it, anyone who could reach it could start slices on
the server's account."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Final

from tpuctl.errors import UsageError

DEFAULT_LISTEN: Final = "127.0.0.1:8471"
#: Names that mean this machine only (resolved by us, not by the resolver: a hosts file could lie).
_LOOPBACK_NAMES: Final = {"localhost": "127.0.0.1", "ip6-localhost": "::1"}


@dataclass(frozen=True)
class Listen:
    host: str  # an IP address
    port: int

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def unspecified(self) -> bool:
        """Every address of the machine (``0.0.0.0``, ``::``): not one a client can name."""
        return ipaddress.ip_address(self.host).is_unspecified

    def __str__(self) -> str:
        return self.url.removeprefix("http://")


def parse_listen(text: str, *, authenticated: bool = False) -> Listen:
    """``127.0.0.1:8471``, ``[::1]:8471`` or ``localhost:8471`` (with ``authenticated``, any IP address,
    ``0.0.0.0`` too); exit 2 for anything else, and for an address that is not loopback unless
    ``authenticated``."""
    host, sep, port_text = text.strip().rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise UsageError(
            f"--listen {text!r} is not HOST:PORT",
            field="--listen",
            value=text,
            fix=f"e.g. --listen {DEFAULT_LISTEN}",
        )
    address = _LOOPBACK_NAMES.get(host.lower(), host)
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        raise UsageError(
            f"--listen {text!r}: {host!r} is not an IP address",
            field="--listen",
            value=text,
            fix=f"give a loopback address, e.g. --listen {DEFAULT_LISTEN}",
        ) from None
    if not ip.is_loopback and not authenticated:
        raise UsageError(
            f"--listen {text!r} is not a loopback address: without a workspace file the API "
            "authenticates nobody, so it listens on this machine only",
            field="--listen",
            value=text,
            fix=f"give --workspaces FILE, or listen on loopback (--listen {DEFAULT_LISTEN}) "
            "and reach it through an SSH tunnel",
        )
    return Listen(str(ip), int(port_text))

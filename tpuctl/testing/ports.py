"""Loopback ports for servers a test starts in another process.

A port the OS hands out for ``bind(("127.0.0.1", 0))`` lies in the ephemeral range, the same range it
draws the source port of every outgoing connection from; between closing the probe socket and the child
binding it, any connection made on the machine (a parallel test's SSH or HTTP client) may take it, and
the child fails to bind (JAX's coordinator then dies with "Failed to add port to server"). A port drawn
below that range is taken only by another process that chose it the same way, a far rarer event.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

#: Linux's default ephemeral range starts at 32768; the range's lower bound is read where it is known.
_EPHEMERAL_LOW_DEFAULT = 32768
_LOWEST = 10000
_TRIES = 200


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _EPHEMERAL_LOW_DEFAULT


def unused_port(address: str = "127.0.0.1") -> int:
    """A TCP port on ``address`` that nothing listens on now, drawn below the ephemeral range so that no
    outgoing connection takes it before the caller's child binds it."""
    high = _ephemeral_low()
    rng = random.SystemRandom()
    for _ in range(_TRIES):
        port = rng.randrange(_LOWEST, high) if high > _LOWEST else 0
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((address, port))
            except OSError:
                continue
            return int(probe.getsockname()[1])
    raise RuntimeError(f"no unused TCP port on {address} below {high} after {_TRIES} tries")

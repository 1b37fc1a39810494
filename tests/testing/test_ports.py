"""``unused_port``: a port below the ephemeral range that the caller can bind now."""

from __future__ import annotations

import random
import socket
from pathlib import Path

import pytest

from tpuctl.testing.ports import unused_port


def test_the_port_is_below_the_ephemeral_range_and_bindable() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    ports = {unused_port() for _ in range(20)}
    assert all(10000 <= p < low for p in ports), ports
    assert len(ports) > 1  # drawn, not one fixed port every test would share
    port = ports.pop()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_a_port_in_use_is_skipped(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", unused_port()))
        held.listen()
        taken = int(held.getsockname()[1])
        draws = iter([taken, taken, taken + 1 if taken + 1 < 32768 else taken - 1])
        monkeypatch.setattr(random.SystemRandom, "randrange", lambda self, a, b: next(draws))
        got = unused_port()
    assert got != taken and abs(got - taken) == 1

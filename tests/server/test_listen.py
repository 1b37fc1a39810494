"""Where `tpuctl server` may listen: loopback only, until the API has authentication."""

from __future__ import annotations

import pytest

from tpuctl.errors import UsageError
from tpuctl.server.listen import Listen, parse_listen


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:8471", Listen("127.0.0.1", 8471)),
        ("localhost:9000", Listen("127.0.0.1", 9000)),
        ("[::1]:8471", Listen("::1", 8471)),
        ("127.0.0.2:1", Listen("127.0.0.2", 1)),
    ],
)
def test_loopback_addresses_are_taken(text: str, expected: Listen) -> None:
    assert parse_listen(text) == expected


def test_the_url_brackets_an_ipv6_address() -> None:
    assert parse_listen("[::1]:8471").url == "http://[::1]:8471"


@pytest.mark.parametrize("text", ["0.0.0.0:8471", "10.1.2.3:80", "[::]:8471", "192.168.1.1:8471"])
def test_any_other_address_is_refused_saying_why(text: str) -> None:
    with pytest.raises(UsageError) as caught:
        parse_listen(text)
    assert "not a loopback address" in caught.value.message and "workspace file" in caught.value.message
    assert caught.value.field == "--listen"


@pytest.mark.parametrize("text", ["0.0.0.0:8471", "10.1.2.3:80", "[::]:8471"])
def test_a_server_that_authenticates_may_listen_anywhere(text: str) -> None:
    assert parse_listen(text, authenticated=True).port in (8471, 80)


@pytest.mark.parametrize(
    "text", ["8471", "127.0.0.1", "127.0.0.1:0", "127.0.0.1:70000", "example.com:80", ":80"]
)
def test_malformed_addresses_are_refused(text: str) -> None:
    with pytest.raises(UsageError):
        parse_listen(text)

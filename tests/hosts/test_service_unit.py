"""The server's service unit: rendered once, read back the same by the simulator's stand-in."""

from __future__ import annotations

import pytest

from tpuctl.errors import UsageError
from tpuctl.hosts.service_unit import RestartPolicy, ServiceUnit, expand_specifiers, parse


def _unit() -> ServiceUnit:
    return ServiceUnit(
        name="tpuctl-server",
        description="tpuctl team server",
        exec_start=("/opt/tpuctl/bin/tpuctl", "server", "--listen", "127.0.0.1:8471"),
        restart=RestartPolicy.ON_FAILURE,
        restart_sec=5,
        environment={"XDG_STATE_HOME": "/var/lib/tpuctl", "QUOTED": 'a "b" c'},
        working_directory="/var/lib/tpuctl",
    )


def test_rendered_unit_is_what_systemd_reads() -> None:
    text = _unit().render()
    assert "ExecStart=/opt/tpuctl/bin/tpuctl server --listen 127.0.0.1:8471\n" in text
    assert "Restart=on-failure\nRestartSec=5s\n" in text
    assert 'Environment="XDG_STATE_HOME=/var/lib/tpuctl"' in text
    assert text.index("[Unit]") < text.index("[Service]") < text.index("[Install]")
    assert "WantedBy=default.target" in text  # a user unit: the user manager's boot target


def test_specifiers_expand_to_the_home_as_the_user_manager_does() -> None:
    unit = ServiceUnit(
        "u", "u", ("%h/bin/x", "100%%"), environment={"DB": "sqlite:///%h/l.db"}, working_directory="%h/w"
    )
    expanded = expand_specifiers(parse("u", unit.render()), "/home/me")
    assert expanded.exec_start == ("/home/me/bin/x", "100%")
    assert expanded.environment == {"DB": "sqlite:////home/me/l.db"}
    assert expanded.working_directory == "/home/me/w"
    with pytest.raises(UsageError, match="%u"):
        expand_specifiers(ServiceUnit("u", "u", ("%u",)), "/home/me")


def test_parse_reads_back_every_key_rendered() -> None:
    unit = _unit()
    assert parse("tpuctl-server", unit.render()) == unit


def test_parse_refuses_a_key_the_stand_in_would_ignore() -> None:
    text = _unit().render().replace("[Service]\n", "[Service]\nTimeoutStopSec=3\n")
    with pytest.raises(UsageError, match="TimeoutStopSec"):
        parse("tpuctl-server", text)


def test_parse_needs_one_exec_start() -> None:
    with pytest.raises(UsageError, match="ExecStart"):
        parse("x", "[Service]\nRestart=always\n")


@pytest.mark.parametrize(
    ("policy", "code", "restarts"),
    [
        (RestartPolicy.ON_FAILURE, 1, True),
        (RestartPolicy.ON_FAILURE, -9, True),  # SIGKILL is a failure
        (RestartPolicy.ON_FAILURE, 0, False),
        (RestartPolicy.ON_FAILURE, -15, False),  # SIGTERM is a clean stop to systemd
        (RestartPolicy.ALWAYS, 0, True),
        (RestartPolicy.NO, 1, False),
    ],
)
def test_restart_policy(policy: RestartPolicy, code: int, restarts: bool) -> None:
    assert policy.restarts_after(code) is restarts

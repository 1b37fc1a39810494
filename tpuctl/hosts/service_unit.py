"""The service unit the server runs under on its VM: one text, rendered here, that systemd reads on
Google and the simulator's stand-in supervisor reads on a simulated VM (``tpuctl.sim.vms.units``).

A USER unit (``~/.config/systemd/user/<name>.service``, started by the login user's own systemd manager,
kept running after logout by ``loginctl enable-linger``): its paths are home-relative (``%h``), so the
same text runs on Google, where the home is /home/USER, and on a simulated VM, whose processes share this
machine's filesystem root and whose home is its own disk. ``WantedBy=default.target``: the user manager's
boot target (it has no multi-user.target)
(https://www.freedesktop.org/software/systemd/man/latest/systemd.special.html,
https://www.freedesktop.org/software/systemd/man/latest/systemd.unit.html#Specifiers).

Only the keys both honour are written and read: ``Description``, ``ExecStart``, ``Restart``,
``RestartSec``, ``Environment``, ``WorkingDirectory``, ``User`` and ``WantedBy``
(https://www.freedesktop.org/software/systemd/man/latest/systemd.service.html,
https://www.freedesktop.org/software/systemd/man/latest/systemd.exec.html). ``parse`` refuses a unit
with any other key in [Service], so the stand-in never silently ignores what systemd would do.
"""

from __future__ import annotations

import dataclasses
import enum
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from tpuctl.errors import UsageError

#: The [Service] keys the stand-in honours; a unit with another is refused rather than half-honoured.
_SERVICE_KEYS: Final = frozenset(
    {"ExecStart", "Restart", "RestartSec", "Environment", "WorkingDirectory", "User"}
)


#: The user manager's target that starts enabled units at its start (at boot, for a lingering user).
WANTED_BY: Final = "default.target"
#: Where a user's units live, relative to the home (systemd.unit, "User Unit Search Path").
USER_UNIT_DIR: Final = ".config/systemd/user"


class RestartPolicy(enum.StrEnum):
    """systemd's ``Restart=`` values tpuctl uses: ``no`` never restarts; ``on-failure`` restarts after a
    non-zero exit, a signal or a timeout; ``always`` after any exit."""

    NO = "no"
    ON_FAILURE = "on-failure"
    ALWAYS = "always"

    def restarts_after(self, exit_code: int) -> bool:
        """Whether a process that ended with ``exit_code`` (negative: killed by that signal, as
        ``subprocess`` reports it) is started again. systemd counts SIGHUP, SIGINT, SIGTERM and SIGPIPE as
        clean exits, so ``on-failure`` does not restart after them (systemd.service, "Restart=")."""
        if self is RestartPolicy.ALWAYS:
            return True
        if self is RestartPolicy.NO:
            return False
        clean_signals = (-1, -2, -13, -15)
        return exit_code != 0 and exit_code not in clean_signals


@dataclass(frozen=True)
class ServiceUnit:
    """One ``<name>.service``: the command, its restart policy and environment."""

    name: str  # without ".service"
    description: str
    exec_start: tuple[str, ...]  # argv; the first is an absolute path, as systemd wants it
    restart: RestartPolicy = RestartPolicy.ON_FAILURE
    restart_sec: float = 5.0
    environment: Mapping[str, str] = field(default_factory=dict)
    working_directory: str | None = None
    user: str | None = None

    @property
    def file_name(self) -> str:
        return f"{self.name}.service"

    def render(self) -> str:
        """The unit file's text."""
        service = [f"ExecStart={shlex.join(self.exec_start)}", f"Restart={self.restart.value}"]
        service.append(f"RestartSec={_seconds(self.restart_sec)}")
        for key, value in sorted(self.environment.items()):
            # One assignment per line, quoted whole: systemd's Environment= takes "KEY=value" in quotes.
            service.append(f'Environment="{_escaped(key)}={_escaped(value)}"')
        if self.working_directory:
            service.append(f"WorkingDirectory={self.working_directory}")
        if self.user:
            service.append(f"User={self.user}")
        return "\n".join(
            [
                "[Unit]",
                f"Description={self.description}",
                "",
                "[Service]",
                *service,
                "",
                "[Install]",
                f"WantedBy={WANTED_BY}",
                "",
            ]
        )


def parse(name: str, text: str) -> ServiceUnit:
    """A unit file's text read back (what the stand-in runs). ``UsageError`` for a [Service] key it does
    not honour, no ExecStart, or a value it cannot read."""
    sections = _sections(text)
    service = sections.get("Service", {})
    unknown = sorted(set(service) - _SERVICE_KEYS)
    if unknown:
        raise UsageError(f"unit {name}: [Service] key {unknown[0]} is not honoured here", field=unknown[0])
    exec_start = service.get("ExecStart", [])
    if len(exec_start) != 1 or not exec_start[0].strip():
        raise UsageError(f"unit {name}: exactly one ExecStart= is needed", field="ExecStart")
    argv = tuple(shlex.split(exec_start[0]))
    try:
        restart = RestartPolicy(_last(service, "Restart", RestartPolicy.NO.value))
        restart_sec = float(_last(service, "RestartSec", "0.1").removesuffix("s"))
    except ValueError as exc:
        raise UsageError(f"unit {name}: {exc}", field="Restart") from None
    environment: dict[str, str] = {}
    for line in service.get("Environment", []):
        for assignment in shlex.split(line):
            key, sep, value = assignment.partition("=")
            if not sep:
                raise UsageError(f"unit {name}: Environment={line} is not KEY=value", field="Environment")
            environment[key] = value
    return ServiceUnit(
        name=name,
        description=_last(sections.get("Unit", {}), "Description", name),
        exec_start=argv,
        restart=restart,
        restart_sec=restart_sec,
        environment=environment,
        working_directory=_last(service, "WorkingDirectory", "") or None,
        user=_last(service, "User", "") or None,
    )


def expand_specifiers(unit: ServiceUnit, home: str) -> ServiceUnit:
    """``unit`` with systemd's ``%h`` (the user's home) and ``%%`` expanded in its command, environment
    and working directory, as the user manager expands them before it starts the command. Any other
    specifier is refused: the stand-in would run something systemd would not."""

    def expand(text: str) -> str:
        out, i = [], 0
        while i < len(text):
            if text[i] != "%":
                out.append(text[i])
                i += 1
                continue
            spec = text[i + 1 : i + 2]
            if spec not in ("h", "%"):
                raise UsageError(f"unit {unit.name}: specifier %{spec} is not honoured here")
            out.append(home if spec == "h" else "%")
            i += 2
        return "".join(out)

    return dataclasses.replace(
        unit,
        exec_start=tuple(expand(a) for a in unit.exec_start),
        environment={k: expand(v) for k, v in unit.environment.items()},
        working_directory=expand(unit.working_directory) if unit.working_directory else None,
    )


def _sections(text: str) -> dict[str, dict[str, list[str]]]:
    out: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            current = out.setdefault(line[1:-1], {})
            continue
        key, sep, value = line.partition("=")
        if not sep or current is None:
            raise UsageError(f"unit line {raw!r} is not KEY=value inside a [section]")
        current.setdefault(key.strip(), []).append(value.strip())
    return out


def _last(section: Mapping[str, Sequence[str]], key: str, default: str) -> str:
    values = section.get(key)
    return values[-1] if values else default  # a later assignment wins, as in systemd


def _seconds(value: float) -> str:
    return f"{value:g}s"


def _escaped(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')

"""How `tpuctl --help` reads: commands in the order people use them (not registration order), each with
its whole first sentence, and every option's value named for what it is (`--zone ZONE`, `--output
FORMAT`), not for its Python type (`<str>`, `<list[str]>`).

Applied once to the command tree typer builds, before it runs (``tpuctl.cli.main.run``); it walks the
tree's objects and imports nothing.
"""

from __future__ import annotations

from typing import Any

#: Commands first, in this order, at each level; the others after them in registration order.
ORDER: dict[str, tuple[str, ...]] = {
    "tpuctl": (
        "run",
        "runs",
        "queue",
        "job",
        "pod",
        "cost",
        "catalog",
        "quota",
        "bench",
        "doctor",
        "dashboard",
        "server",
        "workspace",
        "audit",
        "db",
        "sim",
    ),
    "pod": ("create", "list", "describe", "delete", "gc"),
    "runs": ("list", "describe", "logs", "cancel", "resume"),
    "cost": ("estimate", "report"),
    "catalog": ("types", "zones", "prices"),
}

#: Metavars that say more than the flag's own name.
METAVARS: dict[str, str] = {
    "--output": "FORMAT",
    "--state-dir": "DIR",
    "--workdir": "DIR",
    "--checkpoint-dir": "DIR",
    "--config": "FILE",
    "--profile": "NAME",
    "--name": "NAME",
    "--example": "NAME",
    "--env": "KEY=VALUE",
    "--label": "KEY=VALUE",
    "--backend": "sim|gcp",
    "--executor": "sim|ssh",
    "--capacity-type": "CAPACITY",
    "--reserved": "RESERVATION",
}


def polish(command: Any, name: str = "tpuctl") -> None:
    """Order ``command``'s subcommands, give each its whole first sentence, and name every value."""
    for param in getattr(command, "params", ()):
        _name_value(param)
    commands: dict[str, Any] | None = getattr(command, "commands", None)
    if not commands:
        return
    first = [n for n in ORDER.get(name, ()) if n in commands]
    ordered = {n: commands[n] for n in [*first, *(n for n in commands if n not in first)]}
    commands.clear()
    commands.update(ordered)
    for sub_name, sub in ordered.items():
        if getattr(sub, "short_help", None) is None and getattr(sub, "help", None):
            sub.short_help = _first_sentence(sub.help)
        polish(sub, sub_name)


def _name_value(param: Any) -> None:
    if getattr(param, "param_type_name", "") == "argument":
        # typer lists an argument as `TYPE <str>`: its name is what the user types; the Python type
        # says nothing (instance attribute: typer asks the parameter itself).
        param.display_type_rich = _no_type
    if getattr(param, "metavar", None) is not None or getattr(param, "is_flag", False):
        return
    opts = [o for o in getattr(param, "opts", ()) if o.startswith("--")]
    if getattr(param, "param_type_name", "") == "option" and opts:
        flag = max(opts, key=len)
        param.metavar = METAVARS.get(flag, flag.removeprefix("--").upper().replace("-", "_"))
    elif getattr(param, "param_type_name", "") == "argument" and param.name:
        param.metavar = param.name.upper()


def _no_type(ctx: Any) -> None:
    return None


def _first_sentence(text: str) -> str:
    """The help's first sentence, whole (click cuts it at 45 characters with "...")."""
    paragraph = " ".join(text.strip().split("\n\n", 1)[0].split())
    end = paragraph.find(". ")
    return paragraph if end < 0 else paragraph[: end + 1]

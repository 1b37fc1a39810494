"""A run's secret values: the environment variables ``RunRequest.secret_names`` names (``--secret``, a
job file's ``secrets:``), read from wherever the user gave them, checked, and kept.

Where a value goes: the program's environment on every host, at every attempt (the SSH executor hands
the environment over its session's stdin, never in a command line); and the ledger, only encrypted (one
secret of the run's, ``SECRET_NAME``, with the key of ``store.secrets``, as the run's SSH key is), so that
a supervisor on another machine (``runs resume``, a takeover) gives it to the program again. Nowhere
else: the saved request keeps only the names, a plan shows ``<secret>``, and an error names the variable,
never its value (a malformed value is still a secret).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING

from tpuctl.errors import UsageError
from tpuctl.hosts.base import ENV_NAME_RE

if TYPE_CHECKING:
    from tpuctl.store.ledger import Ledger
    from tpuctl.store.secrets import SecretKey

#: The name of the run's secret values among its secrets in the ledger (one JSON object, encrypted).
SECRET_NAME = "secret_env"
_FIX_NAME = "name a variable with letters, digits and _ (not starting with a digit), e.g. --secret HF_TOKEN"


def parse_secret_flags(words: Sequence[str]) -> dict[str, str | None]:
    """``--secret`` words by name: ``NAME=VALUE`` gives the value, ``NAME`` alone takes it from the
    submitting environment (None here: ``resolve_secrets`` reads it). The last word for a name wins."""
    given: dict[str, str | None] = {}
    for word in words:
        name, sep, value = word.partition("=")
        _check_name(name, "secret")
        given[name] = value if sep else None
    return given


def resolve_secrets(given: Mapping[str, str | None], environ: Mapping[str, str]) -> dict[str, str]:
    """Each secret's value: the one given, else ``environ``'s (the submitting environment, which the
    caller passes: nothing here reads the process's own behind its back). Exit 2 naming a variable that
    has no value in either."""
    values: dict[str, str] = {}
    for name, value in given.items():
        if value is None:
            value = environ.get(name)
            if value is None:
                raise UsageError(
                    f"secret {name} has no value: it is not set in this environment",
                    field="secret",
                    value=name,
                    fix=f"export {name} before running tpuctl, or give it as --secret {name}=VALUE",
                )
        values[name] = value
    return values


def check_secrets(
    names: Sequence[str], values: Mapping[str, str], *, env_names: Collection[str]
) -> dict[str, str]:
    """``values`` as the run keeps them, checked against the request's ``names``: exactly one value per
    name, a name fit for an environment variable and none of tpuctl's own, not also an ``--env`` name
    (``env_names``), no NUL in a value. Exit 2 otherwise, naming the variable and never its value."""
    for name in names:
        _check_name(name, "secret")
        if name in env_names:
            raise UsageError(
                f"{name} is both an --env variable and a secret",
                field="secret",
                value=name,
                fix=f"give {name} once: as --secret to keep its value secret, or as --env",
            )
        if name not in values:
            raise UsageError(
                f"secret {name} has no value",
                field="secret",
                value=name,
                fix=f"export {name} before running tpuctl, or give it as --secret {name}=VALUE",
            )
        if "\x00" in values[name]:
            raise UsageError(
                f"secret {name}: its value holds a NUL byte", field="secret", value=name, fix="remove it"
            )
    unnamed = sorted(set(values) - set(names))
    if unnamed:
        raise UsageError(
            f"values were given for {', '.join(unnamed)}, which the run does not name as secrets",
            field="secret",
            value=", ".join(unnamed),
            fix="name every secret in the request's secret_names (a job file's secrets:, --secret)",
        )
    return {name: values[name] for name in names}


def _check_name(name: str, flag: str) -> None:
    if not ENV_NAME_RE.match(name):
        raise UsageError(
            f"bad --{flag} name {name!r}: expected a letter or _ followed by letters, digits or _",
            field=flag,
            value=name,
            fix=_FIX_NAME,
        )
    if name.startswith("TPUCTL_") or name == "PYTHONPATH":
        raise UsageError(
            f"bad --{flag} {name}: it is set by tpuctl on every host (the worker environment)",
            field=flag,
            value=name,
            fix="choose another name; tpuctl sets TPUCTL_* and PYTHONPATH itself",
        )


def store_secrets(ledger: Ledger, run_id: str, values: Mapping[str, str], key: SecretKey) -> None:
    """The run's secret values in the ledger, encrypted with ``key`` (nothing stored when it has none)."""
    if values:
        ledger.put_secret(run_id, SECRET_NAME, json.dumps(dict(values)).encode("utf-8"), key)


def load_secrets(ledger: Ledger, run_id: str, key: SecretKey) -> dict[str, str]:
    """The run's secret values, decrypted in memory (``SecretKeyError`` naming the setting to change when
    they were stored with another key); none for a run that has none."""
    stored = ledger.get_secret(run_id, SECRET_NAME, key)
    if stored is None:
        return {}
    return {str(name): str(value) for name, value in json.loads(stored.decode("utf-8")).items()}

"""Errors in a job file, each naming the file, the line and the key (``JobFileError``, exit 2), from
the model's validation errors (with "did you mean" for a typo'd key), the refused SkyPilot keys and the
flags' parsers (``tpuctl.params``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ValidationError

from tpuctl.errors import ConfigError, UsageError
from tpuctl.jobs import model
from tpuctl.jobs.source import JobSource, KeyPath
from tpuctl.params import ParamError, did_you_mean


class JobFileError(ConfigError):
    """A bad job file: ``path``, ``line`` and ``key`` (dotted: ``resources.use_spot``) say where."""

    kind = "job_file"

    def __init__(
        self, message: str, *, path: str, line: int | None, key: str, value: object, fix: str
    ) -> None:
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {key}: {message}", path=path, field=key, value=value, fix=fix)
        self.line = line
        self.key = key

    def details(self) -> dict[str, Any]:
        return {**super().details(), "line": self.line, "key": self.key}


def dotted(where: KeyPath) -> str:
    """``("resources", "any_of", 1, "accelerators")`` -> ``resources.any_of[1].accelerators``."""
    text = ""
    for part in where:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


def at(source: JobSource, where: KeyPath, message: str, *, value: object, fix: str) -> JobFileError:
    return JobFileError(
        message, path=source.path, line=source.line_of(where), key=dotted(where), value=value, fix=fix
    )


def from_usage(source: JobSource, where: KeyPath, exc: UsageError) -> JobFileError:
    """A flag parser's error (``tpuctl.params``) about the value at ``where``, naming the file's key
    where it named the flag (``budget must be ...``, not ``--budget must be ...``)."""
    if isinstance(exc, ParamError):
        exc = exc.for_source(dotted(tuple(p for p in where if isinstance(p, str))))
    return at(source, where, exc.message, value=exc.value, fix=exc.fix or "")


def from_validation(source: JobSource, exc: ValidationError) -> JobFileError:
    """The first of the model's errors, located: an unknown key with the nearest known one."""
    error = exc.errors()[0]
    where = _known_prefix(source, tuple(error["loc"]))
    value = error.get("input")
    if error["type"] == "extra_forbidden":
        key = str(where[-1])
        near = did_you_mean(key, _keys_beside(where))
        return at(
            source,
            where,
            "unknown key" + (f"; did you mean {near}?" if near else ""),
            value=key,
            fix=(f"write {near}" if near else "remove it")
            + " (`tpuctl job schema` prints every key the format has)",
        )
    shown = value if not isinstance(value, dict | list) else type(value).__name__
    return at(
        source,
        where,
        f"{error['msg'].lower()} (got {shown!r})",
        value=shown,
        fix="see the key's type in `tpuctl job schema`",
    )


def _known_prefix(source: JobSource, loc: KeyPath) -> KeyPath:
    """``loc`` without the union branches pydantic adds (``str``, ``list[str]``...): the longest prefix
    that is a key of the file, else ``loc`` itself (a missing key)."""
    for end in range(len(loc), 0, -1):
        if loc[:end] in source.lines:
            return loc[:end]
    return loc


_MODELS: dict[tuple[str, ...], type[BaseModel]] = {
    (): model.JobFile,
    ("resources",): model.Resources,
    ("resources", "accelerator_args"): model.AcceleratorArgs,
    ("resources", "job_recovery"): model.JobRecovery,
    ("resources", "any_of"): model.AcceleratorChoice,
    ("resources", "ordered"): model.AcceleratorChoice,
    ("file_mounts",): model.FileMount,
}


def _keys_beside(where: KeyPath) -> Iterable[str]:
    """The keys the format allows where ``where``'s last key is."""
    parent = tuple(p for p in where[:-1] if isinstance(p, str))
    if parent[:1] == ("file_mounts",):
        parent = ("file_mounts",)  # its own keys are paths; their entries' keys are a FileMount's
    found = _MODELS.get(parent)
    return () if found is None else found.model_fields

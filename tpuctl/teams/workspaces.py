"""Workspaces: a team's share of the control plane, read from the server's workspace file (YAML).

A workspace names its Google project and the zones it may use, how many chips of each generation it may
hold at once (in all, and per capacity type), the dollars it may spend per calendar month (UTC), the
default and largest budget of one run, and its members with their roles. Without a workspace file (one
user, on loopback) there is one implicit workspace, ``LOCAL_WORKSPACE``, without limits.

The file::

    workspaces:
      team-a:
        project: my-project
        zones: [us-central1-a, us-west4-a]     # optional; default: every zone
        chips:                                 # optional; a generation left out: none allowed
          v5e: 32                              # at most 32 v5e chips at once, any capacity type
          v6e: {total: 64, spot: 64, on-demand: 16}
        usd_per_month: 50
        run_budget_usd: {default: 10, max: 25} # optional
        members:
          a1@example.com: member               # admin | member | viewer
          a2@example.com: viewer
    metrics:
      scrape_token_sha256: <hex>              # optional: /metrics also takes this bearer token

Errors name the file, the line and the key (``WorkspaceFileError``, exit 2).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Final

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from tpuctl.catalog.catalog import CapacityType
from tpuctl.errors import ConfigError
from tpuctl.store.records import LOCAL_WORKSPACE as LOCAL_WORKSPACE

_NAME_PATTERN: Final = r"^[a-z][a-z0-9-]{0,62}$"


class Role(StrEnum):
    ADMIN = "admin"
    MEMBER = "member"
    VIEWER = "viewer"

    @property
    def may_change(self) -> bool:
        """Admins and members submit, cancel and delete; viewers only read."""
        return self is not Role.VIEWER


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ChipLimit(_Strict):
    """At most ``total`` chips of one generation at once (None: no overall limit), and at most
    ``by_capacity[c]`` of them of capacity type ``c``. A bare number in the file is ``total``."""

    total: Annotated[int, Field(ge=0)] | None = None
    by_capacity: dict[CapacityType, Annotated[int, Field(ge=0)]] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _from_file(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            return {"total": value}
        if isinstance(value, dict) and "by_capacity" not in value:
            rest = {k: v for k, v in value.items() if k != "total"}
            return {"total": value.get("total"), "by_capacity": rest}
        return value

    def allows(self, capacity: CapacityType, chips_in_use: int, by_capacity_in_use: int, more: int) -> bool:
        """Whether ``more`` chips of ``capacity`` fit beside those in use (all types; this type)."""
        if self.total is not None and chips_in_use + more > self.total:
            return False
        cap = self.by_capacity.get(capacity)
        return cap is None or by_capacity_in_use + more <= cap

    def largest(self, capacity: CapacityType) -> int | None:
        """The most chips of ``capacity`` this limit could ever allow at once (None: unlimited)."""
        caps = [c for c in (self.total, self.by_capacity.get(capacity)) if c is not None]
        return min(caps) if caps else None


class RunBudget(_Strict):
    default: Annotated[float, Field(gt=0)] | None = None
    max: Annotated[float, Field(gt=0)] | None = None

    @model_validator(mode="after")
    def _default_within_max(self) -> RunBudget:
        if self.default is not None and self.max is not None and self.default > self.max:
            raise ValueError(f"default ({self.default}) is above max ({self.max})")
        return self


class Workspace(_Strict):
    """One team's share. ``chips`` None: no chip limit (the implicit local workspace); a dict: only the
    generations it names, each within its ``ChipLimit``."""

    name: str
    project: str | None = None
    zones: tuple[str, ...] | None = None
    chips: dict[str, ChipLimit] | None = None
    usd_per_month: Annotated[float, Field(ge=0)] | None = None
    run_budget_usd: RunBudget = Field(default_factory=RunBudget)
    members: dict[str, Role] = Field(default_factory=dict)

    @field_validator("members")
    @classmethod
    def _emails(cls, members: dict[str, Role]) -> dict[str, Role]:
        for email in members:
            if "@" not in email:
                raise ValueError(f"member {email!r} is not an email (a Google account or service account)")
        return {email.lower(): role for email, role in members.items()}

    def chip_limit(self, generation: str) -> ChipLimit | None:
        """The limit on ``generation`` (e.g. ``v5e``); None: unlimited. A workspace with a ``chips`` map
        that does not name the generation may hold none of it (``ChipLimit(total=0)``)."""
        if self.chips is None:
            return None
        return self.chips.get(generation, ChipLimit(total=0))


class MetricsAccess(_Strict):
    #: SHA-256 (hex) of a bearer token a Prometheus scraper sends to ``/metrics``; None: members only.
    scrape_token_sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")] | None = None


class Workspaces(_Strict):
    """Every workspace of a server, by name, and who may scrape its metrics."""

    workspaces: dict[Annotated[str, Field(pattern=_NAME_PATTERN)], Workspace]
    metrics: MetricsAccess = Field(default_factory=MetricsAccess)
    #: Where they were read from (None: the implicit local one).
    source: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _named(cls, value: Any) -> Any:
        if isinstance(value, dict) and isinstance(value.get("workspaces"), dict):
            value = dict(value)
            value["workspaces"] = {
                name: {**body, "name": name} if isinstance(body, dict) else body
                for name, body in value["workspaces"].items()
            }
        return value

    @classmethod
    def implicit(cls) -> Workspaces:
        """No workspace file: one workspace, ``LOCAL_WORKSPACE``, without limits or members."""
        return cls(workspaces={LOCAL_WORKSPACE: Workspace(name=LOCAL_WORKSPACE)})

    def __iter__(self) -> Iterator[Workspace]:  # type: ignore[override]
        return iter(self.workspaces[name] for name in sorted(self.workspaces))

    def get(self, name: str | None) -> Workspace | None:
        return self.workspaces.get(name or LOCAL_WORKSPACE)

    def roles_of(self, principal: str) -> Mapping[str, Role]:
        """The workspaces ``principal`` (an email, any case) belongs to, with its role in each."""
        email = principal.lower()
        return {ws.name: ws.members[email] for ws in self if email in ws.members}


class WorkspaceFileError(ConfigError):
    """A bad workspace file: ``path``, ``line`` and ``key`` say where."""

    kind = "workspace_file"

    def __init__(self, message: str, *, path: str, line: int | None, key: str, value: object) -> None:
        where = f"{path}:{line}" if line is not None else path
        super().__init__(
            f"{where}: {key}: {message}",
            path=path,
            field=key,
            value=value,
            fix="see the workspace file's format in docs/teams.md",
        )
        self.line = line
        self.key = key

    def details(self) -> dict[str, Any]:
        return {**super().details(), "line": self.line, "key": self.key}


def load_workspaces(path: Path) -> Workspaces:
    """The workspace file at ``path``, validated; ``WorkspaceFileError`` (exit 2) naming the line and key
    of the first problem, ``ConfigError`` for an unreadable file or bad YAML."""
    from tpuctl.jobs.source import parse_job_source

    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read workspace file {path}: {exc}", path=str(path)) from None
    source = parse_job_source(text, str(path))
    try:
        return Workspaces.model_validate({**source.data, "source": str(path)})
    except ValidationError as exc:
        error = exc.errors()[0]
        where = tuple(p for p in error["loc"] if p not in ("by_capacity",))
        key = ".".join(str(p) for p in where) or "(top)"
        value = error.get("input")
        shown = value if not isinstance(value, dict | list) else type(value).__name__
        message = "unknown key" if error["type"] == "extra_forbidden" else error["msg"]
        raise WorkspaceFileError(
            message, path=str(path), line=source.line_of(where), key=key, value=shown
        ) from None

"""What `pod create` and `pod delete` through `tpuctl server` send and get back: the requests (each with an
``Idempotency-Key`` header) and the services' own typed results (``Plan``, ``Placement``), so the CLI
renders a placement made by the server as it renders its own."""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from tpuctl.server.wire_views import ServedBy
from tpuctl.services.attempts import Placement
from tpuctl.services.gc import GcResult, GcSurvey
from tpuctl.services.placement import Plan
from tpuctl.services.placement_choices import PlacementChoices
from tpuctl.store.records import PodRecord


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class CreatePod(BaseModel):
    """``POST /v1/pods``: `pod create`'s parsed flags. ``name`` is always given (the client names an
    unnamed slice itself), so that a retry can only ever mean the same slice. Strict like every request
    body (an unknown key refused, values not coerced), but for ``choices``: the service's own dataclass,
    read from JSON (its tuples arrive as arrays), its unknown keys refused too."""

    model_config = ConfigDict(extra="forbid")

    accelerator_type: str = Field(strict=True, min_length=1, max_length=100)
    name: str = Field(strict=True, min_length=1, max_length=100)
    #: The placement flags (the server parses its network values again, as the saved form's are).
    choices: PlacementChoices
    slices: int = Field(default=1, strict=True, ge=1, le=10_000)
    runtime_version: str | None = Field(default=None, strict=True, min_length=1, max_length=200)
    labels: dict[str, Annotated[str, Field(strict=True)]] = Field(default_factory=dict, max_length=64)
    wait: bool = Field(default=True, strict=True)
    dry_run: bool = Field(default=False, strict=True)

    @field_validator("choices", mode="before")
    @classmethod
    def _known_choices(cls, value: Any) -> Any:
        if isinstance(value, dict):
            unknown = sorted(set(value) - {f.name for f in dataclasses.fields(PlacementChoices)})
            if unknown:
                raise ValueError(f"unknown placement choice {unknown[0]!r}")
        return value


class PodCreated(BaseModel):
    """The answer to ``POST /v1/pods``: with ``dry_run`` the plan only (``placement`` None, ``pods``
    empty); else the placement and its slices as `pod list` shows them. ``created`` is False for a retry
    that found the slices its key placed (then ``placement`` is None: the first answer's details were
    not kept, the slices are)."""

    served_by: ServedBy
    plan: Plan | None
    placement: Placement | None
    pods: list[dict[str, Any]]
    warnings: list[str]
    created: bool


class DeletePods(_Strict):
    """``POST /v1/pods/delete``: `pod delete`'s arguments; ``dry_run`` answers the plan only."""

    names: list[str] = Field(min_length=1, max_length=100)
    zone: str | None = Field(default=None, min_length=1, max_length=100)
    wait: bool = True
    force: bool = False
    dry_run: bool = False


class PodsDeleted(BaseModel):
    """What a delete did (or, with ``dry_run``, would do): ``plan`` is `pod delete --dry-run`'s plan (each
    slice's requests and the live runs on it); ``deleted`` the slices gone; ``failures`` the error
    documents of those that could not be deleted."""

    served_by: ServedBy
    plan: list[dict[str, Any]]
    deleted: list[dict[str, Any]]
    failures: list[dict[str, Any]]


class GcKey(_Strict):
    """One thing `pod gc` may delete, as its survey named it."""

    kind: str = Field(min_length=1, max_length=40)
    zone: str = Field(min_length=1, max_length=100)
    name: str = Field(min_length=1, max_length=200)


class CollectGarbage(_Strict):
    """``POST /v1/pods/gc``: `pod gc`. Unless ``dry_run``, the ledger entries whose slice is gone are
    recorded as gone; then the server surveys what to delete and deletes those of ``confirmed`` its
    survey still finds, never anything else (the client confirms a survey it was
    shown, and the server deletes only what it finds dead now)."""

    zone: str | None = Field(default=None, min_length=1, max_length=100)
    dry_run: bool = False
    confirmed: list[GcKey] = Field(default_factory=list, max_length=10_000)


class GarbageCollected(BaseModel):
    """What `pod gc` found (``vanished``: ledger entries whose slice is gone; ``survey``: what to delete
    and what it leaves as not its own) and what it deleted (``results``)."""

    served_by: ServedBy
    vanished: list[PodRecord]
    survey: GcSurvey
    results: list[GcResult]

"""What `pod create` and `pod delete` through `tpuctl server` send and get back: the requests (each with an
``Idempotency-Key`` header) and the services' own typed results (``Plan``, ``Placement``), so the CLI
renders a placement made by the server as it renders its own."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from tpuctl.server.wire_views import ServedBy
from tpuctl.services.attempts import Placement
from tpuctl.services.placement import Plan

#: A slice name as the CLI passes it on (the server checks it as the local command does).
_NAME = Field(min_length=1, max_length=100)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class CreatePod(_Strict):
    """``POST /v1/pods``: `pod create`'s parsed flags. ``name`` is always given (the client names an
    unnamed slice itself), so that a retry can only ever mean the same slice."""

    accelerator_type: str = Field(min_length=1, max_length=100)
    name: str = _NAME
    #: The placement flags, as ``PlacementChoices.to_dict`` writes them (parsed again on the server).
    choices: dict[str, Any]
    slices: int = Field(default=1, ge=1, le=10_000)
    runtime_version: str | None = Field(default=None, min_length=1, max_length=200)
    labels: dict[str, str] = Field(default_factory=dict, max_length=64)
    wait: bool = True
    dry_run: bool = False


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

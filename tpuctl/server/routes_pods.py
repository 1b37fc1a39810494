"""The mutating pod routes of `tpuctl server` (``pods``), each with an ``Idempotency-Key`` header:

- ``POST /v1/pods``: `pod create` (``wire_pods.CreatePod``); 201 with the placement, 200 for a retry of
  the key (the slices it placed) or a dry run (the plan the server would carry out).
- ``POST /v1/pods/delete``: `pod delete` (``wire_pods.DeletePods``); 200 with what was deleted.
- ``POST /v1/pods/gc``: `pod gc` (``wire_pods.CollectGarbage``); 200 with what it found and deleted.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Depends, Header
from fastapi.responses import JSONResponse

from tpuctl.server.gate import scoped
from tpuctl.server.wire import IDEMPOTENCY_HEADER, IDEMPOTENCY_KEY_PATTERN
from tpuctl.server.wire_pods import (
    CollectGarbage,
    CreatePod,
    DeletePods,
    GarbageCollected,
    PodCreated,
    PodsDeleted,
)
from tpuctl.server.wire_views import ServedBy

if TYPE_CHECKING:
    from collections.abc import Callable

    from tpuctl.services.session import Session

IdempotencyKey = Annotated[str, Header(alias=IDEMPOTENCY_HEADER, pattern=IDEMPOTENCY_KEY_PATTERN)]


def pod_routes(session: Session, json_body: Callable[..., None]) -> APIRouter:
    from tpuctl.server.pods import PodCreates, collect_garbage, delete_pods

    router = APIRouter()
    served = ServedBy(backend=session.backend.label, project=session.project)
    creates = PodCreates()

    @router.post(
        "/v1/pods",
        response_model=PodCreated,
        status_code=201,
        dependencies=[Depends(json_body)],
        responses={200: {"model": PodCreated, "description": "a retry, or a dry run: nothing placed now"}},
    )
    def create_pod(body: CreatePod, idempotency_key: IdempotencyKey) -> Any:
        answer = creates.create(scoped(session), served, body, idempotency_key)
        if answer.created:
            return answer
        return JSONResponse(answer.model_dump(mode="json"), status_code=200)

    @router.post("/v1/pods/delete", response_model=PodsDeleted, dependencies=[Depends(json_body)])
    def delete_pods_route(body: DeletePods, idempotency_key: IdempotencyKey) -> PodsDeleted:
        # A delete is idempotent by nature (a slice already gone is an outcome, never a second one); the
        # key is required all the same, as on every mutating request.
        return delete_pods(scoped(session), served, body)

    @router.post("/v1/pods/gc", response_model=GarbageCollected, dependencies=[Depends(json_body)])
    def collect_garbage_route(body: CollectGarbage, idempotency_key: IdempotencyKey) -> GarbageCollected:
        # Idempotent by nature too: what a first try deleted, a retry's survey no longer finds.
        return collect_garbage(scoped(session), served, body)

    return router

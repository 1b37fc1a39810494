"""``GET /v1/queue``'s answer: the server's waiting runs (``queue_view.QueuedRun``, validated by pydantic
on the way in), so `tpuctl queue --server` renders them with the local command's code."""

from __future__ import annotations

from pydantic import BaseModel

from tpuctl.server.queue_view import QueuedRun
from tpuctl.server.wire_views import ServedBy


class QueueOut(BaseModel):
    served_by: ServedBy
    runs: list[QueuedRun]

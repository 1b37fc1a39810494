"""The read-only answers of `tpuctl server` (``cost``, ``catalog prices``, ``quota``, ``pod list`` and
``pod describe``): each carries the service's own typed result (its dataclasses, validated by pydantic
on the way in), so the CLI renders a result from a server with the same code as a local one, and the
JSON documents are the same.

Every answer also says who served it (``ServedBy``): the server's backend marker and project, which the
CLI's banner and its documents' envelope name as a local command names its own.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from tpuctl.backends.base import BackendLabel
from tpuctl.catalog import PriceTable
from tpuctl.services.cost.estimate import EstimateRow
from tpuctl.services.cost.model import CostReport
from tpuctl.services.pods import PodView
from tpuctl.services.prices import PriceSource
from tpuctl.services.quota import QuotaUse


class ServedBy(BaseModel):
    """The backend and project the server's session works on."""

    backend: BackendLabel
    project: str


class CostReportOut(BaseModel):
    """``GET /v1/cost/report``: `cost report`'s result, computed by the server on its ledger."""

    served_by: ServedBy
    report: CostReport


class EstimateIn(BaseModel):
    """``POST /v1/cost/estimate``'s body: `cost estimate`'s flags, parsed (the server checks them again
    against its catalog)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    accelerator_type: str = Field(min_length=1, max_length=100)
    hours: float | None = Field(default=None, gt=0, le=1_000_000)
    zones: list[str] = Field(default_factory=list, max_length=500)
    region: str | None = Field(default=None, min_length=1, max_length=100)
    slices: int = Field(default=1, ge=1, le=10_000)


class EstimateOut(BaseModel):
    """`cost estimate`'s result: the priced rows (``EstimateRow``), the zones that do not offer the type,
    the prices used and the warnings."""

    served_by: ServedBy
    rows: list[EstimateRow]
    not_offered: list[str]
    prices: PriceSource
    warnings: list[str]


class PricesOut(BaseModel):
    """``GET /v1/catalog/prices``: the price table the server prices with (its refreshed cache, else the
    bundled one) and where it came from."""

    served_by: ServedBy
    table: PriceTable
    source: PriceSource


class QuotaOut(BaseModel):
    """``GET /v1/quota``: every quota row of the server's project (the CLI filters them as it shows)."""

    served_by: ServedBy
    uses: list[QuotaUse]


class PodListOut(BaseModel):
    served_by: ServedBy
    pods: list[PodView]


class PodDescriptionOut(BaseModel):
    """``GET /v1/pods/{name}``: `pod describe`'s record (``PodService.describe``)."""

    served_by: ServedBy
    pod: dict[str, Any]


# ``CostReport`` names ``PriceSource`` only for type checkers (its module must not import the price
# loader); pydantic needs the class itself to build the model.
CostReportOut.model_rebuild(_types_namespace={"PriceSource": PriceSource})

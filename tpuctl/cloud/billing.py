"""Cloud Billing Catalog API client (httpx): the public SKUs of a service, with their unit prices.

``GET {base}/v1/services/{SERVICE_ID}/skus`` with ``pageToken`` pagination (up to 5000 SKUs a page). TPU
SKUs live under two services (as SkyPilot's ``fetch_gcp.py`` reads them): Cloud TPU
(``E000-3F24-B8AA``: v2, v3, v4) and Compute Engine (``6F81-5844-456A``: v5e, v5p, v6e). A SKU's unit
price is ``units + nanos / 1e9`` of ``pricingInfo[0].pricingExpression.tieredRates[0].unitPrice``;
``units`` is an int64, so JSON carries it as a string, and proto3 JSON omits zero fields (a missing
``nanos`` is 0).

The catalog is public: Google accepts an API key (``?key=``) or OAuth credentials. The base URL is a
constructor argument so tests (respx) and Billing-API-compatible stand-ins can be used; errors go through
``tpuctl.cloud.translate`` like every other provider call. httpx and google-auth are imported when the
client is first used, not when this module is.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from tpuctl.cloud.retry import RetryPolicy, Sleep, call_with_retry
from tpuctl.cloud.translate import error_from_http_response, translate_errors
from tpuctl.errors import CloudError

if TYPE_CHECKING:
    import httpx
    from google.auth.credentials import Credentials

GOOGLE_BILLING_URL = "https://cloudbilling.googleapis.com"
#: Compute Engine: the v5e, v5p and v6e TPU SKUs are listed here.
COMPUTE_SERVICE_ID = "6F81-5844-456A"
#: Cloud TPU: v2, v3 and v4.
TPU_SERVICE_ID = "E000-3F24-B8AA"
TPU_SERVICE_IDS: tuple[str, ...] = (COMPUTE_SERVICE_ID, TPU_SERVICE_ID)
_SCOPES = ["https://www.googleapis.com/auth/cloud-billing.readonly"]
_MAX_PAGES = 1000  # a server that keeps handing out new page tokens must not loop us forever


@dataclass(frozen=True)
class Sku:
    """One SKU as tpuctl needs it: what it is, where it applies, and its first-tier unit price."""

    sku_id: str
    service_id: str
    description: str
    usage_type: str  # OnDemand, Preemptible, Commit1Yr, ...
    resource_group: str
    regions: tuple[str, ...]
    unit_price: float | None  # USD per usage_unit; None when the SKU carries no price
    usage_unit: str  # "h" for TPU SKUs
    currency: str
    effective_time: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "sku_id": self.sku_id,
            "service_id": self.service_id,
            "description": self.description,
            "usage_type": self.usage_type,
            "resource_group": self.resource_group,
            "regions": list(self.regions),
            "unit_price": self.unit_price,
            "usage_unit": self.usage_unit,
            "currency": self.currency,
            "effective_time": self.effective_time,
        }


def money(unit_price: Mapping[str, Any]) -> float:
    """A google.type.Money JSON object -> float: ``units`` (int64 as a string) + ``nanos`` / 1e9."""
    raw_units = unit_price.get("units", "0")
    raw_nanos = unit_price.get("nanos", 0)
    try:
        units = int(str(raw_units or "0"))
        nanos = int(raw_nanos or 0)
    except (TypeError, ValueError):
        raise CloudError(
            f"unparseable price in a billing SKU: units={raw_units!r}, nanos={raw_nanos!r}"
        ) from None
    value = units + nanos / 1e9
    if not math.isfinite(value) or value < 0:
        raise CloudError(f"price out of range in a billing SKU: units={raw_units!r}, nanos={raw_nanos!r}")
    return value


def parse_sku(raw: Mapping[str, Any], service_id: str) -> Sku:
    """One SKU JSON object -> ``Sku``. Missing optional parts become empty values, never errors: the
    mapping step decides which SKUs matter."""
    category = raw.get("category") or {}
    if not isinstance(category, Mapping):
        category = {}
    infos = raw.get("pricingInfo") or []
    unit_price: float | None = None
    usage_unit = ""
    currency = ""
    effective = ""
    if isinstance(infos, list) and infos and isinstance(infos[0], Mapping):
        info = infos[0]
        effective = str(info.get("effectiveTime", ""))
        expression = info.get("pricingExpression") or {}
        if isinstance(expression, Mapping):
            usage_unit = str(expression.get("usageUnit", ""))
            rates = expression.get("tieredRates") or []
            if isinstance(rates, list) and rates and isinstance(rates[0], Mapping):
                price = rates[0].get("unitPrice") or {}
                if isinstance(price, Mapping):
                    currency = str(price.get("currencyCode", ""))
                    unit_price = money(price)
    regions = raw.get("serviceRegions") or []
    return Sku(
        sku_id=str(raw.get("skuId", "")),
        service_id=service_id,
        description=str(raw.get("description", "")),
        usage_type=str(category.get("usageType", "")),
        resource_group=str(category.get("resourceGroup", "")),
        regions=tuple(str(r) for r in regions) if isinstance(regions, list) else (),
        unit_price=unit_price,
        usage_unit=usage_unit,
        currency=currency,
        effective_time=effective,
    )


class CloudBillingCatalogClient:
    """Lists the SKUs of a service from the Cloud Billing Catalog API."""

    def __init__(
        self,
        *,
        base_url: str = GOOGLE_BILLING_URL,
        api_key: str | None = None,
        credentials: Credentials | None = None,
        timeout_s: float = 60.0,
        retry: RetryPolicy | None = None,
        page_size: int = 5000,
        transport: httpx.BaseTransport | None = None,
        sleep: Sleep | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._api_key = api_key
        self._credentials = credentials
        self._timeout_s = timeout_s
        self._retry = retry or RetryPolicy()
        self._page_size = page_size
        self._transport = transport
        self._sleep = sleep
        self._client: httpx.Client | None = None

    def __repr__(self) -> str:  # never show the key or the credentials
        return f"CloudBillingCatalogClient(base_url={self.base_url!r})"

    @classmethod
    def for_google(
        cls,
        *,
        api_key: str | None = None,
        credentials: Credentials | None = None,
        quota_project: str | None = None,
        **kwargs: Any,
    ) -> CloudBillingCatalogClient:
        """Against cloudbilling.googleapis.com: with an API key if given, else ADC (or ``credentials``),
        billing quota to ``quota_project`` when given."""
        if api_key is None and credentials is None:
            from tpuctl.cloud.credentials import default_credentials

            credentials = default_credentials(quota_project=quota_project)
        return cls(base_url=GOOGLE_BILLING_URL, api_key=api_key, credentials=credentials, **kwargs)

    # ----------------------------------------------------------------------------------------------

    def list_skus(self, service_id: str) -> list[Sku]:
        """Every SKU of the service, all pages."""
        return list(self.iter_skus(service_id))

    def iter_skus(self, service_id: str) -> Iterator[Sku]:
        url = f"{self.base_url}/v1/services/{service_id}/skus"
        what = f"list billing SKUs of service {service_id}"
        token = ""
        seen: set[str] = set()
        for _ in range(_MAX_PAGES):
            params = {"pageSize": str(self._page_size)}
            if token:
                params["pageToken"] = token
            page = call_with_retry(
                functools.partial(self._get_json, url, params, what),
                policy=self._retry,
                idempotent=True,
                sleep=self._sleep,
            )
            items = page.get("skus", [])
            if not isinstance(items, list):
                raise CloudError(f"{what}: 'skus' is not a list in the response")
            for item in items:
                if isinstance(item, Mapping):
                    yield parse_sku(item, service_id)
            token = str(page.get("nextPageToken") or "")
            if not token:
                return
            if token in seen:
                raise CloudError(f"{what}: the server repeated page token {token!r}")
            seen.add(token)
        raise CloudError(f"{what}: more than {_MAX_PAGES} pages; giving up")

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def __enter__(self) -> CloudBillingCatalogClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ----------------------------------------------------------------------------------------------

    def _http(self) -> httpx.Client:
        if self._client is None:
            import httpx

            loopback = self.base_url.startswith(("http://127.", "http://localhost", "http://[::1]"))
            self._client = httpx.Client(
                timeout=self._timeout_s,
                transport=self._transport,
                # A proxy from the environment must never see loopback traffic.
                trust_env=not loopback,
                headers={"Accept": "application/json"},
            )
        return self._client

    def _auth_headers(self) -> dict[str, str]:
        creds: Any = self._credentials  # google-auth is untyped
        if creds is None:
            return {}
        if not creds.valid:
            import google.auth.transport.requests

            creds.refresh(google.auth.transport.requests.Request())
        headers: dict[str, str] = {}
        creds.apply(headers)
        return headers

    def _get_json(self, url: str, params: Mapping[str, str], what: str) -> dict[str, Any]:
        query = dict(params)
        if self._api_key:
            # The key goes in the query string (the API's documented form); translate.scrub keeps it out
            # of any error message built from a URL.
            query["key"] = self._api_key
        with translate_errors(what, mutating=False):
            response = self._http().get(url, params=query, headers=self._auth_headers())
            if response.is_error:
                raise error_from_http_response(response.status_code, response.content, what=what)
            try:
                data = json.loads(response.content)
            except ValueError as exc:
                ctype = response.headers.get("content-type", "?")
                raise CloudError(
                    f"{what}: the response (HTTP {response.status_code}, {ctype}) is not valid JSON: {exc}",
                    fix="check that the endpoint is the Cloud Billing Catalog API",
                ) from None
            if not isinstance(data, dict):
                raise CloudError(f"{what}: expected a JSON object, got {type(data).__name__}")
            return data

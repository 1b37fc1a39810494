"""Cloud Quotas API client (httpx): the TPU quota *limits* of a project, from ``quotaInfos.list``.

``GET {base}/v1/projects/{project}/locations/global/services/{service}/quotaInfos`` with ``pageToken``
pagination, for the TPU API (``tpu.googleapis.com``) or Compute Engine (``compute.googleapis.com``, whose
TPU quotas are a pool of their own: docs/google-facts.md#compute-engine-quotas). Compute Engine lists every
quota it has (CPUs, GPUs, disks, addresses...); only its TPU quotas are kept.

A QuotaInfo's ``dimensionsInfos`` hold per-location overrides (``{"dimensions": {"zone": Z}, ...}``;
Compute Engine's per-family quota adds ``tpu_family``) plus one entry with empty (omitted) ``dimensions``:
the project default for every location in its ``applicableLocations``. Each location (and family) becomes
one ``QuotaLimit`` row (an override wins over the default); a default with no locations listed becomes one
row without a location, the limit wherever no row says otherwise. ``details.value`` is an int64, so JSON
carries it as a string; proto3 JSON omits zero values, so a missing ``value`` means a limit of 0 (and
``-1`` means unlimited).

Against Google the base URL is ``https://cloudquotas.googleapis.com`` with a bearer token from
google-auth credentials (refreshed when expired); against the simulator it is the simulator's URL with no
auth. httpx and google-auth are imported when the client is first used, not when this module is.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from tpuctl.cloud.base import QuotaLimit
from tpuctl.cloud.config import CloudConfig
from tpuctl.cloud.retry import RetryPolicy, Sleep, call_with_retry
from tpuctl.cloud.translate import error_from_http_response, translate_errors
from tpuctl.errors import CloudError

if TYPE_CHECKING:
    import httpx
    from google.auth.credentials import Credentials

GOOGLE_QUOTAS_URL = "https://cloudquotas.googleapis.com"
TPU_SERVICE = "tpu.googleapis.com"
COMPUTE_SERVICE = "compute.googleapis.com"
_MAX_PAGES = 1000  # a server that keeps handing out new page tokens must not loop us forever


class CloudQuotasClient:
    """Reads quota limits for one service (the TPU API by default) from the Cloud Quotas API."""

    def __init__(
        self,
        *,
        base_url: str = GOOGLE_QUOTAS_URL,
        credentials: Credentials | None = None,
        service: str = TPU_SERVICE,
        timeout_s: float = 30.0,
        retry: RetryPolicy | None = None,
        page_size: int = 500,
        transport: httpx.BaseTransport | None = None,
        sleep: Sleep | None = None,
        keep: Callable[[str], bool] | None = None,
        trust_env: bool = True,
    ) -> None:
        """``credentials`` None: no Authorization header. ``keep``: which quota ids to read (default: all of
        the TPU API's; Compute Engine's TPU ones). ``trust_env``: whether proxy variables apply."""
        self.base_url = base_url.rstrip("/")
        self.service = service
        self._credentials = credentials
        self._timeout_s = timeout_s
        self._retry = retry or RetryPolicy()
        self._page_size = page_size
        self._transport = transport
        self._sleep = sleep
        self._trust_env = trust_env
        self._client: httpx.Client | None = None
        self._keep = keep or (is_compute_tpu_quota if service == COMPUTE_SERVICE else None)

    def __repr__(self) -> str:  # never show the credentials
        return f"CloudQuotasClient(base_url={self.base_url!r}, service={self.service!r})"

    @classmethod
    def from_config(
        cls,
        config: CloudConfig,
        *,
        base_url: str = GOOGLE_QUOTAS_URL,
        service: str = TPU_SERVICE,
        transport: httpx.BaseTransport | None = None,
    ) -> CloudQuotasClient:
        """The client a backend's ``config`` describes (credentials, retry, timeout, proxies), at
        ``base_url`` (Google's Cloud Quotas API unless given)."""
        return cls(
            base_url=base_url,
            credentials=config.credentials(),
            service=service,
            timeout_s=config.request_timeout_s,
            retry=config.retry,
            transport=transport,
            sleep=config.sleep,
            trust_env=config.trust_env,
        )

    @classmethod
    def for_simulator(
        cls,
        base_url: str,
        *,
        service: str = TPU_SERVICE,
        transport: httpx.BaseTransport | None = None,
        **overrides: Any,
    ) -> CloudQuotasClient:
        """Against the simulator at ``base_url`` as its backend calls it (``tpuctl.backends.sim``: no auth,
        no proxy, fast retries); ``overrides``: fields of its ``CloudConfig`` (``retry``, ``sleep``...)."""
        from tpuctl.backends.sim import SIM_CLIENTS

        config = replace(SIM_CLIENTS, **overrides)
        return cls.from_config(config, base_url=base_url, service=service, transport=transport)

    # ----------------------------------------------------------------------------------------------

    def list_quota_limits(self, project: str) -> list[QuotaLimit]:
        """Every limit of the service, one row per (quota id, TPU family, place)."""
        infos = self.list_quota_infos(project)
        if self._keep is not None:
            infos = [i for i in infos if self._keep(_quota_id(i))]
        return parse_quota_infos(infos)

    def list_quota_infos(self, project: str) -> list[dict[str, Any]]:
        """The raw QuotaInfo objects, all pages."""
        url = f"{self.base_url}/v1/projects/{project}/locations/global/services/{self.service}/quotaInfos"
        what = f"list quota infos of {self.service} in project {project}"
        infos: list[dict[str, Any]] = []
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
            items = page.get("quotaInfos", [])
            if not isinstance(items, list):
                raise CloudError(f"{what}: 'quotaInfos' is not a list in the response")
            infos.extend(i for i in items if isinstance(i, dict))
            token = str(page.get("nextPageToken") or "")
            if not token:
                return infos
            if token in seen:
                raise CloudError(f"{what}: the server repeated page token {token!r}")
            seen.add(token)
        raise CloudError(f"{what}: more than {_MAX_PAGES} pages; giving up")

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    # ----------------------------------------------------------------------------------------------

    def _http(self) -> httpx.Client:
        if self._client is None:
            try:
                import httpx
            except ImportError as exc:  # pragma: no cover - httpx is a hard dependency
                raise CloudError("httpx is not installed", fix="pip install 'httpx>=0.27'") from exc
            self._client = httpx.Client(
                timeout=self._timeout_s,
                transport=self._transport,
                trust_env=self._trust_env,
                headers={"Accept": "application/json"},
            )
        return self._client

    def _auth_headers(self) -> dict[str, str]:
        creds: Any = self._credentials  # google-auth is untyped
        if creds is None:
            return {}
        if not creds.valid:  # expired or never fetched
            import google.auth.transport.requests

            creds.refresh(google.auth.transport.requests.Request())
        headers: dict[str, str] = {}
        creds.apply(headers)  # Authorization: Bearer ..., and x-goog-user-project when set
        return headers

    def _get_json(self, url: str, params: Mapping[str, str], what: str) -> dict[str, Any]:
        with translate_errors(what, mutating=False):
            response = self._http().get(url, params=params, headers=self._auth_headers())
            if response.is_error:
                raise error_from_http_response(response.status_code, response.content, what=what)
            try:
                data = json.loads(response.content)
            except ValueError as exc:
                ctype = response.headers.get("content-type", "?")
                raise CloudError(
                    f"{what}: the response (HTTP {response.status_code}, {ctype}) is not valid JSON: {exc}",
                    fix="check that the endpoint is the Cloud Quotas API",
                ) from None
            if not isinstance(data, dict):
                raise CloudError(f"{what}: expected a JSON object, got {type(data).__name__}")
            return data


def parse_quota_infos(infos: list[dict[str, Any]]) -> list[QuotaLimit]:
    """QuotaInfo JSON objects -> one ``QuotaLimit`` per (quota id, location), defaults expanded."""
    rows: list[QuotaLimit] = []
    for info in infos:
        quota_id = _quota_id(info)
        if not quota_id:
            raise CloudError(f"quota info without quotaId or name: {json.dumps(info)[:200]}")
        rows.extend(_info_rows(info, quota_id))
    return rows


def is_compute_tpu_quota(quota_id: str) -> bool:
    """Whether a Compute Engine quota id is a TPU one: TPUS-PER-TPU-FAMILY-per-project-region,
    PREEMPTIBLE-TPU7X-per-project-region, TPU-V5P-per-project-zone, TPU-LITE-PODSLICE-V5-...
    (docs/google-facts.md#compute-engine-quotas); not CPUS-..., GPUS-PER-GPU-FAMILY-... or the hundreds of
    others."""
    return any(part.startswith("TPU") for part in quota_id.upper().split("-"))


def _quota_id(info: Mapping[str, Any]) -> str:
    return str(info.get("quotaId") or str(info.get("name", "")).rsplit("/", 1)[-1])


def _info_rows(info: Mapping[str, Any], quota_id: str) -> list[QuotaLimit]:
    """One row per (tpu_family, place). An entry without a dimension applies to every value of it that
    has no entry of its own (Cloud Quotas' rule), so the most specific entry wins: one naming the place
    over one naming only the family, then the family over neither. Ranking the place above the family
    is the simulator's reading too (``World.compute_quota_limit``); Google's own is unconfirmed."""
    metric = str(info.get("metric", ""))
    scopes = info.get("dimensions") or []
    scope = "region" if "region" in scopes and "zone" not in scopes else "zone"
    best: dict[tuple[str | None, str | None], tuple[int, QuotaLimit]] = {}
    for entry in info.get("dimensionsInfos", []) or []:
        if not isinstance(entry, Mapping):
            continue
        dims = entry.get("dimensions") or {}
        dims = dims if isinstance(dims, Mapping) else {}
        family = str(dims["tpu_family"]) if dims.get("tpu_family") else None
        rank = 2 * bool(dims.get("zone") or dims.get("region")) + (family is not None)
        for zone, region in _entry_places(entry, dims, scope):
            row = QuotaLimit(quota_id, metric, _limit_value(entry, quota_id), zone, region, family)
            key = (family, zone or region)
            if key not in best or rank >= best[key][0]:
                best[key] = (rank, row)
    # A family's default does not reach a place that has its own entry for every family.
    kept = {
        key: (rank, row)
        for key, (rank, row) in best.items()
        if key[0] is None or best.get((None, key[1]), (-1,))[0] <= rank
    }
    # Defaults first, then the entries naming a place, each in the order the API listed them.
    return [row for rank, row in kept.values() if rank < 2] + [
        row for rank, row in kept.values() if rank >= 2
    ]


def _entry_places(
    entry: Mapping[str, Any], dims: Mapping[str, Any], scope: str
) -> list[tuple[str | None, str | None]]:
    """(zone, region) pairs an entry applies to: the place it names, else every location it lists (a
    default; Google lists them), else one row without a place: the limit wherever no row says otherwise."""
    zone, region = dims.get("zone"), dims.get("region")
    if zone or region:
        return [(str(zone) if zone else None, str(region) if region else None)]
    places = [str(loc) for loc in entry.get("applicableLocations") or [] if loc and loc != "global"]
    if not places:
        return [(None, None)]
    zonal = [scope == "zone" and place.count("-") >= 2 for place in places]
    return [(place, None) if at_zone else (None, place) for place, at_zone in zip(places, zonal, strict=True)]


def _limit_value(entry: Mapping[str, Any], quota_id: str) -> int:
    details = entry.get("details") or {}
    raw = details.get("value", "0") if isinstance(details, Mapping) else "0"
    try:
        return int(str(raw))
    except ValueError:
        raise CloudError(
            f"quota {quota_id}: limit value {raw!r} is not an integer (dimensions {entry.get('dimensions')})"
        ) from None

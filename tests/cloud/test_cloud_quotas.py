"""Cloud Quotas client (httpx) against respx: recorded-shape QuotaInfos, pagination, auth, errors; and
Compute Engine's TPU quotas with their ``tpu_family`` dimension, from respx and from the simulator."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest
import respx

from tpuctl.cloud.base import QuotaLimit
from tpuctl.cloud.config import CloudConfig
from tpuctl.cloud.quotas import CloudQuotasClient, is_compute_tpu_quota, parse_quota_infos
from tpuctl.cloud.retry import RetryPolicy
from tpuctl.errors import CloudError, PermissionDeniedError, RateLimitedError, UnauthenticatedError
from tpuctl.testing.cloud import ENDPOINT, InProcessSim, httpx_transport

BASE = "https://cloudquotas.googleapis.com"
URL = f"{BASE}/v1/projects/p/locations/global/services/tpu.googleapis.com/quotaInfos"
FAST = RetryPolicy(max_attempts=3, initial_wait_s=0.0, max_wait_s=0.0, deadline_s=5.0)


def info(
    quota_id: str, metric: str, dims: list[tuple[dict[str, str], dict[str, Any]]], dimension: str = "zone"
) -> dict[str, Any]:
    """A QuotaInfo as the API returns it (google/api/cloudquotas/v1/resources.proto)."""
    return {
        "name": f"projects/123/locations/global/services/tpu.googleapis.com/quotaInfos/{quota_id}",
        "quotaId": quota_id,
        "metric": metric,
        "service": "tpu.googleapis.com",
        "isPrecise": True,
        "containerType": "PROJECT",
        "dimensions": [dimension],
        "metricDisplayName": "TPU v5 Lite PodSlice chips",
        "quotaDisplayName": quota_id,
        "metricUnit": "1",
        "quotaIncreaseEligibility": {"isEligible": True},
        "isFixed": False,
        "isConcurrent": False,
        "dimensionsInfos": [
            {"dimensions": d, "details": det, "applicableLocations": list(d.values())} for d, det in dims
        ],
    }


PAGE1 = {
    "quotaInfos": [
        info(
            "TPUV5sLitepodPerProjectPerZoneForTPUAPI",
            "tpu.googleapis.com/v5litepod",
            [({"zone": "us-east5-b"}, {"value": "64"}), ({"zone": "us-west4-a"}, {})],
        ),
    ],
    "nextPageToken": "tok-2",
}
PAGE2 = {
    "quotaInfos": [
        info(
            "TPUV6EPreemptiblePerProjectPerRegionForTPUAPI",
            "tpu.googleapis.com/v6e_preemptible",
            [({"region": "us-east5"}, {"value": "-1"})],
            dimension="region",
        ),
    ],
}


def client(**kw: Any) -> CloudQuotasClient:
    kw.setdefault("retry", FAST)
    return CloudQuotasClient(base_url=BASE, **kw)


@respx.mock
def test_pages_are_followed_and_every_dimension_is_a_row() -> None:
    route = respx.get(URL).mock(
        side_effect=[httpx.Response(200, json=PAGE1), httpx.Response(200, json=PAGE2)]
    )
    rows = client().list_quota_limits("p")
    assert rows == [
        QuotaLimit(
            "TPUV5sLitepodPerProjectPerZoneForTPUAPI", "tpu.googleapis.com/v5litepod", 64, zone="us-east5-b"
        ),
        # proto3 JSON omits a zero int64: no "value" means a limit of 0.
        QuotaLimit(
            "TPUV5sLitepodPerProjectPerZoneForTPUAPI", "tpu.googleapis.com/v5litepod", 0, zone="us-west4-a"
        ),
        QuotaLimit(
            "TPUV6EPreemptiblePerProjectPerRegionForTPUAPI",
            "tpu.googleapis.com/v6e_preemptible",
            -1,
            region="us-east5",
        ),
    ]
    assert route.call_count == 2
    first, second = (c.request.url.params for c in route.calls)
    assert "pageToken" not in first and second["pageToken"] == "tok-2"


@respx.mock
def test_permission_denied_is_translated_and_not_retried() -> None:
    route = respx.get(URL).mock(
        return_value=httpx.Response(
            403,
            json={
                "error": {
                    "code": 403,
                    "status": "PERMISSION_DENIED",
                    "message": "Permission 'cloudquotas.quotas.get' denied on resource 'projects/p'",
                }
            },
        )
    )
    with pytest.raises(PermissionDeniedError) as err:
        client().list_quota_limits("p")
    assert "list quota infos of tpu.googleapis.com in project p" in err.value.message
    assert "cloudquotas.quotas.get" in err.value.message
    assert route.call_count == 1


@respx.mock
def test_rate_limit_is_retried_then_surfaces() -> None:
    limited = httpx.Response(
        429,
        json={
            "error": {
                "code": 429,
                "status": "RESOURCE_EXHAUSTED",
                "message": "Quota exceeded for quota metric 'Read requests'",
                "details": [
                    {"@type": "type.googleapis.com/google.rpc.ErrorInfo", "reason": "RATE_LIMIT_EXCEEDED"}
                ],
            }
        },
    )
    route = respx.get(URL).mock(side_effect=[limited, httpx.Response(200, json=PAGE2)])
    assert len(client().list_quota_limits("p")) == 1
    assert route.call_count == 2
    route = respx.get(URL).mock(return_value=limited)
    with pytest.raises(RateLimitedError):
        client().list_quota_limits("p")
    assert route.call_count == 2 + 3  # the same route: 2 before, then FAST.max_attempts


@respx.mock
def test_transient_5xx_and_connection_errors_are_retried() -> None:
    route = respx.get(URL).mock(
        side_effect=[
            httpx.Response(503, json={"error": {"code": 503, "status": "UNAVAILABLE", "message": "later"}}),
            httpx.ConnectError("refused"),
            httpx.Response(200, json=PAGE2),
        ]
    )
    assert len(client().list_quota_limits("p")) == 1
    assert route.call_count == 3


@respx.mock
def test_malformed_json_is_a_clear_error_and_not_retried() -> None:
    route = respx.get(URL).mock(
        return_value=httpx.Response(200, content=b"<html>login</html>", headers={"content-type": "text/html"})
    )
    with pytest.raises(CloudError) as err:
        client().list_quota_limits("p")
    assert "not valid JSON" in err.value.message and "text/html" in err.value.message
    assert route.call_count == 1


@respx.mock
def test_bad_limit_value_and_repeated_page_token() -> None:
    bad = {"quotaInfos": [info("Q", "m", [({"zone": "z"}, {"value": "lots"})])]}
    respx.get(URL).mock(return_value=httpx.Response(200, json=bad))
    with pytest.raises(CloudError, match="'lots' is not an integer"):
        client().list_quota_limits("p")
    respx.get(URL).mock(return_value=httpx.Response(200, json={"quotaInfos": [], "nextPageToken": "same"}))
    with pytest.raises(CloudError, match="repeated page token"):
        client().list_quota_limits("p")


class FakeCredentials:
    """Quacks like google.auth credentials: expired at first, refreshed on demand."""

    def __init__(self) -> None:
        self.token: str | None = None
        self.refreshes = 0

    @property
    def valid(self) -> bool:
        return self.token is not None

    def refresh(self, request: object) -> None:
        self.refreshes += 1
        self.token = "ya29.SECRET-TOKEN"

    def apply(self, headers: dict[str, str]) -> None:
        headers["authorization"] = f"Bearer {self.token}"


@respx.mock
def test_bearer_token_is_refreshed_once_and_never_shown() -> None:
    creds = FakeCredentials()
    route = respx.get(URL).mock(
        side_effect=[
            httpx.Response(200, json=PAGE1),
            httpx.Response(200, json=PAGE2),
            httpx.Response(
                401,
                json={
                    "error": {
                        "code": 401,
                        "status": "UNAUTHENTICATED",
                        "message": "Request had invalid authentication credentials.",
                    }
                },
            ),
        ]
    )
    c = CloudQuotasClient(credentials=creds, retry=FAST)  # type: ignore[arg-type]  # Google's URL
    assert len(c.list_quota_limits("p")) == 3
    assert creds.refreshes == 1
    assert all(call.request.headers["authorization"] == "Bearer ya29.SECRET-TOKEN" for call in route.calls)
    with pytest.raises(UnauthenticatedError) as err:
        c.list_quota_limits("p")
    assert "SECRET" not in str(err.value) and "SECRET" not in repr(c)
    assert err.value.fix == "gcloud auth application-default login"


@respx.mock
def test_simulator_client_sends_the_simulated_adc_token() -> None:
    from tpuctl.sim.iam import ADC_TOKEN

    sim_url = "http://127.0.0.1:8471/v1/projects/p/locations/global/services/tpu.googleapis.com/quotaInfos"
    route = respx.get(sim_url).mock(return_value=httpx.Response(200, json=PAGE2))
    rows = CloudQuotasClient.for_simulator("http://127.0.0.1:8471", retry=FAST).list_quota_limits("p")
    assert rows[0].region == "us-east5"
    assert route.calls[0].request.headers["authorization"] == f"Bearer {ADC_TOKEN}"


def test_no_adc_gives_the_login_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    import google.auth
    from google.auth.exceptions import DefaultCredentialsError

    def no_adc(**_: Any) -> Any:
        raise DefaultCredentialsError("Your default credentials were not found.")

    monkeypatch.setattr(google.auth, "default", no_adc)
    with pytest.raises(UnauthenticatedError) as err:
        CloudQuotasClient.from_config(CloudConfig())  # Google's defaults: ADC, looked up when built
    assert err.value.fix == "gcloud auth application-default login"


def test_parse_skips_entries_that_are_not_objects() -> None:
    assert parse_quota_infos([{"quotaId": "Q", "metric": "m", "dimensionsInfos": ["junk"]}]) == []


@pytest.mark.parametrize(
    ("dims", "entries", "expected"),
    [
        # The default entry (no dimensions) expands to every location it lists; an override wins.
        (
            ["zone"],
            [{"details": {"value": "64"}, "applicableLocations": ["us-east5-b", "us-west4-a"]},
             {"dimensions": {"zone": "us-west4-a"}, "details": {"value": "0"},
              "applicableLocations": ["us-west4-a"]}],
            {("us-east5-b", None, 64), ("us-west4-a", None, 0)},
        ),
        (
            ["region"],
            [{"details": {"value": "-1"}, "applicableLocations": ["us-east5", "us-central1"]}],
            {(None, "us-east5", -1), (None, "us-central1", -1)},
        ),
        # A default that lists no locations applies wherever no row says otherwise: a row without one.
        (["zone"], [{"details": {}}], {(None, None, 0)}),
    ],
)  # fmt: skip
def test_default_entries_become_rows(
    dims: list[str], entries: list[dict[str, Any]], expected: set[tuple[str | None, str | None, int]]
) -> None:
    raw = {
        "quotaId": "Q",
        "metric": "tpu.googleapis.com/tpu-v6e",
        "dimensions": dims,
        "dimensionsInfos": entries,
    }
    assert {(r.zone, r.region, r.limit) for r in parse_quota_infos([raw])} == expected


# --- Compute Engine's TPU quotas (service compute.googleapis.com; docs/google-facts.md#compute-engine-quotas)

COMPUTE_URL = f"{BASE}/v1/projects/p/locations/global/services/compute.googleapis.com/quotaInfos"
FAMILY_Q = "TPUS-PER-TPU-FAMILY-per-project-region"
TPU7X_SPOT_Q = "PREEMPTIBLE-TPU7X-per-project-region"
REGIONS = ["europe-west4", "us-central1", "us-east5"]


def compute_info(quota_id: str, dims: list[str], entries: list[dict[str, Any]]) -> dict[str, Any]:
    """A Compute Engine QuotaInfo as Cloud Quotas answers (google/api/cloudquotas/v1/resources.proto)."""
    return {
        "name": f"projects/123/locations/global/services/compute.googleapis.com/quotaInfos/{quota_id}",
        "quotaId": quota_id,
        "metric": f"compute.googleapis.com/{quota_id.split('-per-')[0].lower().replace('-', '_')}",
        "service": "compute.googleapis.com",
        "isPrecise": True,
        "containerType": "PROJECT",
        "dimensions": dims,
        "metricDisplayName": quota_id,
        "quotaDisplayName": quota_id,
        "metricUnit": "1",
        "quotaIncreaseEligibility": {"isEligible": True},
        "isFixed": False,
        "isConcurrent": False,
        "dimensionsInfos": entries,
    }


COMPUTE_PAGE = {
    "quotaInfos": [
        # Compute Engine lists all of its quotas; only the TPU ones are kept.
        compute_info("CPUS-per-project-region", ["region"],
                     [{"details": {"value": "24"}, "applicableLocations": REGIONS}]),
        compute_info(
            "GPUS-PER-GPU-FAMILY-per-project-region",
            ["region", "gpu_family"],
            [{"dimensions": {"region": "us-central1", "gpu_family": "NVIDIA_H100"}, "details": {"value": "8"},
              "applicableLocations": ["us-central1"]}],
        ),
        compute_info(
            FAMILY_Q,
            ["region", "tpu_family"],
            [
                # The project default for every family: unset reads as 0 (proto3 omits the zero).
                {"details": {}, "applicableLocations": REGIONS},
                # CT6E everywhere, and more of it in us-east5.
                {"dimensions": {"tpu_family": "CT6E"}, "details": {"value": "32"},
                 "applicableLocations": REGIONS},
                {"dimensions": {"region": "us-east5", "tpu_family": "CT6E"}, "details": {"value": "64"},
                 "applicableLocations": ["us-east5"]},
                {"dimensions": {"region": "us-central1", "tpu_family": "TPU7X"}, "details": {"value": "128"},
                 "applicableLocations": ["us-central1"]},
            ],
        ),
        compute_info(TPU7X_SPOT_Q, ["region"],
                     [{"details": {"value": "64"}, "applicableLocations": ["us-central1"]}]),
    ]
}  # fmt: skip


@respx.mock
def test_compute_tpu_quotas_keep_their_family_and_nothing_else_is_read() -> None:
    respx.get(COMPUTE_URL).mock(return_value=httpx.Response(200, json=COMPUTE_PAGE))
    rows = client(service="compute.googleapis.com").list_quota_limits("p")
    assert {(r.quota_id, r.region, r.tpu_family, r.limit) for r in rows} == {
        (FAMILY_Q, "europe-west4", None, 0),
        (FAMILY_Q, "us-central1", None, 0),
        (FAMILY_Q, "us-east5", None, 0),
        (FAMILY_Q, "europe-west4", "CT6E", 32),
        (FAMILY_Q, "us-central1", "CT6E", 32),
        (FAMILY_Q, "us-east5", "CT6E", 64),  # the region's own entry wins over the family's default
        (FAMILY_Q, "us-central1", "TPU7X", 128),
        (TPU7X_SPOT_Q, "us-central1", None, 64),
    }
    assert all(r.zone is None for r in rows)
    assert {r.metric for r in rows if r.quota_id == FAMILY_Q} == {
        "compute.googleapis.com/tpus_per_tpu_family"
    }


def test_a_region_entry_for_every_family_beats_a_family_default() -> None:
    # {"region": R} names R for every family; {"tpu_family": F} names F everywhere else (Cloud Quotas: a
    # missing dimension covers the values without an entry of their own). Place outranks family.
    raw = compute_info(
        FAMILY_Q,
        ["region", "tpu_family"],
        [
            {"dimensions": {"tpu_family": "TPU7X"}, "details": {"value": "64"},
             "applicableLocations": REGIONS},
            {"dimensions": {"region": "us-east5"}, "details": {"value": "8"},
             "applicableLocations": ["us-east5"]},
        ],
    )  # fmt: skip
    rows = {(r.region, r.tpu_family): r.limit for r in parse_quota_infos([raw])}
    assert rows == {("europe-west4", "TPU7X"): 64, ("us-central1", "TPU7X"): 64, ("us-east5", None): 8}


@pytest.mark.parametrize(
    ("quota_id", "tpu"),
    [
        (FAMILY_Q, True),
        (TPU7X_SPOT_Q, True),
        ("PREEMPTIBLE-TPU-V6E-per-project-region", True),
        ("TPU-LITE-PODSLICE-V5-per-project-zone", True),
        ("CPUS-per-project-region", False),
        ("GPUS-PER-GPU-FAMILY-per-project-region", False),
        ("NVIDIA-H100-GPUS-per-project-region", False),
    ],
)
def test_which_compute_quotas_are_tpu_ones(quota_id: str, tpu: bool) -> None:
    assert is_compute_tpu_quota(quota_id) is tpu


def test_compute_quotas_are_read_from_the_simulator(tmp_path: Path) -> None:
    with InProcessSim(tmp_path) as sim:
        quotas = CloudQuotasClient.for_simulator(
            ENDPOINT, service="compute.googleapis.com", retry=FAST, transport=httpx_transport(sim.engine)
        )
        rows = quotas.list_quota_limits(sim.world.project)
    family = {(r.region, r.tpu_family): r.limit for r in rows if r.quota_id == FAMILY_Q}
    # The bundled world: TPU7X 128 and CT6E 256 in every region, other families 0.
    assert family[("us-central1", "TPU7X")] == 128
    assert family[("us-central1", "CT6E")] == 256
    assert family[("us-central1", None)] == 0
    spot = {r.region: r.limit for r in rows if r.quota_id == TPU7X_SPOT_Q}
    assert spot["us-central1"] == 128
    assert not any(r.quota_id.endswith("ForTPUAPI") for r in rows)  # the TPU API's pool is not here

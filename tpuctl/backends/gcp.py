"""The Google backend: the Cloud TPU API at tpu.googleapis.com, with Application Default Credentials.

Google answers in seconds and rate-limits, so tpuctl polls and retries it patiently; its hosts are VMs
reached over SSH on port 22 (the endpoints' own port is the TPU runtime's, 8470), through their
external IP where they have one, else their internal IP. Every client shares one set of Application
Default Credentials, billing user credentials' quota to ``quota_project`` when one is set.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from tpuctl.backends.base import (
    WALL_TIME,
    BackendLabel,
    Closer,
    HostAddress,
    OwnPrices,
    RecoveryTuning,
    Timekeeping,
    Tuning,
    WheelhouseOnly,
)
from tpuctl.cloud.retry import RetryPolicy

if TYPE_CHECKING:
    from tpuctl.cloud.account_access import AccountAccess
    from tpuctl.cloud.base import Node, TpuCloud
    from tpuctl.cloud.buckets import BucketClient
    from tpuctl.cloud.config import CloudConfig
    from tpuctl.cloud.identity import IdentityIssuer
    from tpuctl.cloud.instances import InstanceClient, VmInstance
    from tpuctl.cloud.oslogin import OsLoginAccess
    from tpuctl.hosts.pythons import ImagePython

GCP_TUNING = Tuning(
    # Rate limits on Google are per minute: wait longer between tries.
    step_retry=RetryPolicy(max_attempts=6, initial_wait_s=0.5, max_wait_s=10.0, deadline_s=120.0),
    gc_retry=RetryPolicy(max_attempts=5, initial_wait_s=0.2, max_wait_s=5.0, deadline_s=60.0),
    poll_interval_s=2.0,
    poll_max_interval_s=15.0,
    recovery=RecoveryTuning(
        poll_s=10.0,
        confirm_timeout_s=120.0,
        backoff_initial_s=15.0,
        backoff_max_s=300.0,
        budget_margin_s=120.0,
    ),
    budget_poll_s=5.0,
    # Deleting a slice takes a minute or two on Google, and the slice bills until it is gone.
    delete_margin_s=120.0,
)

NAME = "gcp"

#: A blue marker; a project taken from another tool's variable is called out, since it bills.
GCP_LABEL = BackendLabel(
    name=NAME,
    style="white on blue",
    headline="project {project}",
    names_state_dir=False,
    names_ambient_project=True,
)

#: SSH's port on a TPU VM (a node's network endpoints carry the TPU runtime's port, 8470).
SSH_PORT = 22


@dataclass
class GcpBackend:
    """Google Cloud, project ``project``."""

    project: str
    #: The project user credentials bill API quota to (``x-goog-user-project``); None: the ADC's own.
    quota_project: str | None = None
    name: str = NAME
    tuning: Tuning = GCP_TUNING
    timekeeping: Timekeeping = WALL_TIME
    label: BackendLabel = GCP_LABEL
    runtime: Literal["cpu", "tpu"] = "tpu"
    default_bucket: str | None = None
    host_wheelhouse: Path | None = None  # hosts install from the public index
    _config: CloudConfig | None = field(default=None, repr=False)

    def image_python(self, image: str) -> ImagePython:
        """Google's images: the ``python3`` of the Ubuntu release they are built on, where tpuctl knows
        the image; their hosts download a managed Python where they reach the internet."""
        from tpuctl.hosts.pythons import ImagePython, google_image_python

        return ImagePython(google_image_python(image), downloads=True)

    def open_cloud(self, state_dir: Path, closers: list[Closer]) -> TpuCloud:
        """Both of Google's TPU surfaces: the Cloud TPU API and Compute Engine (TPU7x and later exist only
        there), each with its Cloud Quotas pool, all with one set of Application Default Credentials,
        looked up now (``UnauthenticatedError`` with the fix when there are none)."""
        from tpuctl.catalog import Catalog
        from tpuctl.cloud.compute import GOOGLE_COMPUTE_ENDPOINT, ComputeCloud
        from tpuctl.cloud.quotas import COMPUTE_SERVICE, GOOGLE_QUOTAS_URL, TPU_SERVICE, CloudQuotasClient
        from tpuctl.cloud.surfaces import SurfaceRouter
        from tpuctl.cloud.tpu_api import GOOGLE_TPU_ENDPOINT, TpuApiCloud

        config = self.client_config()

        def quotas(service: str) -> CloudQuotasClient:
            return CloudQuotasClient.from_config(config, base_url=GOOGLE_QUOTAS_URL, service=service)

        return SurfaceRouter(
            TpuApiCloud(
                project=self.project, endpoint=GOOGLE_TPU_ENDPOINT, config=config, quotas=quotas(TPU_SERVICE)
            ),
            ComputeCloud(
                project=self.project,
                catalog=Catalog.load(),
                endpoint=GOOGLE_COMPUTE_ENDPOINT,
                config=config,
                quotas=quotas(COMPUTE_SERVICE),
            ),
        )

    def client_config(self) -> CloudConfig:
        """How every client calls Google: Application Default Credentials (looked up once, on first
        call), the environment's proxies honoured (a corporate proxy may be the only way out), the client
        defaults' patience for Google's rate limits."""
        if self._config is None:
            from tpuctl.cloud.config import CloudConfig
            from tpuctl.cloud.credentials import default_credentials, given

            credentials = default_credentials(quota_project=self.quota_project)
            self._config = CloudConfig(backend=self.name, credentials=given(credentials), trust_env=True)
        return self._config

    def host_addresses(self, cloud: TpuCloud, node: Node) -> list[HostAddress]:
        return [HostAddress(e.external_ip or e.ip_address, SSH_PORT) for e in node.network_endpoints]

    def open_os_login(self, cloud: TpuCloud, closers: list[Closer]) -> OsLoginAccess:
        """Google's OS Login API, tokeninfo and Compute Engine, with the clients' credentials."""
        import httpx

        from tpuctl.cloud.compute import GOOGLE_COMPUTE_ENDPOINT
        from tpuctl.cloud.credentials import GOOGLE_TOKENINFO_URL
        from tpuctl.cloud.oslogin import GOOGLE_OSLOGIN_URL, OsLoginAccess, OsLoginEndpoints

        config = self.client_config()
        http = httpx.Client(timeout=config.request_timeout_s, trust_env=config.trust_env)
        closers.append(http.close)
        endpoints = OsLoginEndpoints(GOOGLE_OSLOGIN_URL, GOOGLE_TOKENINFO_URL, GOOGLE_COMPUTE_ENDPOINT)
        return OsLoginAccess(endpoints, config.credentials(), http, retry=config.retry, sleep=config.sleep)

    def open_instances(self, cloud: TpuCloud, closers: list[Closer]) -> InstanceClient:
        """Compute Engine at Google, with the clients' credentials."""
        from tpuctl.cloud.compute import GOOGLE_COMPUTE_ENDPOINT
        from tpuctl.cloud.instances import InstanceClient

        client = InstanceClient(
            project=self.project, endpoint=GOOGLE_COMPUTE_ENDPOINT, config=self.client_config()
        )
        closers.append(client.close)
        return client

    def instance_address(self, cloud: TpuCloud, vm: VmInstance) -> HostAddress:
        return HostAddress(vm.address or "", SSH_PORT)

    def open_buckets(self, state_dir: Path, closers: list[Closer]) -> BucketClient:
        """Google's Cloud Storage JSON API, with the clients' credentials."""
        import httpx

        from tpuctl.cloud.buckets import GOOGLE_STORAGE_URL, BucketClient

        config = self.client_config()
        http = httpx.Client(timeout=config.request_timeout_s, trust_env=config.trust_env)
        closers.append(http.close)
        return BucketClient(
            GOOGLE_STORAGE_URL, config.credentials, http, retry=config.retry, sleep=config.sleep
        )

    def open_account_access(self, cloud: TpuCloud, closers: list[Closer]) -> AccountAccess:
        """Policy Troubleshooter and Compute Engine at Google, with the clients' credentials."""
        import httpx

        from tpuctl.cloud.account_access import GOOGLE_TROUBLESHOOTER_URL, AccountAccess, AccountEndpoints
        from tpuctl.cloud.compute import GOOGLE_COMPUTE_ENDPOINT

        config = self.client_config()
        http = httpx.Client(timeout=config.request_timeout_s, trust_env=config.trust_env)
        closers.append(http.close)
        endpoints = AccountEndpoints(GOOGLE_TROUBLESHOOTER_URL, GOOGLE_COMPUTE_ENDPOINT)
        return AccountAccess(endpoints, config.credentials(), http, retry=config.retry, sleep=config.sleep)

    def host_env(self, worker: int, addresses: list[HostAddress], chips_per_host: int) -> dict[str, str]:
        return {}  # a real TPU VM: JAX finds its chips, its peers and its coordinator itself

    def host_index_limit(self, cloud: TpuCloud) -> WheelhouseOnly | None:
        return None  # no wheelhouse: the hosts ask the package index themselves

    def notice_grace_s(self, cloud: TpuCloud) -> float | None:
        return None  # Google does not say; the supervisor's default confirmation timeout stands

    def maintenance_notice_s(self, cloud: TpuCloud) -> float | None:
        return None  # Google does not say per VM; the documented 60 s stands

    def identity_issuer(self, cloud: TpuCloud) -> IdentityIssuer:
        from tpuctl.cloud.identity import IdentityIssuer

        return IdentityIssuer.google()

    def own_prices(self) -> OwnPrices | None:
        return None

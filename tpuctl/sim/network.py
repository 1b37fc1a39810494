"""The simulated network's services (Google's APIs, Cloud Storage, the package mirror) and the environment
that points a simulated host's tools at them.

Like storage.googleapis.com, the services of one simulator state have one fixed address (a loopback
address of their own, outside the hosts' range; ``tpuctl.sim.vms.layout.services_address``) whichever
simulator process serves them: a host's programs outlive the CLI command whose in-process simulator
served their login, so the URLs in their environment must stay right. Every simulator process over the
state tries to bind them and serves them if it can; the others find the address in use and try again
later, so when the serving process exits another one takes over within a second (the bucket's objects
are on disk below the state dir, and the emulator reads them when it starts).

What each variable does, in the tool that reads it:

- ``FSSPEC_GCS_ENDPOINT_URL``: gcsfs's endpoint (etils.epath's gs:// directories) instead of
  storage.googleapis.com (fsspec reads ``FSSPEC_<protocol>_<kwarg>``).
- ``API_ENDPOINT_OVERRIDE``: google-cloud-storage's (orbax reads a bucket's metadata with it). Not
  ``STORAGE_EMULATOR_HOST``, which both would read too: with it google-cloud-storage sends no credentials,
  which the bucket refuses, where on Google it sends the VM's.
- ``TENSORSTORE_GCS_HTTP_URL``: the endpoint of tensorstore's gs:// kvstore driver (orbax's array data).
- ``FSSPEC_GCS_TOKEN=google_default``: gcsfs takes Application Default Credentials, as google-cloud-storage
  does; on a host they are its service account's, from its metadata server, as on a Google VM (with a
  custom endpoint gcsfs would otherwise try no metadata server and fall back to no credentials).
  tensorstore finds the same server through ``GCE_METADATA_ROOT`` (the host's login environment,
  ``tpuctl.sim.vms.sshd``).
- ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false``: gcsfs's default filesystem first asks the Storage Control
  API (gRPC) for the bucket's layout, which the emulator does not serve; the plain JSON-API filesystem.
- ``PIP_NO_INDEX`` / ``PIP_FIND_LINKS``: a pip the user's setup brings installs from the simulator's
  package mirror only (the image has none; uv is brought by tpuctl, not installed with pip).
- ``UV_NO_INDEX`` / ``UV_FIND_LINKS``: the same for uv, and ``UV_DEFAULT_INDEX``: the mirror's simple
  index, because uv 0.13 reads no ``UV_NO_INDEX`` (``uv pip install --help`` names no variable for
  ``--no-index``; later uv releases may) and would otherwise ask PyPI; ``UV_PYTHON_DOWNLOADS=never``: uv uses
  the image's interpreter and never tries to download one.
- ``PIP_DISABLE_PIP_VERSION_CHECK``: pip's self-check would ask PyPI, which the simulated network lacks.
- ``TPUCTL_BACKEND=sim`` and ``TPUCTL_SIM_URL``: the simulated APIs (TPU, Compute Engine, Cloud Quotas,
  OS Login, the identity issuer), served at the state's address too (``API_PORT``), for a tpuctl that
  runs on a host (the team server on its VM). A tpuctl on a Google VM needs no setting to reach Google's
  APIs: it is on Google's network, and its credentials come from the VM's metadata server. These two are
  the simulator's counterpart of being there, as ``GCE_METADATA_HOST`` is of metadata.google.internal;
  the credentials are the host's own all the same (``tpuctl.backends.sim``: on a host, its service
  account's token from its metadata server, never the laptop's).
"""

from __future__ import annotations

import dataclasses
import errno
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tpuctl.sim.engine import SimEngine
    from tpuctl.sim.fetch_through import FetchThrough
    from tpuctl.sim.world import World

#: The ports of the services on their address (the emulator's own default, a PyPI mirror's usual, and
#: ``tpuctl sim serve``'s default for the APIs).
STORAGE_PORT = 9023
MIRROR_PORT = 3141
API_PORT = 8470
#: How often a process that does not serve them checks whether it should take them over.
_TAKEOVER_INTERVAL_S = 0.5


def network_env(*, mirror_url: str, storage_url: str, api_url: str | None = None) -> dict[str, str]:
    """The variables that point a host's tools at the package mirror (``mirror_url``, its find-links
    page), at the storage emulator (``storage_url``, scheme://host:port with no path) and at the
    simulated APIs (``api_url``; None: a network without them, a test's bucket alone)."""
    storage = storage_url.rstrip("/")
    apis = {} if api_url is None else {"TPUCTL_BACKEND": "sim", "TPUCTL_SIM_URL": api_url.rstrip("/")}
    return {
        **apis,
        "FSSPEC_GCS_ENDPOINT_URL": storage,
        "API_ENDPOINT_OVERRIDE": storage,
        "TENSORSTORE_GCS_HTTP_URL": storage,
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
        "FSSPEC_GCS_TOKEN": "google_default",
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": mirror_url,
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "UV_NO_INDEX": "1",
        "UV_FIND_LINKS": mirror_url,
        "UV_DEFAULT_INDEX": mirror_url.rstrip("/") + "/simple/",
        "UV_PYTHON_DOWNLOADS": "never",
    }


def caller_storage_env(token: str, directory: Path, project: str) -> dict[str, str]:
    """The variables that make gcsfs, google-cloud-storage and tensorstore, in a process that is no
    simulated host (a test, a benchmark), call the bucket with ``token`` (``tpuctl.sim.iam``) for
    ``project``: Application Default Credentials from a file written in ``directory`` that holds the token
    (valid for centuries, so never refreshed), and tensorstore's fixed-token variable, which it reads
    before that file."""
    adc = directory / "application_default_credentials.json"
    adc.write_text(
        json.dumps(
            {
                "type": "authorized_user",
                "client_id": "tpuctl-sim",
                "client_secret": "tpuctl-sim",
                "refresh_token": "tpuctl-sim",
                "token": token,
                "expiry": "2999-01-01T00:00:00Z",
            }
        ),
        encoding="utf-8",
    )
    adc.chmod(0o600)
    return {
        "GOOGLE_APPLICATION_CREDENTIALS": str(adc),
        "GOOGLE_CLOUD_PROJECT": project,
        "GOOGLE_AUTH_TOKEN_FOR_TESTING": token,
    }


@dataclass(frozen=True)
class MirrorFetch:
    """One GET of a distribution file from the package mirror: the file's name, the byte range asked
    (None: the whole file), and whether it was served (False: the world gave hosts no route to it)."""

    file: str
    byte_range: str | None
    served: bool


def mirror_fetch_log(storage_dir: Path) -> Path:
    """Where the network services whose bucket is kept in ``storage_dir`` log the mirror's fetches
    (beside it, in the simulator's state: any process of the state may be the one serving the mirror)."""
    return storage_dir.with_name("sim-mirror-fetches.jsonl")


def mirror_fetches(log: Path) -> list[MirrorFetch]:
    """Every fetch in ``log`` (``mirror_fetch_log``), oldest first."""
    if not log.exists():
        return []
    return [MirrorFetch(**json.loads(line)) for line in log.read_text(encoding="utf-8").splitlines() if line]


class NetworkServices:
    """The storage emulator and package mirror of one simulator state, on ``address`` at fixed ports
    (the bucket checking its callers against ``world()``, the world in force), and with ``engine`` the
    simulated APIs that engine answers, served by this process whenever no other process does. ``env``
    is known before anything is bound; ``start()`` returns at once (binding happens on a thread of its
    own: the emulator's import alone takes a noticeable part of a second); ``stop()`` closes whatever
    this process serves."""

    def __init__(
        self,
        address: str,
        *,
        storage_dir: Path,
        wheelhouse: Path,
        world: Callable[[], World],
        fetch_through: FetchThrough | None = None,
        engine: SimEngine | None = None,
    ) -> None:
        self.address = address
        self.engine = engine  # None: no APIs on this network (a test's bucket and mirror alone)
        self.fetch_through = fetch_through  # the mirror's route to the user's package index
        self.world = world  # the world in force: who may use the bucket
        self.storage_dir = storage_dir
        self.wheelhouse = wheelhouse
        self._served: dict[str, Any] = {}
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.last_error: BaseException | None = None

    @property
    def storage_url(self) -> str:
        return f"http://{self.address}:{STORAGE_PORT}"

    @property
    def mirror_url(self) -> str:
        return f"http://{self.address}:{MIRROR_PORT}/"

    @property
    def api_url(self) -> str | None:
        return None if self.engine is None else f"http://{self.address}:{API_PORT}"

    @property
    def env(self) -> dict[str, str]:
        return network_env(mirror_url=self.mirror_url, storage_url=self.storage_url, api_url=self.api_url)

    @property
    def _ports(self) -> dict[str, int]:
        """Each service this network has, by name, and its port."""
        ports = {"mirror": MIRROR_PORT, "storage": STORAGE_PORT}
        return ports if self.engine is None else {**ports, "api": API_PORT}

    def start(self) -> None:
        if self._thread is None:
            self._stopping.clear()
            self._thread = threading.Thread(target=self._keep_served, name="tpuctl-sim-network", daemon=True)
            self._thread.start()

    def _keep_served(self) -> None:
        while True:
            self.serve_what_is_free()
            if len(self._served) == len(self._ports) or self._stopping.wait(_TAKEOVER_INTERVAL_S):
                return

    def serve_what_is_free(self) -> None:
        """Bind each service no process serves yet (one in use is another process's)."""
        from tpuctl.sim.mirror import PackageMirror
        from tpuctl.sim.server import ApiListener
        from tpuctl.sim.storage import StorageEmulator

        engine = self.engine
        makers: dict[
            str, Callable[[], PackageMirror | StorageEmulator | ApiListener]
        ] = {  # the mirror first: it binds at once, the emulator's import takes a while
            "mirror": lambda: PackageMirror(
                self.wheelhouse,
                host=self.address,
                port=MIRROR_PORT,
                fetch_through=self.fetch_through,
                admit=self._admit_to_mirror,
            ),
            "storage": lambda: StorageEmulator(
                self.world, self.storage_dir, host=self.address, port=STORAGE_PORT
            ),
        }
        if engine is not None:
            makers["api"] = lambda: ApiListener(engine, self.address, API_PORT)
        for name, make in makers.items():
            if name in self._served or self._stopping.is_set():
                continue
            service = make()
            try:
                service.start()
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    self.last_error = exc
                continue
            except ValueError as exc:
                # The emulator reads its index file while the process serving the bucket rewrites it
                # (not atomically): half a JSON document. Tried again at the next round.
                self.last_error = exc
                continue
            self._served[name] = service

    def _admit_to_mirror(self, method: str, path: str, byte_range: str | None) -> bool:
        """Whether the mirror answers (only the simulated hosts ask it: whether the world gives them a
        route to it); every GET of a distribution file is logged (``mirror_fetches``), answered or not."""
        from tpuctl.sim.mirror import DIST_SUFFIXES

        routed = self.world().hosts_reach_package_index
        if method == "GET" and path.endswith(DIST_SUFFIXES):
            fetch = MirrorFetch(file=path.rsplit("/", 1)[-1], byte_range=byte_range, served=routed)
            line = json.dumps(dataclasses.asdict(fetch)) + "\n"
            # One write of one short line to a file opened for appending: whole, whichever thread or
            # process of the state serves the mirror.
            with mirror_fetch_log(self.storage_dir).open("a", encoding="utf-8") as log:
                log.write(line)
        return routed

    def ready(self) -> bool:
        """Whether every service answers on its address (served here or by another process): a VM is
        only served once its network is, as on Google where it is always there."""
        import socket

        if len(self._served) == len(self._ports):
            return True
        for port in self._ports.values():
            try:
                socket.create_connection((self.address, port), timeout=0.2).close()
            except OSError:
                return False
        return True

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        for service in self._served.values():
            service.stop()
        self._served.clear()


__all__ = [
    "API_PORT",
    "MIRROR_PORT",
    "STORAGE_PORT",
    "MirrorFetch",
    "NetworkServices",
    "caller_storage_env",
    "mirror_fetch_log",
    "mirror_fetches",
    "network_env",
]

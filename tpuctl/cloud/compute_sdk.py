"""The part of google-cloud-compute tpuctl uses, imported without the rest.

``import google.cloud.compute_v1`` runs the package's ``__init__``, which imports the client of every one
of Compute Engine's ~100 services: about 0.5 s of CPU on every command that lists slices, where tpuctl
needs nine clients and the message types. :func:`compute_v1` imports those modules alone: the package's
own module object is stood in for while its submodules load, then taken out of ``sys.modules`` again, so a
later ``import google.cloud.compute_v1`` (a test, another library) runs the real ``__init__`` and reuses
the submodules already loaded (same classes). Where the package is already imported, it is used as is.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import json
import sys
import threading
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from tpuctl.errors import CloudError

if TYPE_CHECKING:
    from google.auth.credentials import Credentials

    from tpuctl.cloud.config import CloudConfig

PACKAGE = "google.cloud.compute_v1"
INSTALL_HINT = "pip install 'google-cloud-compute>=1.57,<2' (a dependency of tpuctl: reinstall tpuctl)"

#: The clients tpuctl builds, by class name -> the service module that defines it.
CLIENTS = {
    "InstancesClient": "instances",
    "InstanceGroupManagersClient": "instance_group_managers",
    "InstanceTemplatesClient": "instance_templates",
    "ResourcePoliciesClient": "resource_policies",
    "MachineTypesClient": "machine_types",
    "ZonesClient": "zones",
    "ZoneOperationsClient": "zone_operations",
    "RegionOperationsClient": "region_operations",
    "GlobalOperationsClient": "global_operations",
}


@functools.cache
def compute_v1() -> Any:
    """A namespace with the message types and :data:`CLIENTS` of ``google.cloud.compute_v1`` (attribute
    access as on the package); ``CloudError`` with the install hint when the library is missing."""
    loaded = sys.modules.get(PACKAGE)
    if loaded is not None:
        return loaded
    try:
        spec = importlib.util.find_spec(PACKAGE)
    except ImportError as exc:
        raise CloudError(f"google-cloud-compute is not importable ({exc})", fix=INSTALL_HINT) from None
    if spec is None:
        raise CloudError("google-cloud-compute is not installed", fix=INSTALL_HINT)
    sys.modules[PACKAGE] = importlib.util.module_from_spec(spec)  # the package, its __init__ not run
    try:
        types = importlib.import_module(f"{PACKAGE}.types")
        clients = {
            name: getattr(importlib.import_module(f"{PACKAGE}.services.{service}"), name)
            for name, service in CLIENTS.items()
        }
    except ImportError as exc:
        raise CloudError(f"google-cloud-compute is not importable ({exc})", fix=INSTALL_HINT) from None
    finally:
        del sys.modules[PACKAGE]
    return SimpleNamespace(**{n: getattr(types, n) for n in types.__all__}, **clients)


#: A client's service module name -> its class name (the inverse of :data:`CLIENTS`).
CLIENT_CLASSES = {service: name for name, service in CLIENTS.items()}


class ComputeClients:
    """The REST clients of Compute Engine's services at ``endpoint``, one per service (a
    :data:`CLIENTS` module name), made on first use with ``config``'s credentials (looked up once); each
    transport's requests session honours HTTP(S)_PROXY only where ``config`` says (it would even for a
    simulator on loopback). Shared by every thread of its owner."""

    def __init__(self, endpoint: str, config: CloudConfig) -> None:
        self._endpoint = endpoint
        self._config = config
        self._credentials: Credentials | None = None
        self._clients: dict[str, Any] = {}
        self._lock = threading.Lock()

    def get(self, kind: str) -> Any:
        with self._lock:
            client = self._clients.get(kind)
            if client is None:
                from google.api_core.client_options import ClientOptions

                if self._credentials is None:
                    self._credentials = self._config.credentials()
                cls = getattr(compute_v1(), CLIENT_CLASSES[kind])
                client = cls(
                    credentials=self._credentials,
                    transport="rest",
                    client_options=ClientOptions(api_endpoint=self._endpoint),
                )
                session = getattr(client.transport, "_session", None)
                if session is not None:
                    session.trust_env = self._config.trust_env
                self._clients[kind] = client
            return client

    def close(self) -> None:
        with self._lock:
            for client in self._clients.values():
                transport = getattr(client, "transport", None)
                if transport is not None:
                    transport.close()
            self._clients.clear()


def to_json(message: Any) -> dict[str, Any]:
    """A compute_v1 message as its REST JSON (camelCase), as it went over the wire: enums by name (proto-plus
    writes their numbers unless told), so ``status == "DONE"`` reads as it does on the wire."""
    data: dict[str, Any] = json.loads(type(message).to_json(message, use_integers_for_enums=False))
    return data

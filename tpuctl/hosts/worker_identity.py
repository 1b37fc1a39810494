"""A Compute Engine TPU host's place in its slice, as the environment JAX's GKE cluster path reads.

Runs on the host, inside ``follow.py launch``, with the image's stock ``python3`` and the standard library
only (like follow.py, it imports nothing of tpuctl).

Why: JAX finds a TPU slice's peers one of two ways (jax/_src/clusters/cloud_tpu_cluster.py, 0.10.2;
docs/google-facts.md#worker-identity). ``GceTpuCluster`` reads the metadata attribute
``agent-worker-number``, which TPU API VMs publish but Compute Engine VMs may not (unconfirmed).
``GkeTpuCluster`` reads the environment: ``TPU_WORKER_ID`` (this host's id in the slice) and
``TPU_WORKER_HOSTNAMES`` (every host, comma-separated, in id order). GKE injects those; Compute Engine does
not, and third-party guides for Compute Engine slices export them by hand. tpuctl does it for every program it
starts on a Compute Engine slice, from what Compute Engine does publish:

- ``TPU_WORKER_ID``: the ``TPU_WORKER_ID`` line of the ``tpu-env`` attribute (``KEY: 'value'`` lines);
- ``TPU_WORKER_HOSTNAMES``: the ``worker-network-endpoints`` attribute, each entry as JAX parses it (a
  bare instance name as it is, the TPU API's ``name:id:ip`` as the ip).

Both come from Google's own description of the slice, never from tpuctl's numbering of the hosts: libtpu
reads the same variables when they are set, so they must agree with the slice's real worker ids. A value
the program's environment already has (the user's ``--env``) is kept.
"""

from __future__ import annotations

import http.client
import time

WORKER_ID = "TPU_WORKER_ID"
WORKER_HOSTNAMES = "TPU_WORKER_HOSTNAMES"
_ATTRIBUTES = "/computeMetadata/v1/instance/attributes/"
# JAX's own patience with the metadata server (get_metadata: 6 tries, 0.5 s apart).
_TRIES = 6
_RETRY_S = 0.5


class WorkerIdentityError(RuntimeError):
    """The metadata server did not say where this host sits in its slice."""


def metadata_host(environ: dict[str, str]) -> str:
    """The metadata server's "host[:port]" as google-auth finds it (GCE_METADATA_HOST, then JAX's
    GCE_METADATA_IP, then the name every VM resolves)."""
    return environ.get("GCE_METADATA_HOST") or environ.get("GCE_METADATA_IP") or "metadata.google.internal"


def tpu_worker_env(environ: dict[str, str], *, sleep_s: float = _RETRY_S) -> dict[str, str]:
    """``TPU_WORKER_ID`` and ``TPU_WORKER_HOSTNAMES`` for this host, less those ``environ`` already sets.
    Raises WorkerIdentityError naming the server and the attribute when they cannot be read."""
    wanted = [name for name in (WORKER_ID, WORKER_HOSTNAMES) if name not in environ]
    if not wanted:
        return {}
    host = metadata_host(environ)
    derived = {
        WORKER_ID: worker_id(_attribute(host, "tpu-env", sleep_s)),
        WORKER_HOSTNAMES: ",".join(worker_hostnames(_attribute(host, "worker-network-endpoints", sleep_s))),
    }
    return {name: derived[name] for name in wanted}


def worker_id(tpu_env: str) -> str:
    """The ``TPU_WORKER_ID`` of a ``tpu-env`` attribute (``TPU_WORKER_ID: '1'`` lines, parsed as JAX's
    ``get_tpu_env_value_from_metadata`` does)."""
    for line in tpu_env.splitlines():
        key, colon, value = line.partition(":")
        if colon and key.strip() == WORKER_ID:
            value = value.strip().strip("'")
            if value.isdigit():
                return value
            raise WorkerIdentityError(f"tpu-env has TPU_WORKER_ID {value!r}, not a worker number")
    raise WorkerIdentityError(f"tpu-env has no TPU_WORKER_ID line: {tpu_env.strip()[:200]!r}")


def worker_hostnames(endpoints: str) -> list[str]:
    """The hosts of ``worker-network-endpoints`` in worker order: a bare name (Compute Engine) as it is,
    a ``name:id:ip`` triple (TPU API) as its ip; anything else is refused, as JAX refuses it."""
    hosts = []
    for entry in endpoints.strip().split(","):
        parts = entry.strip().split(":")
        if len(parts) == 1 and parts[0]:
            hosts.append(parts[0])
        elif len(parts) == 3 and parts[2]:
            hosts.append(parts[2])
        else:
            raise WorkerIdentityError(f"worker-network-endpoints has an entry {entry!r} JAX cannot parse")
    return hosts


def _attribute(host: str, key: str, sleep_s: float) -> str:
    hostname, _, port = host.rpartition(":") if ":" in host else (host, "", "")
    last = ""
    for attempt in range(_TRIES):
        if attempt:
            time.sleep(sleep_s)
        conn = http.client.HTTPConnection(hostname, int(port or 80), timeout=10.0)
        try:
            conn.request("GET", _ATTRIBUTES + key, headers={"Metadata-Flavor": "Google"})
            response = conn.getresponse()
            body = response.read().decode("utf-8", "replace")
        except (OSError, http.client.HTTPException) as exc:
            last = f"{type(exc).__name__}: {exc}"
            continue
        finally:
            conn.close()
        if response.status == 200:
            return body
        last = f"HTTP {response.status}"
    raise WorkerIdentityError(
        f"the metadata server at {host} did not answer instance/attributes/{key} in {_TRIES} tries "
        f"({last}); a Compute Engine TPU VM publishes it once the slice is up"
    )

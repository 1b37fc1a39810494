"""The simulated network's service endpoints, as the environment a simulated host's login shell gets.

What each variable does, in the tool that reads it:

- ``STORAGE_EMULATOR_HOST``: the Cloud Storage endpoint of google-cloud-storage and gcsfs (etils.epath's
  gs:// directories) instead of storage.googleapis.com.
- ``TENSORSTORE_GCS_HTTP_URL``: the endpoint of tensorstore's gs:// kvstore driver (orbax's array data).
- ``GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT=false``: gcsfs's default filesystem first asks the Storage Control
  API (gRPC) for the bucket's layout, which the emulator does not serve; the plain JSON-API filesystem.
- ``FSSPEC_GCS_TOKEN=anon``: gcsfs sends no credentials (fsspec reads ``FSSPEC_<protocol>_<kwarg>``); the
  emulator checks none, and gcsfs would otherwise walk its credential chain first.
- ``PIP_NO_INDEX`` / ``PIP_FIND_LINKS``: pip installs from the simulator's package mirror only (the uv
  bootstrap of host setup).
- ``UV_NO_INDEX`` / ``UV_FIND_LINKS``: the same for uv, and ``UV_DEFAULT_INDEX``: the mirror's simple
  index, because uv 0.13 reads no ``UV_NO_INDEX`` (``uv pip install --help`` names no variable for
  ``--no-index``; later uv releases may) and would otherwise ask PyPI; ``UV_PYTHON_DOWNLOADS=never``: uv uses
  the image's interpreter and never tries to download one.
- ``PIP_DISABLE_PIP_VERSION_CHECK``: pip's self-check would ask PyPI, which the simulated network lacks.
"""

from __future__ import annotations


def network_env(*, mirror_url: str, storage_url: str) -> dict[str, str]:
    """The variables that point a host's tools at the package mirror (``mirror_url``, its find-links
    page) and at the storage emulator (``storage_url``, scheme://host:port with no path)."""
    storage = storage_url.rstrip("/")
    return {
        "STORAGE_EMULATOR_HOST": storage,
        "TENSORSTORE_GCS_HTTP_URL": storage,
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
        "FSSPEC_GCS_TOKEN": "anon",
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": mirror_url,
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "UV_NO_INDEX": "1",
        "UV_FIND_LINKS": mirror_url,
        "UV_DEFAULT_INDEX": mirror_url.rstrip("/") + "/simple/",
        "UV_PYTHON_DOWNLOADS": "never",
    }


__all__ = ["network_env"]

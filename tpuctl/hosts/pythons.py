"""Which Python the hosts' image has, which one the run's environment is made with, and what the setup
does where the two differ (``host_python``), for the run's plan.

The environment's interpreter is ``SetupSpec.python`` (the version the runtime's lock was tested with).
The setup script makes the environment with the image's own ``python<version>`` where the image has
it; where it does not, uv downloads a managed CPython of that version (python-build-standalone, from
GitHub) into the environment directory on the host that builds it, so the environment's archive in the
bucket carries it to every host that restores it, which needs no internet (``tpuctl.hosts.setup``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

#: The ``python3`` of the Ubuntu releases Google's TPU images are built on (docs/google-facts.md#images).
_UBUNTU_PYTHONS = {"2204": "3.10", "2404": "3.12"}
#: The TPU API runtime versions whose name does not say their Ubuntu release (observed: 22.04).
_RUNTIME_UBUNTU = {"v2-alpha-tpuv5-lite": "2204", "v2-alpha-tpuv5": "2204", "v2-alpha-tpuv6e": "2204"}
#: ``tpu-ubuntu2204-base``, ``ubuntu-accel-2404-amd64-tpu-tpu7x``: the release is in the name.
_UBUNTU_IN_NAME = re.compile(r"ubuntu(?:-accel-)?(\d{4})")


def google_image_python(image: str) -> str | None:
    """The ``python3`` version (``3.10``) of a Google TPU runtime version or Compute Engine image family;
    None for an image tpuctl does not know (a ``--runtime-version`` of the user's own)."""
    release = _RUNTIME_UBUNTU.get(image)
    if release is None and (found := _UBUNTU_IN_NAME.search(image)) is not None:
        release = found.group(1)
    return None if release is None else _UBUNTU_PYTHONS.get(release)


@dataclass(frozen=True)
class ImagePython:
    """What a backend's image offers a setup: its ``python3`` version (None: unknown), and whether uv on
    its hosts may download a managed Python (the simulator's hosts may not: ``UV_PYTHON_DOWNLOADS``)."""

    version: str | None
    downloads: bool


@dataclass(frozen=True)
class HostPython:
    """The hosts' Python as the plan states it.

    ``image``: the image's ``python3`` version (None: tpuctl does not know it). ``environment``: the
    version the run's environment is made with (None: no environment; the image's ``python3`` runs the
    program). ``handling``: how a difference between the two is bridged (None where there is none).
    ``warning``: why the setup will fail on it, where tpuctl can tell beforehand.
    """

    image: str | None
    environment: str | None
    handling: str | None = None
    warning: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "image": self.image,
            "environment": self.environment,
            "handling": self.handling,
            "warning": self.warning,
        }


def host_python(
    image: ImagePython, environment: str | None, *, bucket: bool, external_ips: bool | None
) -> HostPython:
    """The plan's account of the hosts' Python for an environment made with ``environment`` (None: no
    environment) on ``image``. ``bucket``: the environment is stored in and restored from the run's
    bucket (one builder) rather than built on every host; ``external_ips``: whether the hosts get
    external IPs (None: an existing slice, not known)."""
    if environment is None or image.version == environment:
        return HostPython(image.version, environment)
    needs = f"the runtime needs {environment}"
    has = (
        "tpuctl does not know the image's python3"
        if image.version is None
        else f"the image has python{image.version}"
    )
    if not image.downloads:
        # The simulator's hosts may not download an interpreter; a Google host may.
        return HostPython(
            image.version,
            environment,
            warning=f"{has}; {needs}, and these hosts may not download a Python: setup fails at `uv venv` "
            f"unless the image has a python{environment} besides",
        )
    # The setup takes the image's python<version> where it has one besides its python3.
    where = f"where the image has no python{environment}, "
    download = f"a managed CPython {environment} (python-build-standalone, from GitHub)"
    if bucket:
        who = "the host that builds the environment"
        handling = (
            f"{where}uv downloads {download} into the environment on the one host that "
            "builds it; the other hosts, and later runs with the same inputs, restore it with the "
            "environment from the bucket, without the internet"
        )
    else:
        who = "every host"
        handling = (
            f"{where}uv downloads {download} into the environment on every host (no "
            "bucket: each host builds its own)"
        )
    warning = None
    if external_ips is False:
        unless = ", unless the bucket has this environment from an earlier run" if bucket else ""
        warning = (
            f"the hosts get no external IPs: {who} reaches the Python download only through a Cloud NAT "
            f"on their network; without one, setup fails at `uv venv`{unless}"
        )
    return HostPython(image.version, environment, handling=handling, warning=warning)

"""The hosts' Python as a run's plan states it: the image's, the environment's, and what the setup does
where they differ."""

from __future__ import annotations

import pytest

from tpuctl.catalog import Catalog
from tpuctl.hosts.pythons import HostPython, ImagePython, google_image_python, host_python


@pytest.mark.parametrize(
    ("image", "python"),
    [
        ("tpu-ubuntu2204-base", "3.10"),
        ("v2-alpha-tpuv5-lite", "3.10"),
        ("v2-alpha-tpuv6e", "3.10"),
        ("ubuntu-accel-2204-amd64-tpu-v5e-v5p-v6e", "3.10"),
        ("ubuntu-accel-2404-amd64-tpu-tpu7x", "3.12"),
        ("my-own-runtime", None),
    ],
)
def test_google_images_have_the_python_of_their_ubuntu_release(image: str, python: str | None) -> None:
    assert google_image_python(image) == python


def test_every_image_the_catalog_names_has_a_known_python() -> None:
    catalog = Catalog.load()
    for accel in catalog.types():
        assert google_image_python(accel.runtime_version) is not None, accel.runtime_version
        compute = accel.generation.compute
        if compute is not None:
            assert google_image_python(compute.image_family) is not None, compute.image_family


def test_a_matching_python_needs_no_handling() -> None:
    assert host_python(ImagePython("3.11", downloads=False), "3.11", bucket=True, external_ips=False) == (
        HostPython("3.11", "3.11")
    )
    # No environment: the image's python3 runs the program, whatever its version.
    assert host_python(ImagePython("3.10", downloads=True), None, bucket=False, external_ips=True) == (
        HostPython("3.10", None)
    )


def test_a_mismatch_with_a_bucket_downloads_once_and_restores_everywhere() -> None:
    planned = host_python(ImagePython("3.10", downloads=True), "3.11", bucket=True, external_ips=True)
    assert (planned.image, planned.environment, planned.warning) == ("3.10", "3.11", None)
    assert planned.handling is not None
    assert planned.handling.startswith(
        "where the image has no python3.11, uv downloads a managed CPython 3.11"
    )
    assert "on the one host that builds it" in planned.handling
    assert "from the bucket, without the internet" in planned.handling


def test_a_mismatch_without_a_bucket_downloads_on_every_host() -> None:
    planned = host_python(ImagePython("3.12", downloads=True), "3.11", bucket=False, external_ips=True)
    assert planned.handling is not None and "into the environment on every host" in planned.handling
    assert planned.warning is None


def test_a_mismatch_on_hosts_without_external_ips_warns() -> None:
    planned = host_python(ImagePython("3.10", downloads=True), "3.11", bucket=True, external_ips=False)
    assert planned.warning is not None
    assert planned.warning.startswith("the hosts get no external IPs: the host that builds the environment")
    assert "Cloud NAT" in planned.warning and "unless the bucket has this environment" in planned.warning
    # An existing slice: tpuctl does not know its hosts' addresses, so it does not warn.
    existing = host_python(ImagePython("3.10", downloads=True), "3.11", bucket=True, external_ips=None)
    assert existing.warning is None


def test_hosts_that_may_not_download_a_python_warn_instead_of_handling() -> None:
    planned = host_python(ImagePython("3.12", downloads=False), "3.11", bucket=True, external_ips=True)
    assert planned.handling is None
    assert planned.warning == (
        "the image has python3.12; the runtime needs 3.11, and these hosts may not download a Python: "
        "setup fails at `uv venv` unless the image has a python3.11 besides"
    )

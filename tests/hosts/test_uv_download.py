"""The pinned uv wheel from PyPI, for a machine that never ran scripts/setup: found through PyPI's simple
index (PEP 691 JSON), checked against the pin, kept in a cache dir that the next run reads; a wheel that
does not match, or an index without it, is refused with the fix. PyPI is respx here, never the network."""

from __future__ import annotations

import hashlib
from pathlib import Path

import httpx
import pytest
import respx

from tpuctl.errors import ConfigError
from tpuctl.hosts.uv_tool import PYPI_SIMPLE_URL, UvWheel, download_wheel, local_wheel

DATA = b"PK\x03\x04 a stand-in for the uv wheel's bytes"
WHEEL = UvWheel(
    filename="uv-0.13.9-py3-none-manylinux_2_17_x86_64.whl", sha256=hashlib.sha256(DATA).hexdigest()
)
FILE_URL = "https://files.pythonhosted.org/packages/ab/cd/" + WHEEL.filename


def index(sha256: str) -> dict[str, object]:
    return {"files": [{"filename": WHEEL.filename, "url": FILE_URL, "hashes": {"sha256": sha256}}]}


@respx.mock
def test_the_wheel_comes_from_pypi_once_checked_and_is_then_read_from_the_cache(tmp_path: Path) -> None:
    listed = respx.get(PYPI_SIMPLE_URL).mock(return_value=httpx.Response(200, json=index(WHEEL.sha256)))
    fetched = respx.get(FILE_URL).mock(return_value=httpx.Response(200, content=DATA))
    cache = tmp_path / "wheels"
    got = local_wheel([tmp_path / "no-wheelhouse", cache], WHEEL, download=lambda w: download_wheel(w, cache))
    assert got == DATA and (cache / WHEEL.filename).read_bytes() == DATA
    assert listed.calls[0].request.headers["Accept"] == "application/vnd.pypi.simple.v1+json"
    # The next run finds it in the cache: nothing asked of PyPI.
    again = local_wheel([cache], WHEEL, download=lambda w: pytest.fail("downloaded twice"))
    assert again == DATA and listed.call_count == 1 and fetched.call_count == 1


@respx.mock
def test_a_wheel_that_is_not_the_pinned_one_is_refused_and_not_kept(tmp_path: Path) -> None:
    respx.get(PYPI_SIMPLE_URL).mock(return_value=httpx.Response(200, json=index(WHEEL.sha256)))
    respx.get(FILE_URL).mock(return_value=httpx.Response(200, content=b"something else"))
    with pytest.raises(ConfigError, match="does not match its pinned sha256"):
        download_wheel(WHEEL, tmp_path / "wheels")
    assert not (tmp_path / "wheels" / WHEEL.filename).exists()
    respx.get(PYPI_SIMPLE_URL).mock(return_value=httpx.Response(200, json=index("0" * 64)))
    with pytest.raises(ConfigError, match=r"lists no uv-0\.13\.9") as info:
        download_wheel(WHEEL, tmp_path / "wheels")
    assert "scripts/setup" in (info.value.fix or "")


@respx.mock
def test_pypi_unreachable_is_a_config_error_with_the_fix(tmp_path: Path) -> None:
    respx.get(PYPI_SIMPLE_URL).mock(side_effect=httpx.ConnectError("no route"))
    with pytest.raises(ConfigError, match="cannot download the uv wheel") as info:
        download_wheel(WHEEL, tmp_path / "wheels")
    assert "network" in (info.value.fix or "")

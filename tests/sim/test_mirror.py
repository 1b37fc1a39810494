"""The package mirror: a find-links page and a PEP 503 simple index over a wheelhouse, files with ranges."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tpuctl.sim.mirror import PackageMirror, project_name
from tpuctl.sim.network import network_env

WHEEL = "Foo_Bar-1.0-py3-none-any.whl"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    (tmp_path / WHEEL).write_bytes(bytes(range(256)) * 4)
    (tmp_path / "baz-2.0.tar.gz").write_bytes(b"sdist")
    (tmp_path / ".tpuctl-primed").write_text("stamp")
    mirror = PackageMirror(tmp_path)
    url = mirror.start()
    assert mirror.start() == url  # idempotent
    yield url, tmp_path
    mirror.stop()


def test_find_links_page_lists_distributions_only(served: tuple[str, Path]) -> None:
    url, _ = served
    assert url.startswith("http://127.0.0.1:") and url.endswith("/")
    page = httpx.get(url).text
    assert f'href="{WHEEL}"' in page and 'href="baz-2.0.tar.gz"' in page
    assert "primed" not in page


def test_files_whole_and_ranged(served: tuple[str, Path]) -> None:
    url, root = served
    data = (root / WHEEL).read_bytes()
    whole = httpx.get(url + WHEEL)
    assert whole.status_code == 200 and whole.content == data
    assert whole.headers["accept-ranges"] == "bytes"
    part = httpx.get(url + WHEEL, headers={"Range": "bytes=10-19"})
    assert part.status_code == 206 and part.content == data[10:20]
    assert part.headers["content-range"] == f"bytes 10-19/{len(data)}"
    tail = httpx.get(url + WHEEL, headers={"Range": "bytes=-8"})
    assert tail.status_code == 206 and tail.content == data[-8:]
    assert httpx.get(url + WHEEL, headers={"Range": f"bytes={len(data)}-"}).status_code == 416
    assert httpx.head(url + WHEEL).headers["content-length"] == str(len(data))


def test_simple_index(served: tuple[str, Path]) -> None:
    url, _ = served
    projects = httpx.get(url + "simple/").text
    assert 'href="foo-bar/"' in projects and 'href="baz/"' in projects
    files = httpx.get(url + "simple/foo-bar/").text
    assert f'href="../../{WHEEL}"' in files
    moved = httpx.get(url + "simple/foo-bar")
    assert moved.status_code == 301 and moved.headers["location"] == "/simple/foo-bar/"
    assert httpx.get(url + "simple/nothing/").status_code == 404


def test_nothing_outside_the_wheelhouse(served: tuple[str, Path]) -> None:
    url, _ = served
    for path in ("..%2fetc%2fpasswd", ".tpuctl-primed", "sub/x.whl", "missing.whl"):
        assert httpx.get(url + path).status_code == 404


def test_stop_closes_the_port(tmp_path: Path) -> None:
    mirror = PackageMirror(tmp_path)
    url = mirror.start()
    mirror.stop()
    with pytest.raises(httpx.ConnectError):
        httpx.get(url)


def test_project_name() -> None:
    assert project_name("orbax_checkpoint-0.12.8-py3-none-any.whl") == "orbax-checkpoint"
    assert project_name("Foo.Bar-1.0.tar.gz") == "foo-bar"


def test_network_env_points_everything_at_the_services() -> None:
    env = network_env(mirror_url="http://127.0.0.1:1/", storage_url="http://127.0.0.1:2/")
    assert env["FSSPEC_GCS_ENDPOINT_URL"] == env["TENSORSTORE_GCS_HTTP_URL"] == "http://127.0.0.1:2"
    assert env["API_ENDPOINT_OVERRIDE"] == "http://127.0.0.1:2" and "STORAGE_EMULATOR_HOST" not in env
    assert env["PIP_FIND_LINKS"] == env["UV_FIND_LINKS"] == "http://127.0.0.1:1/"
    assert env["UV_DEFAULT_INDEX"] == "http://127.0.0.1:1/simple/"
    assert env["PIP_NO_INDEX"] == env["UV_NO_INDEX"] == "1"
    assert env["UV_PYTHON_DOWNLOADS"] == "never"

"""The package mirror's fetch-through: which index the user's pip/uv name, and a project the wheelhouse
lacks served from that index (real wheels from the test wheelhouse scripts/setup primes, behind a static
simple index on loopback), cached, checked against the index's hash, and only while the world says so."""

from __future__ import annotations

import contextlib
import hashlib
import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tpuctl.sim.fetch_through import PYPI_SIMPLE, FetchThrough, configured_index_url
from tpuctl.sim.mirror import PackageMirror
from tpuctl.testing.package_index import TEST_WHEELS, served_index, write_simple_index

#: The smallest real wheel of the test wheelhouse (flax needs it, through rich).
MDURL = next(TEST_WHEELS.glob("mdurl-*.whl"), None)


# --- which index ----------------------------------------------------------------------------------------


def test_with_nothing_configured_it_is_pypi(tmp_path: Path) -> None:
    assert configured_index_url({}, tmp_path) == PYPI_SIMPLE
    # What the test configuration sets: no config file is read at all.
    env = {"PIP_CONFIG_FILE": "/dev/null", "UV_NO_CONFIG": "1", "XDG_CONFIG_HOME": str(tmp_path)}
    (tmp_path / "uv").mkdir()
    (tmp_path / "uv" / "uv.toml").write_text('index-url = "http://uv.example/simple"\n')
    assert configured_index_url(env, tmp_path) == PYPI_SIMPLE


def test_variables_come_first_uv_before_pip(tmp_path: Path) -> None:
    env = {"PIP_INDEX_URL": "http://pip.example/simple", "UV_NO_CONFIG": "1"}
    assert configured_index_url(env, tmp_path) == "http://pip.example/simple/"
    env["UV_INDEX_URL"] = "http://uv-old.example/simple/"
    assert configured_index_url(env, tmp_path) == "http://uv-old.example/simple/"
    env["UV_DEFAULT_INDEX"] = "http://uv.example/simple/"
    assert configured_index_url(env, tmp_path) == "http://uv.example/simple/"


def test_then_uv_toml_then_pip_conf(tmp_path: Path) -> None:
    home = tmp_path / "home"
    pip_conf = tmp_path / "pip.conf"
    pip_conf.write_text("[global]\nindex-url = http://pip.example/simple/\n")
    env = {"XDG_CONFIG_HOME": str(tmp_path / "config"), "PIP_CONFIG_FILE": str(pip_conf)}
    assert configured_index_url(env, home) == "http://pip.example/simple/"
    uv_toml = tmp_path / "config" / "uv" / "uv.toml"
    uv_toml.parent.mkdir(parents=True)
    uv_toml.write_text('[[index]]\nurl = "http://extra.example/simple/"\n\n'
                       '[[index]]\nurl = "http://uv.example/simple/"\ndefault = true\n')  # fmt: skip
    assert configured_index_url(env, home) == "http://uv.example/simple/"
    assert configured_index_url({**env, "UV_NO_CONFIG": "1"}, home) == "http://pip.example/simple/"


# --- fetching through -----------------------------------------------------------------------------------


@pytest.fixture
def upstream(tmp_path: Path) -> Iterator[str]:
    """The user's index: the real mdurl wheel behind a static simple index."""
    if MDURL is None:
        pytest.fail(f"no mdurl wheel in {TEST_WHEELS}: run scripts/setup (it primes the test wheelhouse)")
    wheels = tmp_path / "user-wheels"
    wheels.mkdir()
    shutil.copy(MDURL, wheels)
    root = tmp_path / "index"
    assert write_simple_index(wheels, root) == ["mdurl"]
    with served_index(root) as url:
        yield url


@contextlib.contextmanager
def served_mirror(tmp_path: Path, fetch: FetchThrough) -> Iterator[str]:
    wheelhouse = tmp_path / "wheelhouse"
    wheelhouse.mkdir(exist_ok=True)
    mirror = PackageMirror(wheelhouse, fetch_through=fetch)
    try:
        yield mirror.start()
    finally:
        mirror.stop()


def test_a_project_the_wheelhouse_lacks_is_fetched_once_and_cached(upstream: str, tmp_path: Path) -> None:
    assert MDURL is not None
    cache = tmp_path / "state" / "sim-packages"
    with served_mirror(tmp_path, FetchThrough(upstream, cache, enabled=lambda: True)) as url:
        page = httpx.get(url + "simple/mdurl/")
        digest = hashlib.sha256(MDURL.read_bytes()).hexdigest()
        assert page.status_code == 200
        assert f'href="../../{MDURL.name}#sha256={digest}"' in page.text
        got = httpx.get(url + MDURL.name)
        assert got.status_code == 200 and got.content == MDURL.read_bytes()
        assert (cache / MDURL.name).read_bytes() == MDURL.read_bytes()
        assert httpx.get(url + "simple/not-on-the-index/").status_code == 404
    # The cache outlives the mirror (and serves a ranged read, as uv asks for a wheel's metadata).
    with served_mirror(tmp_path, FetchThrough(upstream, cache, enabled=lambda: True)) as url:
        tail = httpx.get(url + MDURL.name, headers={"Range": "bytes=-16"})
        assert tail.status_code == 206 and tail.content == MDURL.read_bytes()[-16:]


def test_off_the_mirror_serves_its_wheelhouse_alone(upstream: str, tmp_path: Path) -> None:
    assert MDURL is not None
    cache = tmp_path / "cache"
    with served_mirror(tmp_path, FetchThrough(upstream, cache, enabled=lambda: False)) as url:
        assert httpx.get(url + "simple/mdurl/").status_code == 404
        assert httpx.get(url + MDURL.name).status_code == 404
    assert not cache.exists()


def test_a_file_whose_hash_is_not_the_indexs_is_refused(upstream: str, tmp_path: Path) -> None:
    assert MDURL is not None
    cache = tmp_path / "cache"
    with served_mirror(tmp_path, FetchThrough(upstream, cache, enabled=lambda: True)) as url:
        assert httpx.get(url + "simple/mdurl/").status_code == 200
        links = cache / "links" / "mdurl.json"
        links.write_text(links.read_text().replace('"sha256": "', '"sha256": "0'))
        answer = httpx.get(url + MDURL.name)
        assert answer.status_code == 502 and "sha256" in answer.text
        assert not (cache / MDURL.name).exists()


def test_an_unreachable_index_is_a_bad_gateway_naming_it(tmp_path: Path) -> None:
    from tpuctl.testing.ports import unused_port

    dead = f"http://127.0.0.1:{unused_port()}/simple/"
    with served_mirror(tmp_path, FetchThrough(dead, tmp_path / "cache", enabled=lambda: True)) as url:
        answer = httpx.get(url + "simple/flax/")
        assert answer.status_code == 502 and dead in answer.text

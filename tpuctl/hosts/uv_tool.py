"""uv on the hosts, brought by tpuctl: the pinned uv wheel's binary, shipped over SSH, verified, cached.

A host may assume only what a stock image has (a shell, the usual system tools, the image's ``python3``):
no pip, no package index reachable for uv itself. So this machine sends each host the pinned uv wheel
for the host's platform (every Google TPU host and every simulated one is linux x86_64; the wheel is
manylinux2014, which both satisfy) over the SSH session setup already has, as the command's standard
input. The host checks the wheel's sha256 against the pin with ``sha256sum`` before anything of it is
used, takes the ``uv`` binary out of it with the image's ``python3`` (``zipfile``, stdlib) and keeps it at
``<remote_root>/tools/uv-<version>-<sha prefix>/uv``; a host that has it there is sent nothing (one cheap
probe first), so a second run on the same disk skips it.

Over SSH rather than through the run's bucket: the session exists already, it needs no credentials on the
host nor a bucket to exist yet, and it works the same for hosts without external IPs (ProxyCommand).
"""

from __future__ import annotations

import hashlib
import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tpuctl.errors import ConfigError, RunFailedError
from tpuctl.hosts.base import Executor

if TYPE_CHECKING:
    import httpx

UV_VERSION = "0.13.9"


@dataclass(frozen=True)
class UvWheel:
    """One pinned uv wheel: its file name (as PyPI names it) and the sha256 PyPI publishes for it."""

    filename: str
    sha256: str

    @property
    def binary_member(self) -> str:
        """Where the ``uv`` executable is inside the wheel."""
        return f"uv-{UV_VERSION}.data/scripts/uv"


#: The wheel for the hosts' platform: linux x86_64, glibc 2.17 or newer (every TPU VM image).
HOST_WHEEL = UvWheel(
    filename=f"uv-{UV_VERSION}-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
    sha256="d7f459fe4fd247d830351c75686d3996ace3c6f3f728eb0e85a30b7ada0cef19",
)


def host_uv_dir(remote_root: str, wheel: UvWheel = HOST_WHEEL) -> str:
    """The host directory of this uv (relative paths are relative to the login home): keyed by the
    version and the wheel's hash, so a different wheel never reuses another's binary."""
    return f"{remote_root.rstrip('/')}/tools/uv-{UV_VERSION}-{wheel.sha256[:12]}"


def host_uv(remote_root: str, wheel: UvWheel = HOST_WHEEL) -> str:
    """The host path of the uv binary the setup script runs."""
    return f"{host_uv_dir(remote_root, wheel)}/uv"


def local_wheel(
    wheelhouses: Iterable[Path],
    wheel: UvWheel = HOST_WHEEL,
    *,
    download: Callable[[UvWheel], bytes] | None = None,
) -> bytes:
    """The pinned wheel's bytes from the first of ``wheelhouses`` that has it, checked against the pin;
    else from ``download`` (``download_wheel``: a machine that never ran scripts/setup, e.g. tpuctl
    installed from PyPI, driving Google). Raises ConfigError (naming where it looked) when none has it,
    it does not match, or there is no download."""
    looked = []
    for directory in wheelhouses:
        path = directory / wheel.filename
        looked.append(str(directory))
        if not path.is_file():
            continue
        data = path.read_bytes()
        if hashlib.sha256(data).hexdigest() != wheel.sha256:
            raise ConfigError(
                f"{path} is not the pinned uv wheel (its sha256 differs from {wheel.sha256})",
                fix=f"delete it and run scripts/setup, which downloads uv=={UV_VERSION} again",
            )
        return data
    if download is not None:
        return download(wheel)
    raise ConfigError(
        f"the uv wheel the hosts need ({wheel.filename}) is not in {', '.join(looked) or 'any wheelhouse'}",
        fix="run scripts/setup (it keeps the pinned uv wheel in the wheelhouse), or point "
        "TPUCTL_SIM_WHEELHOUSE at a directory that has it",
    )


#: What a host prints when it has the binary already (the probe's answer).
PRESENT = "tpuctl-uv-present"


def _root_line(remote_root: str) -> str:
    return f"root={shlex.quote(remote_root)}; case $root in /*) ;; *) root=$HOME/$root ;; esac"


def probe_command(remote_root: str, wheel: UvWheel = HOST_WHEEL) -> str:
    """A command that prints ``PRESENT`` on a host that has this uv already."""
    relative = host_uv(remote_root, wheel)[len(remote_root.rstrip("/")) :]
    return f'{_root_line(remote_root)}; if [ -x "$root{relative}" ]; then echo {PRESENT}; fi'


def install_command(remote_root: str, wheel: UvWheel = HOST_WHEEL) -> str:
    """A command that reads the wheel from standard input, refuses it unless its sha256 is the pin,
    extracts the binary with the image's python3 and moves it into place last (a host cut off halfway
    keeps no half-written uv)."""
    relative = host_uv_dir(remote_root, wheel)[len(remote_root.rstrip("/")) :]
    extract = (
        "import sys, zipfile; z = zipfile.ZipFile(sys.argv[1]); "
        "open(sys.argv[2], 'wb').write(z.read(sys.argv[3]))"
    )
    return (
        f'{_root_line(remote_root)}; d="$root{relative}"; t="$d.tmp-$$"; rm -rf "$t"; '
        f'{{ mkdir -p "$t" && cat > "$t/uv.whl" '
        f'&& echo "{wheel.sha256}  $t/uv.whl" | sha256sum --check --quiet - '
        f'&& python3 -c {shlex.quote(extract)} "$t/uv.whl" "$t/uv" {shlex.quote(wheel.binary_member)} '
        f'&& chmod 755 "$t/uv" && rm -f "$t/uv.whl" && rm -rf "$d" && mv "$t" "$d"; }} '
        f'|| {{ s=$?; rm -rf "$t"; exit $s; }}'
    )


#: Seconds for the probe, and for sending the wheel (~18 MB) to every host at once and extracting it.
_PROBE_TIMEOUT_S = 60.0
_INSTALL_TIMEOUT_S = 300.0


def bring_uv(
    executor: Executor,
    remote_root: str,
    wheelhouses: Iterable[Path],
    *,
    download: Callable[[UvWheel], bytes] | None = None,
    workers: Iterable[int] | None = None,
) -> int:
    """Make this uv present on ``workers`` of ``executor`` (all its hosts by default): probe them, send the
    wheel to those that lack it (``local_wheel``); returns how many were sent it. Raises RunFailedError
    naming the first host that failed."""
    probes = executor.run_command(
        probe_command(remote_root),
        on_line=lambda w, t: None,
        timeout_s=_PROBE_TIMEOUT_S,
        workers=None if workers is None else list(workers),
    )
    lacking = sorted(w for w, r in probes.items() if not any(PRESENT in line for line in r.tail))
    if not lacking:
        return 0
    wheel = local_wheel(wheelhouses, download=download)
    results = executor.run_command(
        install_command(remote_root),
        on_line=lambda w, t: None,
        timeout_s=_INSTALL_TIMEOUT_S,
        workers=lacking,
        stdin=wheel,
    )
    failed = sorted(w for w, r in results.items() if r.exit_status != 0)
    if failed:
        result = results[failed[0]]
        tail = " / ".join(result.tail[-3:])
        raise RunFailedError(
            f"bringing uv to host {failed[0]} failed (exit {result.exit_status}): {tail}",
            worker=failed[0],
            fix="check the host's free disk space and that its image has sha256sum and python3",
        )
    return len(lacking)


#: PyPI's simple index, JSON form (PEP 691): each file's name, URL and sha256.
PYPI_SIMPLE_URL = "https://pypi.org/simple/uv/"
_PYPI_JSON = "application/vnd.pypi.simple.v1+json"


def download_wheel(wheel: UvWheel, cache_dir: Path, *, client: httpx.Client | None = None) -> bytes:
    """The pinned wheel from PyPI (found through its simple index, PEP 691), checked against the pin
    and kept in ``cache_dir`` by atomic rename (the next run reads it from there: it is one of the
    wheelhouses the caller gives ``local_wheel``). ConfigError naming the index and the fix when it
    cannot be had."""
    import httpx

    from tpuctl.store.paths import atomic_write_bytes, ensure_private_dir

    own = client is None
    http = client or httpx.Client(timeout=60.0, follow_redirects=True)
    try:
        index = http.get(PYPI_SIMPLE_URL, headers={"Accept": _PYPI_JSON})
        index.raise_for_status()
        files = [f for f in index.json().get("files", []) if f.get("filename") == wheel.filename]
        if not files or (files[0].get("hashes") or {}).get("sha256") != wheel.sha256:
            raise ConfigError(
                f"PyPI's index ({PYPI_SIMPLE_URL}) lists no {wheel.filename} with sha256 {wheel.sha256}",
                fix="run scripts/setup on this machine (it keeps the pinned uv wheel), or set "
                "TPUCTL_SIM_WHEELHOUSE to a directory that has it",
            )
        data = http.get(str(files[0]["url"])).raise_for_status().content
    except httpx.HTTPError as exc:
        raise ConfigError(
            f"cannot download the uv wheel the hosts need from PyPI ({exc})",
            fix="check this machine's network, or run scripts/setup (it keeps the pinned uv wheel), or set "
            "TPUCTL_SIM_WHEELHOUSE to a directory that has it",
        ) from None
    finally:
        if own:
            http.close()
    if hashlib.sha256(data).hexdigest() != wheel.sha256:
        raise ConfigError(
            f"the {wheel.filename} PyPI served does not match its pinned sha256 {wheel.sha256}",
            fix="try again; if it persists, run scripts/setup and point TPUCTL_SIM_WHEELHOUSE at its wheels",
        )
    atomic_write_bytes(ensure_private_dir(cache_dir) / wheel.filename, data)
    return data

"""A VM's disk (home directories, SSH host key) and the stock image every VM boots from.

The image, ``<vm_root>/image``, is a venv of the simulator's base interpreter with nothing installed, not
even pip, and no system site-packages: what a fresh VM's ``python3`` offers a program. Google's TPU API
images ship pip, but whether Compute Engine's accelerator images do is unconfirmed, so every simulated
host has none (stricter than Google where unsure). Its system tools are this machine's, less its Python
tooling: ``<image>/system-bin`` links every command of /usr/local/bin, /usr/bin and /bin except pip, uv
and other Python interpreters and installers (``PYTHON_TOOLING``), and the hosts' PATH has that
directory instead of the system ones, so a host finds only what a stock image has.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import venv
from pathlib import Path

import asyncssh

from tpuctl.sim.vms.layout import host_key_path
from tpuctl.sim.vms.systemctl import install_shims

#: Login shells read /etc/profile, which resets PATH (Debian's does): the skeleton .profile puts the
#: image's python3 and the user's ~/.local/bin first again, as a TPU VM image's .profile does for
#: ~/.local/bin.
_PROFILE = """# ~/.profile: the simulated TPU VM's login environment.
PATH="{path}"
export PATH
"""

#: The system directories whose commands a host gets (first one wins a name), as a stock image has them.
SYSTEM_DIRS = (Path("/usr/local/bin"), Path("/usr/bin"), Path("/bin"))
#: The commands of this machine a host must not see: Python interpreters other than the image's, and
#: Python package tooling (pip, uv, pipx, virtualenv, ...), which a stock image does not have.
PYTHON_TOOLING = re.compile(
    r"^(pip.*|uv|uvx|python.*|pydoc.*|idle.*|2to3.*|easy_install.*|virtualenv|pipx|poetry|pdm|hatch|"
    r"conda|mamba|micromamba|ruff|mypy|pytest|py\.test|tox|nox|wheel|f2py.*)$"
)


def host_path(image: Path, home: str) -> str:
    """The hosts' PATH: the image's python3 first, then the user's ~/.local/bin and the system tools."""
    return f"{image}/bin:{home}/.local/bin:{image}/system-bin"


def create_disk(disk: Path) -> None:
    """Make the disk with its SSH host key (ed25519, in ``<disk>/etc/ssh/``), unless it exists."""
    if host_key_path(disk).with_suffix(".pub").exists():
        return
    tmp = disk.with_name(disk.name + f".new-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    key_file = host_key_path(tmp)
    key_file.parent.mkdir(parents=True)
    (tmp / "home").mkdir()
    key = asyncssh.generate_private_key("ssh-ed25519")
    key.write_private_key(str(key_file))
    os.chmod(key_file, 0o600)
    key.write_public_key(str(key_file.with_suffix(".pub")))
    try:
        os.rename(tmp, disk)
    except OSError:
        # Another process of this simulator made it first: theirs stands.
        shutil.rmtree(tmp, ignore_errors=True)


def home_dir(disk: Path, user: str, image: Path) -> Path:
    """The user's home on this disk, created at first login (as the guest agent creates the account)."""
    home = disk / "home" / user
    if not home.exists():
        home.mkdir(parents=True, exist_ok=True)
        (home / ".profile").write_text(_PROFILE.format(path=host_path(image, "$HOME")))
    return home


def image_dir(vm_root: Path) -> Path:
    return vm_root / "image"


def ensure_image(vm_root: Path) -> Path:
    """Build ``<vm_root>/image`` unless it is there; returns it. Safe in several processes at once."""
    image = image_dir(vm_root)
    if (image / ".complete").exists():
        return image
    tmp = vm_root / f"image.new-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    vm_root.mkdir(parents=True, exist_ok=True)
    venv.EnvBuilder(with_pip=False, system_site_packages=False, symlinks=True).create(tmp)
    _link_system_tools(tmp / "system-bin")
    # Before system-bin on PATH: the user manager's commands, served by the systemd stand-in.
    install_shims(tmp / "bin", sys.executable)
    (tmp / ".complete").write_text("")
    try:
        os.rename(tmp, image)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return image


def _link_system_tools(target: Path) -> None:
    """Link each command of ``SYSTEM_DIRS`` into ``target``, less ``PYTHON_TOOLING``."""
    target.mkdir()
    for directory in SYSTEM_DIRS:
        if not directory.is_dir():
            continue
        for entry in directory.iterdir():
            link = target / entry.name
            if PYTHON_TOOLING.match(entry.name) or link.exists() or link.is_symlink():
                continue
            link.symlink_to(entry)

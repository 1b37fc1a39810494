"""A VM's disk (home directories, SSH host key) and the stock image every VM boots from.

The image, ``<vm_root>/image``, is a venv of the simulator's base interpreter with pip (from ensurepip)
and nothing else, no system site-packages: what a fresh TPU VM's ``python3`` offers a program. The pip
of a template venv, built once per interpreter in the temp dir, is hard-linked into each image so that a
new simulator state does not run ensurepip again.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import venv
from pathlib import Path

import asyncssh

from tpuctl.sim.vms.layout import host_key_path

#: Login shells read /etc/profile, which resets PATH (Debian's does): the skeleton .profile puts the
#: image's python3 and the user's ~/.local/bin first again, as a TPU VM image's .profile does for
#: ~/.local/bin.
_PROFILE = """# ~/.profile: the simulated TPU VM's login environment.
PATH="{image}/bin:$HOME/.local/bin:/usr/local/bin:/usr/bin:/bin"
export PATH
"""


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
        (home / ".profile").write_text(_PROFILE.format(image=image))
    return home


def image_dir(vm_root: Path) -> Path:
    return vm_root / "image"


def ensure_image(vm_root: Path) -> Path:
    """Build ``<vm_root>/image`` unless it is there; returns it. Safe in several processes at once."""
    image = image_dir(vm_root)
    if (image / ".complete").exists():
        return image
    template = _ensure_template()
    tmp = vm_root / f"image.new-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    vm_root.mkdir(parents=True, exist_ok=True)
    venv.EnvBuilder(with_pip=False, system_site_packages=False, symlinks=True).create(tmp)
    site = _site_packages(tmp)
    for entry in _site_packages(template).iterdir():
        if entry.name.startswith("pip"):
            shutil.copytree(entry, site / entry.name, copy_function=_link_or_copy)
    (tmp / ".complete").write_text("")
    try:
        os.rename(tmp, image)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return image


def _ensure_template() -> Path:
    base = getattr(sys, "_base_executable", sys.executable)
    digest = hashlib.sha256(f"{base}:{sys.version}".encode()).hexdigest()[:12]
    template = Path(tempfile.gettempdir()) / f"tpuctl-sim-image-template-{digest}"
    if (template / ".complete").exists():
        return template
    remove_abandoned_builds(template)
    tmp = template.with_name(template.name + f".new-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    venv.EnvBuilder(with_pip=False, system_site_packages=False, symlinks=True).create(tmp)
    subprocess.run(
        [str(tmp / "bin" / "python3"), "-m", "ensurepip", "--default-pip"],
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    (tmp / ".complete").write_text("")
    try:
        os.rename(tmp, template)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
    return template


def remove_abandoned_builds(template: Path) -> None:
    """Remove the half-built templates (``<template>.new-<pid>``, ~26 MB each) of processes that died
    while building: nothing else would, and they are in the shared temp dir. A live builder's is left."""
    for partial in template.parent.glob(f"{template.name}.new-*"):
        pid = partial.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            shutil.rmtree(partial, ignore_errors=True)


def _site_packages(env: Path) -> Path:
    return next((env / "lib").glob("python3*/site-packages"))


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        with contextlib.suppress(OSError):
            shutil.copy2(src, dst)

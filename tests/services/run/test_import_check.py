"""The import check before a slice is made: what a program imports at start-up (followed into its local
modules), mapped against what the run's environment will hold through the wheels' own metadata."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from tpuctl.backends.sim import mirror_limit
from tpuctl.errors import EXIT_USAGE, UsageError
from tpuctl.hosts.bundle import build_bundle
from tpuctl.hosts.setup import SetupSpec
from tpuctl.services.run.import_check import (
    ImportCheck,
    ImportFinding,
    check_imports,
    installed_by,
    startup_imports,
)

RUNTIME = SetupSpec(runtime="cpu")


def project(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def wheel(house: Path, name: str, *, top_level: str | None = None, files: tuple[str, ...] = (),
          requires: tuple[str, ...] = ()) -> None:  # fmt: skip
    """A wheel with only what the check reads: METADATA (Requires-Dist), top_level.txt if given, files."""
    house.mkdir(parents=True, exist_ok=True)
    info = f"{name}-1.0.dist-info"
    with zipfile.ZipFile(house / f"{name}-1.0-py3-none-any.whl", "w") as archive:
        meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n"
        archive.writestr(f"{info}/METADATA", meta + "".join(f"Requires-Dist: {r}\n" for r in requires))
        if top_level is not None:
            archive.writestr(f"{info}/top_level.txt", top_level)
        for path in files:
            archive.writestr(path, "")


def check(workdir: Path, script: str = "train.py", setup: SetupSpec = RUNTIME,
          wheelhouse: Path | None = None, python: str | None = None) -> ImportCheck:  # fmt: skip
    return check_imports(build_bundle(workdir), script, setup, python=python, wheelhouse=wheelhouse)


def test_a_module_nothing_provides_is_refused_naming_it_where_and_the_fix(tmp_path: Path) -> None:
    work = project(tmp_path / "w", {
        "train.py": "import os, json\nimport jax\nfrom optax import adam\nimport orbax.checkpoint\n"
                    "import helpers\nimport wandb_nope\n",
        "helpers.py": "import numpy as np\nimport tokenizer_nope.fast\n",
    })  # fmt: skip
    result = check(work)
    assert [(f.module, f.where) for f in result.missing] == [
        ("tokenizer_nope", "helpers.py:2"),
        ("wandb_nope", "train.py:6"),
    ]
    assert result.unsure == ()
    with pytest.raises(UsageError) as info:
        result.refuse()
    error = info.value
    assert error.exit_code == EXIT_USAGE and error.value == "tokenizer_nope"
    assert "the program imports tokenizer_nope, wandb_nope, which nothing in the run's environment" in (
        error.message
    )
    assert "imported at helpers.py:2" in error.message
    assert "--requirements" in (error.fix or "") and "--no-import-check" in (error.fix or "")


def test_only_imports_that_run_at_start_up_count() -> None:
    source = """
from __future__ import annotations
from typing import TYPE_CHECKING
import needed
if TYPE_CHECKING:
    import only_for_types
try:
    import optional_fast
except ImportError:
    optional_fast = None
try:
    import guarded_too
except (ValueError, ModuleNotFoundError):
    pass
def later():
    import inside_function
class Model:
    import in_class_body
if True:
    from pkg import sub
"""
    names = {name for name, _line, _level in startup_imports(source)}
    assert names == {"__future__", "__future__.annotations", "typing", "typing.TYPE_CHECKING", "needed",
                     "in_class_body", "pkg", "pkg.sub"}  # fmt: skip
    assert startup_imports("def broken(:\n") == []  # Python on the host reports the syntax error


def test_local_modules_are_followed_through_packages_and_relative_imports(tmp_path: Path) -> None:
    work = project(tmp_path / "w", {
        "src/train.py": "import model\nimport common.util\n",
        "src/model/__init__.py": "from .layers import dense\n",
        "src/model/layers.py": "from ..model import missing_sibling_is_fine\nimport flax_nope\n",
        "common/__init__.py": "",
        "common/util.py": "import yaml_nope\n",
        "tests/test_x.py": "import pytest_nope\n",  # not imported by the program: not checked
        "data/weights.bin": "x",
    })  # fmt: skip
    result = check(work, "src/train.py")
    assert [(f.module, f.where) for f in result.missing] == [
        ("flax_nope", "src/model/layers.py:2"),
        ("yaml_nope", "common/util.py:1"),
    ]


def test_requirements_map_through_their_wheels_and_what_those_require(tmp_path: Path) -> None:
    house = tmp_path / "wheels"
    wheel(house, "Pillow", top_level="PIL\n", requires=("olefile", "defusedxml ; extra == 'xmp'"))
    wheel(house, "olefile", files=("olefile/__init__.py", "olefile-1.0.dist-info/RECORD"))
    wheel(house, "defusedxml", top_level="defusedxml\n")
    wheel(house, "fast_ext", files=("_fastext.cpython-311-x86_64-linux-gnu.so",))
    work = project(tmp_path / "w", {
        "train.py": "import PIL\nimport olefile\nimport defusedxml\nimport _fastext\n",
    })  # fmt: skip
    reqs = "# ours\nPillow>=10 ; python_version >= '3.9'\nfast-ext==1.0 --hash=sha256:00\n"
    result = check(work, setup=SetupSpec(runtime=None, requirements=reqs), wheelhouse=house)
    # PIL (top_level.txt), olefile (Pillow's requirement, from its RECORD), _fastext (an extension module)
    # are there; defusedxml comes only with Pillow's "xmp" extra, not asked for.
    assert [f.module for f in result.missing] == ["defusedxml"]
    extra = check(
        work, setup=SetupSpec(runtime=None, requirements="pillow[XMP]\nfast_ext\n"), wheelhouse=house
    )
    assert extra.missing == () and extra.unsure == ()


def test_what_cannot_be_told_is_a_warning_never_a_refusal(tmp_path: Path) -> None:
    work = project(tmp_path / "w", {"train.py": "import odd_dist\nimport oddmodule\n"})
    house = tmp_path / "empty-wheelhouse"
    # A distribution with no metadata anywhere here: its own name's module is taken as there, and any
    # other module may come from it.
    unmapped = check(work, setup=SetupSpec(runtime=None, requirements="odd-dist==1\n"), wheelhouse=house)
    assert unmapped.missing == ()
    [warning] = unmapped.warnings()
    assert warning == ("cannot tell whether the hosts will have oddmodule (imported at train.py:2): no "
                       "metadata here for odd-dist, which may provide it")  # fmt: skip
    # A --setup command may install anything; a requirement tpuctl cannot read; no environment at all; an
    # interpreter of the user's own.
    for setup, python, why in [
        (
            SetupSpec(runtime="cpu", commands=("pip install oddmodule",)),
            None,
            "a --setup command may install",
        ),
        (SetupSpec(runtime="cpu", requirements="-r more.txt\n"), None, "'-r more.txt' names no distribution"),
        (SetupSpec(runtime=None), None, "the hosts use their image's python3"),
        (RUNTIME, "/opt/py/bin/python", "the hosts run /opt/py/bin/python"),
    ]:
        result = check(work, setup=setup, wheelhouse=house, python=python)
        assert result.missing == (), setup
        assert [f.module for f in result.unsure] == ["odd_dist", "oddmodule"], setup
        assert why in result.warnings()[0], (setup, result.warnings())


def test_a_script_of_the_standard_library_and_tpuctls_runtime_needs_nothing(tmp_path: Path) -> None:
    work = project(tmp_path / "w", {
        "train.py": "import os, sys, asyncio.subprocess\nfrom tpuctl.runtime import preemption\nimport cfg\n",
        "cfg.py": "import tomllib\nfrom .. import above_the_root\n",
    })  # fmt: skip
    assert check(work, setup=SetupSpec(runtime=None)) == ImportCheck()


# --- what the hosts' package index can serve ------------------------------------------------------------


def test_where_the_index_serves_its_wheelhouse_alone_a_distribution_it_lacks_is_refused_first(
    tmp_path: Path,
) -> None:
    house = tmp_path / "house"
    wheel(house, "Foo_Bar", top_level="foo_bar\n")
    (house / "baz-2.0.tar.gz").write_bytes(b"sdist")
    work = project(tmp_path / "w", {"train.py": "import foo_bar\nimport nope_module\n"})
    setup = SetupSpec(runtime=None, requirements="foo-bar>=1\nflax[all]==0.12 ; python_version>'3'\n",
                      commands=("uv pip install baz wandb && echo done",))  # fmt: skip
    result = check_imports(build_bundle(work), "train.py", setup, python=None, wheelhouse=house,
                           wheelhouse_only=mirror_limit())  # fmt: skip
    assert result.unavailable is not None
    assert result.unavailable.names == ("flax", "wandb")
    assert result.unavailable.available == ("baz", "foo-bar")
    with pytest.raises(UsageError) as info:
        result.refuse()
    error = info.value
    assert error.exit_code == EXIT_USAGE and error.value == "flax"
    assert (
        "has no flax, wandb" in error.message
        and "the simulator's package mirror serves only" in error.message
        and "2 projects of its wheelhouse" in error.message
    )
    assert "(baz, foo-bar;" in error.message and f"`ls {house}`" in error.message
    assert "package_fetch_through: true" in (error.fix or "") and "TPUCTL_SIM_WORLD" in (error.fix or "")
    # The index fetches through (or is Google's): only the imports are checked.
    through = check_imports(build_bundle(work), "train.py", setup, python=None, wheelhouse=house)
    assert through.unavailable is None


def test_a_module_tpuctl_ships_is_not_followed_but_its_requirements_are_checked(tmp_path: Path) -> None:
    house = tmp_path / "house"
    wheel(house, "zipp")
    setup = SetupSpec(runtime=None, requirements="flax\n")
    work = project(tmp_path / "w", {"train.py": "import nope\n"})
    result = check_imports(
        build_bundle(work), None, setup, python=None, wheelhouse=house, wheelhouse_only=mirror_limit()
    )
    assert result.missing == () and result.unavailable is not None and result.unavailable.names == ("flax",)


@pytest.mark.parametrize(
    ("command", "names"),
    [
        ("uv pip install wandb", ["wandb"]),
        ("python3 -m pip install 'tokenizers>=0.1' rich[jupyter]", ["tokenizers", "rich"]),
        ("pip install a && pip install b", ["a", "b"]),
        ("uv pip install -r extra.txt", []),  # a file, or options: not told from here
        ("uv pip install --index-url http://x/simple y", []),
        ("uv pip install ./local_pkg dist/x-1.0-py3-none-any.whl", []),
        ("echo pip install x", []),
        ("cd data; pip3 install x", ["x"]),
        ("make data", []),
    ],
)
def test_the_distributions_a_plain_install_command_names(command: str, names: list[str]) -> None:
    assert installed_by(command) == names


def test_the_setup_fix_is_offered_only_where_the_run_has_an_environment() -> None:
    """Without an environment (no runtime, no requirements) the hosts get no uv and no venv: a
    ``--setup 'uv pip install ...'`` there fails with ``uv: command not found``, so it is not offered."""
    missing = (ImportFinding("nope_module", "train.py:1"),)
    for has_env in (True, False):
        with pytest.raises(UsageError) as info:
            ImportCheck(missing, has_env=has_env).refuse()
        assert "--requirements" in (info.value.fix or "")
        assert ("--setup 'uv pip install" in (info.value.fix or "")) is has_env

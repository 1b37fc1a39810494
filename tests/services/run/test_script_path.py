"""Where a SCRIPT run's program is: the one check a local run and a server's client share."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpuctl.errors import UsageError
from tpuctl.services.run.script_path import script_path


def test_a_script_is_found_in_its_own_directory_or_the_workdir_given(tmp_path: Path) -> None:
    script = tmp_path / "proj" / "src" / "train.py"
    script.parent.mkdir(parents=True)
    script.write_text("print(1)\n")
    alone = script_path(str(script), None)
    assert (alone.script, alone.workdir, alone.in_workdir) == (script, script.parent, "train.py")
    wider = script_path(str(script), str(tmp_path / "proj"))
    assert (wider.workdir, wider.in_workdir) == (tmp_path / "proj", "src/train.py")


@pytest.mark.parametrize(
    ("script", "workdir", "field", "said"),
    [
        ("missing.py", None, "SCRIPT", "does not exist"),
        ("proj", None, "SCRIPT", "(it is a directory)"),
        ("proj/train.py", "nowhere", "workdir", "does not exist or is not a directory"),
        ("proj/train.py", "other", "workdir", "is outside the working directory"),
    ],
)
def test_each_bad_path_is_exit_2_naming_it(
    tmp_path: Path, script: str, workdir: str | None, field: str, said: str
) -> None:
    (tmp_path / "proj").mkdir()
    (tmp_path / "other").mkdir()
    (tmp_path / "proj" / "train.py").write_text("print(1)\n")
    with pytest.raises(UsageError) as caught:
        script_path(str(tmp_path / script), None if workdir is None else str(tmp_path / workdir))
    assert caught.value.exit_code == 2 and said in caught.value.message
    assert caught.value.to_dict()["field"] == field

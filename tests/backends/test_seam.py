"""The backend seam holds across the package: outside ``tpuctl/backends`` no module tests a backend's
name. What differs between backends (clients, tuning, the CLI's marker) is something a backend supplies;
a comparison with ``"sim"`` or ``"gcp"`` anywhere else is a branch the seam should have made."""

from __future__ import annotations

import ast
import textwrap
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "tpuctl"
BACKENDS = PACKAGE / "backends"
BACKEND_NAMES = frozenset({"sim", "gcp"})


def _names_in(node: ast.AST) -> set[str]:
    """The backend names a literal operand spells: ``"sim"``, or one inside a tuple, list or set."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value} & BACKEND_NAMES
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return set().union(*(_names_in(element) for element in node.elts)) if node.elts else set()
    return set()


def _pattern_names(pattern: ast.pattern) -> set[str]:
    """The backend names a ``case`` pattern matches: ``case "sim":`` or ``case "sim" | "gcp":``."""
    if isinstance(pattern, ast.MatchValue):
        return _names_in(pattern.value)
    if isinstance(pattern, ast.MatchOr):
        return set().union(*(_pattern_names(p) for p in pattern.patterns))
    if isinstance(pattern, ast.MatchAs) and pattern.pattern is not None:
        return _pattern_names(pattern.pattern)
    return set()


def name_tests(source: str) -> Iterator[tuple[int, str]]:
    """(line, what) of every test of a backend's name in ``source``: a comparison (``==``, ``!=``,
    ``in``, ``not in``, ``is``) with ``"sim"`` or ``"gcp"``, a ``case`` on one, or ``startswith`` one."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            names = set().union(*(_names_in(operand) for operand in (node.left, *node.comparators)))
            if names:
                yield node.lineno, f"compares with {sorted(names)}"
        elif isinstance(node, ast.match_case):
            names = _pattern_names(node.pattern)
            if names:
                yield node.pattern.lineno, f"matches {sorted(names)}"
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in {"startswith", "endswith"}
            and any(_names_in(arg) for arg in node.args)
        ):
            names = set().union(*(_names_in(arg) for arg in node.args))
            yield node.lineno, f"{node.func.attr}({sorted(names)})"


def _modules_outside_backends() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if BACKENDS not in p.parents)


def test_the_checker_catches_each_way_of_testing_a_name() -> None:
    example = textwrap.dedent(
        """
        if backend == "sim":
            pass
        ok = "gcp" != name
        fast = kind in ("sim", "other")
        match name:
            case "local":
                pass
            case "gcp" | "aws":
                pass
        simulated = label.startswith("sim")
        shown = {"backend": "sim"}
        same = backend == other
        """
    )
    assert sorted(line for line, _ in name_tests(example)) == [2, 4, 5, 9, 11]


def test_the_walk_covers_the_package() -> None:
    # A walk over nothing would pass anything; the modules that used to branch are in it.
    paths = {p.relative_to(PACKAGE).as_posix() for p in _modules_outside_backends()}
    assert {"cloud/tpu_api.py", "cloud/compute.py", "cli/render.py", "cli/context.py"} <= paths
    assert not any(path.startswith("backends/") for path in paths)


def test_no_module_outside_backends_tests_a_backend_name() -> None:
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line} {what}"
        for path in _modules_outside_backends()
        for line, what in name_tests(path.read_text(encoding="utf-8"))
    ]
    assert not found, "ask the backend (tpuctl.backends) for what differs instead:\n" + "\n".join(found)

"""The backend seam holds: nothing in ``tpuctl/services`` imports the simulator or asks which backend it
runs on. What differs between backends is asked of ``session.backend`` (``tpuctl.backends``)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

SERVICES = Path(__file__).resolve().parents[2] / "tpuctl" / "services"
BACKEND_NAMES = frozenset({"sim", "gcp"})


def _modules() -> list[Path]:
    return sorted(SERVICES.rglob("*.py"))


def _imported(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """Every module an import statement names, lazy (inside functions) and TYPE_CHECKING ones too."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.lineno, node.module
            for alias in node.names:
                yield node.lineno, f"{node.module}.{alias.name}"


def _backend_tests(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """Comparisons with a backend's name, and uses of the settings' backend choice."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            for operand in operands:
                names = _string_constants(operand)
                if names & BACKEND_NAMES:
                    yield node.lineno, f"compares with {sorted(names & BACKEND_NAMES)}"
        elif isinstance(node, ast.Attribute) and node.attr in {"resolved_backend", "SIM", "GCP"}:
            yield node.lineno, f"reads .{node.attr}"


def _string_constants(node: ast.AST) -> set[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
    return set()


def _imports_of(path: Path, *packages: str) -> list[str]:
    """Where ``path`` imports any of ``packages`` (or a module below one), as ``file:line imports name``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return [
        f"{path.name}:{line} imports {name}"
        for line, name in _imported(tree)
        if any(name == package or name.startswith(package + ".") for package in packages)
    ]


def test_services_exist() -> None:
    # A walk over nothing would pass anything.
    assert len(_modules()) > 10


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(SERVICES)))
def test_services_import_nothing_from_the_simulator(path: Path) -> None:
    found = _imports_of(path, "tpuctl.sim")
    assert not found, "services must reach the simulator only through tpuctl.backends:\n" + "\n".join(found)


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(SERVICES)))
def test_services_never_ask_which_backend_they_run_on(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = [f"{path.name}:{line} {what}" for line, what in _backend_tests(tree)]
    assert not found, "ask session.backend (tpuctl.backends) instead:\n" + "\n".join(found)


def test_the_checks_catch_what_they_look_for() -> None:
    # The walkers themselves: each violation below must be seen.
    source = (
        "from tpuctl.sim import SimAdminClient\n"
        "import tpuctl.sim.world\n"
        "def f(session):\n"
        "    from tpuctl import sim\n"
        "    if session.cloud.backend == 'sim': pass\n"
        "    if kind in ('gcp', 'x'): pass\n"
        "    return session.settings.resolved_backend\n"
    )
    tree = ast.parse(source)
    imports = [name for _, name in _imported(tree)]
    assert "tpuctl.sim" in imports and "tpuctl.sim.world" in imports and "tpuctl.sim" in imports
    assert len(list(_backend_tests(tree))) == 3


PACKAGE = SERVICES.parent
#: Imports point down only: each layer below the services, and what it may never import.
LOWER_LAYERS = ("backends", "hosts", "cloud", "sim", "store", "catalog")
UPPER = ("tpuctl.services", "tpuctl.cli")


def _lower_modules() -> list[Path]:
    return sorted(p for layer in LOWER_LAYERS for p in (PACKAGE / layer).rglob("*.py"))


@pytest.mark.parametrize("path", _lower_modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_lower_layers_import_neither_services_nor_the_cli(path: Path) -> None:
    found = _imports_of(path, *UPPER)
    assert not found, "imports point down only (docs/architecture.md, Layers):\n" + "\n".join(found)


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(SERVICES)))
def test_services_import_nothing_from_the_cli(path: Path) -> None:
    found = _imports_of(path, "tpuctl.cli")
    assert not found, "services know nothing of the CLI:\n" + "\n".join(found)

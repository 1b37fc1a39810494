"""No import circle among the ``tpuctl.services.run`` modules. An import inside a function still makes an
edge: it hides a circle from the interpreter at start-up, not from the reader, and a module that needs its
caller back is two ideas tangled. Imports under ``if TYPE_CHECKING:`` are left out (annotations only:
they never run)."""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping
from pathlib import Path

PACKAGE = "tpuctl.services.run"
PACKAGE_DIR = Path(__file__).resolve().parents[3] / "tpuctl" / "services" / "run"

Graph = Mapping[str, frozenset[str]]


def _is_type_checking(test: ast.expr) -> bool:
    """``if TYPE_CHECKING:`` or ``if typing.TYPE_CHECKING:``."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _runtime_nodes(node: ast.AST) -> Iterator[ast.AST]:
    """Every node below ``node`` that can run: all but the bodies of ``if TYPE_CHECKING:`` blocks (their
    ``else`` runs, so it stays)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for other in child.orelse:
                yield other
                yield from _runtime_nodes(other)
            continue
        yield child
        yield from _runtime_nodes(child)


def _resolve(module: str, node: ast.ImportFrom) -> str:
    """The absolute module an ``ImportFrom`` names (relative imports resolved against ``module``)."""
    if node.level == 0:
        return node.module or ""
    base = module.split(".")[: -node.level]
    return ".".join([*base, node.module] if node.module else base)


def imported_modules(module: str, source: str, known: frozenset[str]) -> frozenset[str]:
    """The modules of ``known`` that ``module`` (whose text is ``source``) imports when it runs, at module
    level or inside a function; ``from PACKAGE import name`` counts when ``PACKAGE.name`` is a module."""
    found: set[str] = set()
    for node in _runtime_nodes(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, node)
            names = [target, *(f"{target}.{alias.name}" for alias in node.names)]
        found.update(name for name in names if name in known)
    found.discard(module)
    return frozenset(found)


def package_graph() -> dict[str, frozenset[str]]:
    """Module -> the package's modules it imports, for every module of ``tpuctl.services.run``."""
    paths = {f"{PACKAGE}.{p.stem}" if p.stem != "__init__" else PACKAGE: p for p in PACKAGE_DIR.glob("*.py")}
    known = frozenset(paths)
    return {
        module: imported_modules(module, path.read_text(encoding="utf-8"), known)
        for module, path in sorted(paths.items())
    }


def find_cycle(graph: Graph) -> list[str] | None:
    """One import circle of ``graph`` as the modules along it, the first repeated at the end
    (``[a, b, a]``), or None when there is none. Depth-first, in sorted order, so the answer is stable."""
    done: set[str] = set()
    path: list[str] = []
    on_path: set[str] = set()

    def visit(module: str) -> list[str] | None:
        path.append(module)
        on_path.add(module)
        for target in sorted(graph.get(module, frozenset())):
            if target in on_path:
                return [*path[path.index(target) :], target]
            if target not in done:
                cycle = visit(target)
                if cycle is not None:
                    return cycle
        path.pop()
        on_path.discard(module)
        done.add(module)
        return None

    for start in sorted(graph):
        if start not in done:
            cycle = visit(start)
            if cycle is not None:
                return cycle
    return None


def test_the_run_package_has_no_import_circle() -> None:
    graph = package_graph()
    # A walk over nothing would pass anything: the package's modules were found and their imports read.
    assert len(graph) > 15 and f"{PACKAGE}.supervisor" in graph
    assert f"{PACKAGE}.launcher" in graph[f"{PACKAGE}.supervisor"]
    cycle = find_cycle(graph)
    assert cycle is None, "import circle: " + " -> ".join(m.removeprefix(PACKAGE + ".") for m in cycle)


# --- the cycle finder and the import reader themselves --------------------------------------------------


def test_find_cycle_finds_a_two_module_circle_and_names_it_in_order() -> None:
    graph = {"a": frozenset({"b"}), "b": frozenset({"a"}), "c": frozenset()}
    assert find_cycle(graph) == ["a", "b", "a"]


def test_find_cycle_finds_a_longer_circle_behind_a_clean_branch() -> None:
    graph = {
        "a": frozenset({"b", "x"}),
        "b": frozenset({"c"}),
        "c": frozenset({"d"}),
        "d": frozenset({"b"}),
        "x": frozenset(),
    }
    assert find_cycle(graph) == ["b", "c", "d", "b"]


def test_find_cycle_passes_a_diamond() -> None:
    # Two ways to one module is no circle.
    graph = {"a": frozenset({"b", "c"}), "b": frozenset({"d"}), "c": frozenset({"d"}), "d": frozenset()}
    assert find_cycle(graph) is None


def test_find_cycle_finds_a_module_importing_itself() -> None:
    assert find_cycle({"a": frozenset({"a"})}) == ["a", "a"]


KNOWN = frozenset({"p.a", "p.b", "p.c", "p.d", "p.e"})


def test_imports_inside_functions_count_and_type_checking_ones_do_not() -> None:
    source = """
from __future__ import annotations
from typing import TYPE_CHECKING
from p import b
import os
if TYPE_CHECKING:
    from p.c import Thing
else:
    from p import e

def later() -> None:
    from p.d import helper
"""
    assert imported_modules("p.a", source, KNOWN) == frozenset({"p.b", "p.d", "p.e"})


def test_relative_imports_are_resolved_against_the_package() -> None:
    source = "from . import b\nfrom .c import thing\n"
    assert imported_modules("p.a", source, KNOWN) == frozenset({"p.b", "p.c"})

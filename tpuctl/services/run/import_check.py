"""Before a slice is made: will the hosts' environment hold every module the program imports?

A missing import used to surface on every host as a traceback, after the slice was created, set up and
billed. The program's own source says what it needs: the script and the local modules it imports (the
bundle's, followed from the script) are parsed, and each top-level import that runs when the program
starts (not one inside a function, a ``try`` that catches its ImportError, or ``if TYPE_CHECKING``) must
be provided by one of:

- the standard library (``sys.stdlib_module_names``) or the bundle (the script's directory and the bundle
  root are both on the hosts' ``sys.path``; ``tpuctl`` ships in it);
- a distribution the setup installs: the runtime's pinned set (a complete lock) and the user's
  ``--requirements`` with their own dependencies (``Requires-Dist``), each mapped to the modules it
  installs through its wheel's metadata (``top_level.txt``, else the top-level entries of ``RECORD``):
  the wheel in the package mirror's wheelhouse where the backend has one, else the same distribution
  installed here.

Where the hosts' package index serves a wheelhouse alone (the simulator's mirror with its fetch-through
off), a distribution the run installs by name (a ``--requirements`` line, or a plain ``uv pip install`` /
``pip install`` in ``--setup``) that the wheelhouse lacks cannot be installed at all: that is a refusal
too, naming what the wheelhouse has and how to let the index fetch the rest.

A module none of these provides is a refusal (exit 2, naming the module and the fix). Where the answer
cannot be known it is a warning, never a refusal: a ``--setup`` command may install anything, a
requirement that is a URL, a path or another file cannot be read, a distribution whose metadata is
nowhere here maps to no module, and a run without an environment (``--no-runtime-deps`` and no
requirements, or ``--python``) uses an interpreter tpuctl does not know.
"""

from __future__ import annotations

import ast
import re
import shlex
import sys
import zipfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from tpuctl.backends.base import WheelhouseOnly
from tpuctl.errors import UsageError
from tpuctl.hosts.bundle import RUNTIME_PREFIX, Bundle
from tpuctl.hosts.setup import SetupSpec, runtime_requirements

#: A requirement line's distribution name and extras (PEP 508), e.g. ``Jax[tpu] >= 0.4``.
_REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[([^\]]*)\])?")
#: What the handler of a ``try`` names when the ``try`` is how a program makes an import optional.
_IMPORT_ERRORS = frozenset({"ImportError", "ModuleNotFoundError", "Exception", "BaseException"})
#: An install argument that is a file of its own, not a distribution's name.
_ARCHIVES = (".whl", ".tar.gz", ".zip")
#: What ends one simple command in a shell line.
_SEPARATORS = frozenset({"&&", "||", ";", "|"})


@dataclass(frozen=True)
class ImportFinding:
    """A module the program imports at start-up, where (``file:line``), and what the check found."""

    module: str
    where: str
    why: str = ""  # for an unsure one: why it cannot be told


@dataclass(frozen=True)
class Unavailable:
    """Distributions the run installs by name that the hosts' package index cannot serve: it serves
    ``wheelhouse`` alone (``limit``), which has the projects ``available``."""

    names: tuple[str, ...]
    wheelhouse: Path
    available: tuple[str, ...]
    limit: WheelhouseOnly

    def error(self) -> UsageError:
        shown = ", ".join(self.available[:8]) + (", ..." if len(self.available) > 8 else "")
        return UsageError(
            f"the hosts' package index has no {', '.join(self.names)} (named by --requirements or "
            f"--setup; checked before any slice was created): {self.limit.index} serves only "
            f"the {len(self.available)} projects of its wheelhouse {self.wheelhouse} ({shown}; "
            f"`ls {shlex.quote(str(self.wheelhouse))}` lists their files)",
            value=self.names[0],
            fix=self.limit.widen_fix,
        )


@dataclass(frozen=True)
class ImportCheck:
    """The check's outcome: ``missing`` nothing provides (refused); ``unsure`` cannot be told (warned);
    ``unavailable``: distributions the hosts' package index cannot serve (refused first)."""

    missing: tuple[ImportFinding, ...] = ()
    unsure: tuple[ImportFinding, ...] = ()
    unavailable: Unavailable | None = None
    #: Whether the run has an environment a --setup command can ``uv pip install`` into (uv is brought
    #: and on PATH, the environment active, only when there is one).
    has_env: bool = field(default=True, compare=False)  # shapes the fix, not the outcome

    def refuse(self) -> None:
        """Raise UsageError (exit 2) naming what the package index lacks, else the first missing module,
        where it is imported and the fix."""
        if self.unavailable is not None:
            raise self.unavailable.error()
        if not self.missing:
            return
        first = self.missing[0]
        names = ", ".join(f.module for f in self.missing)
        raise UsageError(
            f"the program imports {names}, which nothing in the run's environment provides "
            f"(imported at {first.where}; checked before any slice was created)",
            field="SCRIPT",
            value=first.module,
            fix=f"list the distribution that provides {first.module} in a --requirements file"
            + (", or install it with --setup 'uv pip install DIST'" if self.has_env else "")
            + "; --no-import-check skips this check",
        )

    def warnings(self) -> list[str]:
        return [
            f"cannot tell whether the hosts will have {f.module} (imported at {f.where}): {f.why}"
            for f in self.unsure
        ]


def check_imports(
    bundle: Bundle,
    script: str | None,
    setup: SetupSpec,
    *,
    python: str | None,
    wheelhouse: Path | None,
    wheelhouse_only: WheelhouseOnly | None = None,
) -> ImportCheck:
    """Check the imports of ``script`` (its path in ``bundle``; None: a module tpuctl ships, whose
    imports its own tests check) against what ``setup`` installs, and, where the hosts' index serves
    ``wheelhouse`` alone (``wheelhouse_only``: which index, how to widen it), that it has every
    distribution the run names.
    ``python``: an interpreter the user named (``--python``): then no import can be refused."""
    unavailable = (
        unavailable_in(setup, wheelhouse, wheelhouse_only)
        if wheelhouse_only is not None and wheelhouse is not None
        else None
    )
    needed = program_imports(bundle, script) if script is not None else {}
    if not needed:
        return ImportCheck(unavailable=unavailable, has_env=setup.needs_env)
    provided = Environment.of(setup, wheelhouse)
    missing: list[ImportFinding] = []
    unsure: list[ImportFinding] = []
    for module, where in sorted(needed.items()):
        if provided.provides(module):
            continue
        doubt = provided.doubt_about(module) or (f"the hosts run {python}" if python else "")
        (unsure if doubt else missing).append(ImportFinding(module, where, doubt))
    return ImportCheck(tuple(missing), tuple(unsure), unavailable, setup.needs_env)


# --- what the package index can serve -------------------------------------------------------------------


def unavailable_in(setup: SetupSpec, wheelhouse: Path, limit: WheelhouseOnly) -> Unavailable | None:
    """The distributions ``setup`` installs by name (its requirements, and its commands' plain
    ``uv pip install`` / ``pip install`` lines) that ``wheelhouse`` has no file of; None if none."""
    available = wheelhouse_projects(wheelhouse)
    named = list(requirements_of(setup.requirements)[0]) if setup.requirements else []
    for command in setup.commands:
        named += installed_by(command)
    lacking = tuple(dict.fromkeys(n for n in named if normalize(n) not in available))
    return Unavailable(lacking, wheelhouse, tuple(sorted(available)), limit) if lacking else None


def wheelhouse_projects(wheelhouse: Path) -> set[str]:
    """The normalized project names of the distribution files in ``wheelhouse``."""
    if not wheelhouse.is_dir():
        return set()
    names: set[str] = set()
    for path in wheelhouse.iterdir():
        if path.name.endswith(".whl"):
            names.add(normalize(path.name.split("-")[0]))
        elif path.name.endswith((".tar.gz", ".zip")):
            names.add(normalize(path.name.removesuffix(".tar.gz").removesuffix(".zip").rsplit("-", 1)[0]))
    return names


def installed_by(command: str) -> list[str]:
    """The distributions a command's plain installs name (``uv pip install a b``, ``pip install a``,
    ``python3 -m pip install a``, each alone or joined by ``&&``/``;``); none from an install that reads a
    file or takes options (``-r``, an index URL), whose effect cannot be told from here."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)  # `a;b` is three words, as in bash
    lexer.whitespace_split = True
    try:
        words = list(lexer)
    except ValueError:
        return []
    names: list[str] = []
    segment: list[str] = []
    for word in [*words, ";"]:
        if word not in _SEPARATORS:
            segment.append(word)
            continue
        names += _install_names(segment)
        segment = []
    return names


def _install_names(words: list[str]) -> list[str]:
    """The names one simple command installs, if it is ``[uv | python* -m] pip install NAME...``."""
    launcher = (
        1 if words[:1] == ["uv"] else 2 if words[1:2] == ["-m"] and words[0].startswith("python") else 0
    )
    if words[launcher : launcher + 2] not in (["pip", "install"], ["pip3", "install"]):
        return []
    args = words[launcher + 2 :]
    if any(a.startswith("-") or "/" in a or a.endswith(_ARCHIVES) for a in args):
        return []
    return [m.group(1) for a in args if (m := _REQUIREMENT.match(a))]


# --- what the program imports ---------------------------------------------------------------------------


def program_imports(bundle: Bundle, script: str) -> dict[str, str]:
    """Top-level module -> where it is first imported (``file:line``), for every module the script and
    the bundle's modules it imports need at start-up that are neither local nor in the standard library."""
    sources = {f.path: f.source for f in bundle.files if f.path.endswith(".py")}
    roots = _search_roots(script)
    local = local_modules([f.path for f in bundle.files], roots)
    needed: dict[str, str] = {}
    seen: set[str] = set()
    queue = [script]
    while queue:
        path = queue.pop()
        if path in seen or path not in sources or path.startswith(RUNTIME_PREFIX):
            continue  # tpuctl's runtime is checked by tpuctl's own tests, not here
        seen.add(path)
        text = sources[path].read_text(encoding="utf-8", errors="replace")
        for name, line, level in startup_imports(text):
            if level:
                queue += _local_files(_relative(path, name, level), sources)
                continue
            top = name.split(".")[0]
            if top in local:
                queue += [p for root in roots for p in _local_files(_join(root, name), sources)]
            elif top != "__future__" and top not in sys.stdlib_module_names:
                needed.setdefault(top, f"{path}:{line}")
    return needed


def startup_imports(source: str) -> list[tuple[str, int, int]]:
    """(module, line, level) of each import that runs when the module is imported: at module level, in
    a class body, under ``if`` / ``with`` / ``for``; not inside a function, under ``if TYPE_CHECKING``, or in
    a ``try`` whose handlers catch ImportError. ``from pkg import name`` yields ``pkg`` and ``pkg.name``
    (``name`` may be a submodule); ``level`` > 0: a relative import. A file that does not parse has none
    (Python on the host reports the syntax error, with its line)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    return list(_imports_in(tree.body))


def _imports_in(body: Iterable[ast.stmt]) -> Iterator[tuple[str, int, int]]:
    for node in body:
        if isinstance(node, ast.Import):
            yield from ((alias.name, node.lineno, 0) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            yield base, node.lineno, node.level
            for alias in node.names:
                if alias.name != "*":
                    yield (f"{base}.{alias.name}" if base else alias.name), node.lineno, node.level
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                yield from _imports_in(node.body)
            yield from _imports_in(node.orelse)
        elif isinstance(node, ast.Try):
            if not any(_catches_import_error(h) for h in node.handlers):
                yield from _imports_in(node.body)
            yield from _imports_in(node.orelse)
            yield from _imports_in(node.finalbody)
        elif isinstance(node, (ast.With, ast.For, ast.While, ast.ClassDef)):
            yield from _imports_in(node.body)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _catches_import_error(handler: ast.ExceptHandler) -> bool:
    if handler.type is None:
        return True  # a bare except
    kinds = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any(isinstance(k, ast.Name) and k.id in _IMPORT_ERRORS for k in kinds)


def local_modules(paths: Sequence[str], roots: Iterable[str]) -> set[str]:
    """The top-level names the bundle's files make importable from ``roots`` (bundle directories on the
    hosts' ``sys.path``): a module file, an extension module, or a directory (a package, or a namespace
    package)."""
    names: set[str] = set()
    for root in roots:
        prefix = f"{root}/" if root else ""
        for path in paths:
            if not path.startswith(prefix):
                continue
            first, _, rest = path[len(prefix) :].partition("/")
            if rest:
                names.add(first)
            elif first.endswith((".py", ".so", ".pyd")):
                names.add(first.split(".")[0])
    return names


def _search_roots(script: str) -> list[str]:
    """The bundle directories the program imports from: the script's own, and the bundle root."""
    parent = str(PurePosixPath(script).parent)
    return list(dict.fromkeys(["" if parent == "." else parent, ""]))


def _join(root: str, dotted: str) -> str:
    return "/".join(part for part in (root, *dotted.split(".")) if part)


def _relative(path: str, name: str, level: int) -> str:
    """The bundle path a relative import in ``path`` names (``from ..x import y``, level 2, name x.y)."""
    parents = PurePosixPath(path).parents
    if level > len(parents):  # above the bundle's root: Python on the host says so
        return ""
    package = parents[level - 1]
    base = "" if str(package) == "." else str(package)
    return _join(base, name)


def _local_files(stem: str, sources: Mapping[str, Path]) -> list[str]:
    """The bundle's files that importing the module at ``stem`` (``pkg/sub``) runs: each package's
    ``__init__.py`` on the way down, and the module itself."""
    parts = stem.split("/") if stem else []
    found = [f"{'/'.join(parts[:i])}/__init__.py" for i in range(1, len(parts) + 1)]
    found.append(f"{stem}.py")
    return [p for p in found if p in sources]


# --- what the environment will hold ---------------------------------------------------------------------


@dataclass
class Environment:
    """The modules the hosts' environment will hold, and what makes a missing one uncertain."""

    modules: set[str] = field(default_factory=set)
    #: Why anything may be there that the metadata does not show (a --setup command, an unread
    #: requirement, no environment at all); empty: the metadata is the whole story.
    open_ends: list[str] = field(default_factory=list)
    #: Distributions whose metadata is nowhere here: normalized name -> the name as given. Those of the
    #: runtime's lock are tpuctl's own (tested with it) and raise no doubt; the user's do.
    unmapped: dict[str, str] = field(default_factory=dict)
    unmapped_own: set[str] = field(default_factory=set)

    @classmethod
    def of(cls, setup: SetupSpec, wheelhouse: Path | None) -> Environment:
        env = cls()
        if not setup.needs_env:
            env.open_ends.append("with no runtime and no --requirements the hosts use their image's python3, "
                                 "whose packages tpuctl does not know")  # fmt: skip
        if setup.commands:
            env.open_ends.append("a --setup command may install it")
        metadata = Metadata(wheelhouse)
        if setup.runtime is not None:
            lock = requirement_names(runtime_requirements(setup.runtime))
            env._add(dict.fromkeys(lock, frozenset()), metadata, own=True)
        if setup.requirements:
            given, unread = requirements_of(setup.requirements)
            env._add(given, metadata, own=False)
            env.open_ends += [f"--requirements line {line!r} names no distribution tpuctl can read"
                              for line in unread]  # fmt: skip
        return env

    def _add(self, wanted: Mapping[str, frozenset[str]], metadata: Metadata, *, own: bool) -> None:
        """Map every wanted distribution, and what it requires in turn, to the modules it installs."""
        queue = list(wanted.items())
        done: set[str] = set()
        while queue:
            name, extras = queue.pop()
            key = normalize(name)
            if key in done:
                continue
            done.add(key)
            found = metadata.of(key)
            if found is None:
                if own:
                    self.unmapped_own.add(key)
                else:
                    self.unmapped[key] = name
                continue
            self.modules |= found.modules
            queue += [(dep, dep_extras) for dep, dep_extras in found.requires(extras)]

    def provides(self, module: str) -> bool:
        """Whether a distribution installs ``module``: by its metadata, or, for one whose metadata is nowhere
        here, by its name (``foo-bar`` installs ``foo_bar``, as nearly every distribution does)."""
        key = normalize(module)
        return module in self.modules or key in self.unmapped or key in self.unmapped_own

    def doubt_about(self, module: str) -> str:
        """Why ``module``, which no distribution's metadata shows, may be there after all (empty: it will
        not be)."""
        if self.open_ends:
            return self.open_ends[0]
        if self.unmapped:
            names = ", ".join(sorted(self.unmapped.values()))
            return f"no metadata here for {names}, which may provide it"
        return ""


def normalize(name: str) -> str:
    """A distribution or module name compared as PEP 503 compares projects (``Foo_Bar`` is ``foo-bar``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_names(text: str) -> list[str]:
    """The distribution names of a lock's ``name==version`` lines (hashes and comments skipped)."""
    return [
        m.group(1) for line in text.splitlines() if (m := re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==", line))
    ]


def requirements_of(text: str) -> tuple[dict[str, frozenset[str]], list[str]]:
    """A requirements file's distributions (name -> extras asked for) and the lines that name none tpuctl
    can read: options (``-r other.txt``, ``-e``), URLs and paths."""
    given: dict[str, frozenset[str]] = {}
    unread: list[str] = []
    for raw in text.splitlines():
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        match = _REQUIREMENT.match(line)
        if line.startswith("-") or "://" in line or "/" in line.split(";")[0] or " @ " in line or not match:
            if not line.startswith(("--hash", "--index-url", "--extra-index-url", "--find-links")):
                unread.append(line)
            continue
        extras = frozenset(e.strip().lower() for e in (match.group(2) or "").split(",") if e.strip())
        given[match.group(1)] = given.get(match.group(1), frozenset()) | extras
    return given, unread


@dataclass(frozen=True)
class Distribution:
    """What one distribution installs and requires, from its wheel's or its installation's metadata."""

    modules: frozenset[str]
    requires_dist: tuple[str, ...]

    def requires(self, extras: frozenset[str]) -> Iterator[tuple[str, frozenset[str]]]:
        """Its requirements: every unconditional one, and those of the ``extras`` asked for. Other markers
        (platform, Python version) count as met: a check that refuses must not guess them false."""
        for spec in self.requires_dist:
            requirement, _, marker = spec.partition(";")
            extra = re.search(r"""extra\s*==\s*['"]([^'"]+)['"]""", marker)
            if extra is not None and extra.group(1).lower() not in extras:
                continue
            match = _REQUIREMENT.match(requirement)
            if match is not None:
                wanted = frozenset(e.strip().lower() for e in (match.group(2) or "").split(",") if e.strip())
                yield match.group(1), wanted


class Metadata:
    """Distributions' metadata: from the wheels of ``wheelhouse`` first (what the hosts install), else
    from the distributions installed in this Python (the runtime's set is tpuctl's own dependencies)."""

    def __init__(self, wheelhouse: Path | None) -> None:
        self._wheels: dict[str, Path] = {}
        if wheelhouse is not None and wheelhouse.is_dir():
            for wheel in sorted(wheelhouse.glob("*.whl")):
                self._wheels.setdefault(normalize(wheel.name.split("-")[0]), wheel)

    def of(self, key: str) -> Distribution | None:
        wheel = self._wheels.get(key)
        found = _from_wheel(wheel) if wheel is not None else None
        return found if found is not None else _installed(key)


def _from_wheel(wheel: Path) -> Distribution | None:
    try:
        with zipfile.ZipFile(wheel) as archive:
            names = archive.namelist()
            info = next((n.split("/")[0] for n in names if n.endswith(".dist-info/METADATA")), None)
            if info is None:
                return None
            top_level = f"{info}/top_level.txt"
            text = archive.read(top_level).decode() if top_level in names else None
            metadata = archive.read(f"{info}/METADATA").decode(errors="replace")
    except (OSError, zipfile.BadZipFile, KeyError):
        return None
    modules = _top_level(text) if text is not None else _record_modules(names)
    return Distribution(modules, _requires_dist(metadata))


def _installed(key: str) -> Distribution | None:
    from importlib import metadata

    try:
        dist = metadata.distribution(key)
    except metadata.PackageNotFoundError:
        return None
    text = dist.read_text("top_level.txt")
    files = [str(f) for f in dist.files or []]
    modules = _top_level(text) if text is not None else _record_modules(files)
    return Distribution(modules, tuple(dist.requires or ()))


def _top_level(text: str) -> frozenset[str]:
    return frozenset(line.strip().split("/")[0] for line in text.splitlines() if line.strip())


def _record_modules(paths: Iterable[str]) -> frozenset[str]:
    """The importable top-level names a wheel's files make: a directory that is not metadata, a module
    file, or an extension module (``name.cpython-311-x86_64-linux-gnu.so``)."""
    names: set[str] = set()
    for path in paths:
        first, _, rest = path.partition("/")
        if first.endswith((".dist-info", ".data")) or first in ("..", "__pycache__"):
            continue
        if rest:
            names.add(first)
        elif first.endswith((".py", ".so", ".pyd")):
            names.add(first.split(".")[0])
    return frozenset(n for n in names if n.isidentifier())


def _requires_dist(metadata_text: str) -> tuple[str, ...]:
    return tuple(
        line.split(":", 1)[1].strip()
        for line in metadata_text.splitlines()
        if line.startswith("Requires-Dist:")
    )

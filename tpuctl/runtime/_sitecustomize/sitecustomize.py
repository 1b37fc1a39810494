"""Start-up hook for TPU hosts on every backend (the executor puts this directory on PYTHONPATH).

Python's ``site`` module imports the first ``sitecustomize`` on ``sys.path`` at start-up. We use that to:

- install :mod:`tpuctl.runtime.crash`'s uncaught-exception hooks (every backend): a host whose program
  raises prints the traceback and an ``exception`` event and exits at once, instead of waiting in JAX's
  shutdown barrier while the other hosts hang;
- on a simulated slice only (``TPUCTL_SIM=1``), install a tiny ``sys.meta_path`` finder that waits for
  ``jax._src.clusters`` to be imported and then registers tpuctl's simulated-slice cluster detector, so
  that an unmodified script calling ``jax.distributed.initialize()`` finds its coordinator, process count
  and process id. Programs that never import JAX pay for one dict lookup per import and nothing else.

Because we shadow any other ``sitecustomize`` (distributions and virtualenvs sometimes ship one), we
run the next one on ``sys.path`` afterwards.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys

# Not ``from typing import TYPE_CHECKING``: importing typing costs ~6 ms per start (mypy honours this).
TYPE_CHECKING = False

if TYPE_CHECKING:
    import importlib.abc
    from collections.abc import Sequence
    from types import ModuleType
    from typing import Any

# Every program on every host runs this at start-up, so it imports only what the interpreter has already
# loaded: the finder and loader below are plain classes with the protocol's methods (``importlib.abc``'s
# base classes would pull in importlib.resources, pathlib and tempfile: ~15 ms per start), and
# ``importlib.util`` is imported only when there is a shadowed sitecustomize to run.

_TARGET = "jax._src.clusters"
_HERE = os.path.dirname(os.path.abspath(__file__))


def _register() -> None:
    try:
        from tpuctl.runtime import simcluster
    except ImportError as exc:  # the bundle root is missing from PYTHONPATH: say so, don't crash
        print(
            f"tpuctl sitecustomize: cannot import tpuctl.runtime.simcluster ({exc}); "
            "jax.distributed.initialize() will not find the simulated slice",
            file=sys.stderr,
        )
        return
    simcluster.register()


class _Loader:
    """Wraps the real loader of ``jax._src.clusters``: run it, then register our cluster."""

    def __init__(self, inner: importlib.abc.Loader) -> None:
        self._inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self._inner.exec_module(module)
        _register()

    def __getattr__(self, name: str) -> Any:  # e.g. get_resource_reader, is_package
        if name == "_inner":  # not set yet (e.g. during copy): don't recurse
            raise AttributeError(name)
        return getattr(self._inner, name)


class _ClustersFinder:
    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != _TARGET:
            return None
        # Fire once: remove ourselves, then ask the remaining finders for the real spec.
        _uninstall()
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            if find is None:
                continue
            spec: importlib.machinery.ModuleSpec | None = find(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    # A Loader by protocol, not by class (see the imports): typeshed wants the class.
                    spec.loader = _Loader(spec.loader)  # type: ignore[assignment]
                return spec
        return None


_finder = _ClustersFinder()


def _uninstall() -> None:
    if _finder in sys.meta_path:
        sys.meta_path.remove(_finder)


def _install_crash_hook() -> None:
    try:
        from tpuctl.runtime import crash
    except ImportError as exc:  # the bundle root is missing from PYTHONPATH: say so, don't crash
        print(f"tpuctl sitecustomize: cannot import tpuctl.runtime.crash ({exc})", file=sys.stderr)
        return
    crash.install()


def _install() -> None:
    if os.environ.get("TPUCTL_SIM", "") != "1":
        return
    if _TARGET in sys.modules:  # JAX got imported before us (e.g. by a .pth file): register now
        _register()
    else:
        sys.meta_path.insert(0, _finder)


def _chain_next_sitecustomize() -> None:
    """Run the ``sitecustomize`` we shadow, if any, as Python would have without us."""
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    from importlib.util import module_from_spec

    module = module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # site.py also only warns when sitecustomize fails
        print(f"Error in shadowed sitecustomize {spec.origin}: {exc!r}", file=sys.stderr)


_install_crash_hook()
_install()
_chain_next_sitecustomize()

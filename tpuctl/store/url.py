"""Where the ledger lives, as a URL: ``sqlite:////abs/path/ledger.db`` today, a server database later.

The ledger's location is a setting of its own (``database``, ``--database``, ``TPUCTL_DATABASE_URL``),
apart from the state dir, so that supervisors on several machines can share one ledger. The spelling is
SQLAlchemy's: ``sqlite:///`` followed by the path, so an absolute path gives four slashes. A relative
path is refused rather than taken relative to the current directory: a detached supervisor, or the same
command run from another directory, would silently open another ledger.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final

from tpuctl.params import LABEL, ParamError

#: The ledger file's name in a state directory (the default database).
LEDGER_FILENAME: Final = "ledger.db"

SQLITE_SCHEME: Final = "sqlite"
_SQLITE_PREFIX: Final = "sqlite:///"
#: Schemes a later tpuctl will serve (refused now with "not supported yet", not "unknown").
_SERVER_SCHEMES: Final = ("postgresql", "postgres")
_FIX_FORM: Final = "use sqlite:////ABSOLUTE/PATH/ledger.db (four slashes: sqlite:/// then an absolute path)"


@dataclass(frozen=True, slots=True)
class DatabaseUrl:
    """A parsed, validated ledger location. Build with ``parse_database_url`` or ``sqlite_url``."""

    scheme: str
    #: The SQLite file (absolute); None for a server database.
    path: Path | None

    @property
    def text(self) -> str:
        """The URL as a user writes it (no credentials are ever part of a SQLite URL)."""
        return f"{_SQLITE_PREFIX}{self.path}"

    def __str__(self) -> str:
        return self.text


def sqlite_url(path: str | Path) -> DatabaseUrl:
    """The URL of the SQLite ledger file at ``path`` (made absolute where the caller runs)."""
    return DatabaseUrl(SQLITE_SCHEME, Path(path).expanduser().absolute())


def default_database_url(state_dir: Path) -> DatabaseUrl:
    """The ledger of a state directory: ``sqlite:///<state_dir>/ledger.db`` (tpuctl's only ledger before
    the location became a setting)."""
    return sqlite_url(state_dir / LEDGER_FILENAME)


def parse_database_url(value: str | DatabaseUrl, param: str = "database") -> DatabaseUrl:
    """``value`` as a ledger URL; a ``ParamError`` (exit 2) naming ``param``, the value and the fix for a
    bad scheme, a relative path, a missing path, query parameters, or a server database (not supported
    yet)."""
    if isinstance(value, DatabaseUrl):
        return value
    text = str(value).strip()
    scheme, sep, rest = text.partition("://")
    if not sep:
        raise ParamError(
            f"{LABEL} {text!r} is not a URL",
            param=param,
            value=text,
            fix=f"use sqlite:///{Path(text).expanduser().absolute()}" if text else _FIX_FORM,
        )
    scheme = scheme.lower()
    if scheme in _SERVER_SCHEMES or scheme.startswith(tuple(f"{s}+" for s in _SERVER_SCHEMES)):
        raise ParamError(
            f"{LABEL} {_redacted(text)!r}: PostgreSQL ledgers are not supported yet",
            param=param,
            value=_redacted(text),
            fix="use a SQLite ledger, sqlite:////ABSOLUTE/PATH/ledger.db (the default is the state dir's)",
        )
    if scheme != SQLITE_SCHEME:
        raise ParamError(
            f"{LABEL} {text!r} has the unknown scheme {scheme!r}",
            param=param,
            value=text,
            fix=_FIX_FORM,
        )
    return DatabaseUrl(SQLITE_SCHEME, _sqlite_path(text, rest, param))


def _sqlite_path(text: str, rest: str, param: str) -> Path:
    """The absolute file of ``sqlite://<rest>``; refuses a host, a relative or empty path, parameters."""
    if not rest.startswith("/"):
        # sqlite://host/path: SQLite has no hosts (SQLAlchemy would read "host/path" as a relative path).
        raise ParamError(
            f"{LABEL} {text!r} names a host; a SQLite ledger is a file",
            param=param,
            value=text,
            fix=_FIX_FORM,
        )
    path = rest[1:]
    if "?" in path or "#" in path:
        raise ParamError(
            f"{LABEL} {text!r} has query parameters, which a ledger URL does not take",
            param=param,
            value=text,
            fix=f"drop them: sqlite:///{path.split('?')[0].split('#')[0]}",
        )
    if not path:
        raise ParamError(f"{LABEL} {text!r} names no file", param=param, value=text, fix=_FIX_FORM)
    if not path.startswith("/"):
        raise ParamError(
            f"{LABEL} {text!r} has a relative path ({path}); the ledger's path must be absolute",
            param=param,
            value=text,
            fix=f"use sqlite:///{Path(path).expanduser().absolute()} (four slashes for an absolute path)",
        )
    return Path(path)


def _redacted(text: str) -> str:
    """``text`` without the password a server URL may carry (``user:secret@host``): errors are printed."""
    scheme, _sep, rest = text.partition("://")
    credentials, at, host = rest.rpartition("@")
    if not at or ":" not in credentials:
        return text
    return f"{scheme}://{credentials.split(':', 1)[0]}:***@{host}"

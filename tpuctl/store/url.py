"""Where the ledger lives, as a URL: ``sqlite:////abs/path/ledger.db`` (the default, a file) or a
PostgreSQL database, ``postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE[?PARAM=VALUE...]``.

The ledger's location is a setting of its own (``database``, ``--database``, ``TPUCTL_DATABASE_URL``),
apart from the state dir, so that supervisors on several machines can share one ledger. The spelling is
SQLAlchemy's: ``sqlite:///`` followed by the path, so an absolute path gives four slashes. A relative
path is refused rather than taken relative to the current directory: a detached supervisor, or the same
command run from another directory, would silently open another ledger.

PostgreSQL is written ``postgresql://``, ``postgres://`` (libpq's and Heroku's spelling) or
``postgresql+psycopg://`` (SQLAlchemy's, naming the driver tpuctl uses); the query parameters are
libpq's (``sslmode=require``...). A password may be in the URL, and then it is never printed: ``text``
and ``str()`` show it as ``***``; only ``secret_url`` carries it, for the engine and for a child
process's environment. Left out, libpq finds it in ``PGPASSWORD`` or ``~/.pgpass``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Final
from urllib.parse import parse_qsl, quote, unquote, urlencode, urlsplit

from tpuctl.params import LABEL, ParamError

#: The ledger file's name in a state directory (the default database).
LEDGER_FILENAME: Final = "ledger.db"

SQLITE_SCHEME: Final = "sqlite"
POSTGRESQL_SCHEME: Final = "postgresql"
_SQLITE_PREFIX: Final = "sqlite:///"
#: The spellings of a PostgreSQL URL tpuctl takes; all mean psycopg 3, the one driver it ships.
_POSTGRESQL_SCHEMES: Final = ("postgresql", "postgres", "postgresql+psycopg")
#: SQLAlchemy's name of the dialect and driver: what ``secret_url`` is written with.
_POSTGRESQL_DRIVER: Final = "postgresql+psycopg"
_REDACTED: Final = "***"
_FIX_FORM: Final = "use sqlite:////ABSOLUTE/PATH/ledger.db (four slashes: sqlite:/// then an absolute path)"
_FIX_SERVER_FORM: Final = "use postgresql://USER[:PASSWORD]@HOST[:PORT]/DATABASE"


@dataclass(frozen=True, slots=True, repr=False)
class DatabaseUrl:
    """A parsed, validated ledger location. Build with ``parse_database_url`` or ``sqlite_url``.

    A SQLite ledger has a ``path``; a PostgreSQL one a ``host`` and a ``database`` (``path`` None).
    ``repr`` and ``str`` never show the password."""

    scheme: str
    #: The SQLite file (absolute); None for a server database.
    path: Path | None
    host: str | None = None
    port: int | None = None
    database: str | None = None
    username: str | None = None
    password: str | None = None
    #: libpq's connection parameters from the URL's query, in the order given.
    query: tuple[tuple[str, str], ...] = ()

    @property
    def text(self) -> str:
        """The URL as a user writes it, the password shown as ``***``: what every message prints."""
        if self.path is not None:
            return f"{_SQLITE_PREFIX}{self.path}"
        return self._server_url(POSTGRESQL_SCHEME, redact=True)

    @property
    def secret_url(self) -> str:
        """The URL with its password, in SQLAlchemy's spelling (the driver named): for the engine and a
        child process's environment only, never for a message or a log."""
        if self.path is not None:
            return self.text
        return self._server_url(_POSTGRESQL_DRIVER, redact=False)

    def _server_url(self, scheme: str, *, redact: bool) -> str:
        credentials = ""
        if self.username is not None:
            credentials = quote(self.username, safe="")
            if self.password is not None:
                credentials += ":" + (_REDACTED if redact else quote(self.password, safe=""))
            credentials += "@"
        host = f"[{self.host}]" if self.host and ":" in self.host else self.host
        port = "" if self.port is None else f":{self.port}"
        query = f"?{urlencode(self.query)}" if self.query else ""
        return f"{scheme}://{credentials}{host}{port}/{quote(self.database or '', safe='')}{query}"

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"DatabaseUrl({self.text!r})"


def sqlite_url(path: str | Path) -> DatabaseUrl:
    """The URL of the SQLite ledger file at ``path`` (made absolute where the caller runs)."""
    return DatabaseUrl(SQLITE_SCHEME, Path(path).expanduser().absolute())


def default_database_url(state_dir: Path) -> DatabaseUrl:
    """The ledger of a state directory: ``sqlite:///<state_dir>/ledger.db`` (tpuctl's only ledger before
    the location became a setting)."""
    return sqlite_url(state_dir / LEDGER_FILENAME)


def parse_database_url(value: str | DatabaseUrl, param: str = "database") -> DatabaseUrl:
    """``value`` as a ledger URL; a ``ParamError`` (exit 2) naming ``param``, the value (its password
    hidden) and the fix for a bad scheme, a relative path, a missing path or host or database, or query
    parameters where they do not belong."""
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
    if scheme in _POSTGRESQL_SCHEMES:
        return _postgresql_url(text, param)
    if scheme.startswith(tuple(f"{s}+" for s in _POSTGRESQL_SCHEMES)):
        shown = _redacted(text)
        raise ParamError(
            f"{LABEL} {shown!r} names the driver {scheme.partition('+')[2]!r}; tpuctl talks to "
            "PostgreSQL through psycopg 3 only",
            param=param,
            value=shown,
            fix=f"{_FIX_SERVER_FORM} (or postgresql+psycopg://)",
        )
    if scheme != SQLITE_SCHEME:
        shown = _redacted(text)
        raise ParamError(
            f"{LABEL} {shown!r} has the unknown scheme {scheme!r}",
            param=param,
            value=shown,
            fix=f"{_FIX_FORM}, or for PostgreSQL {_FIX_SERVER_FORM}",
        )
    return DatabaseUrl(SQLITE_SCHEME, _sqlite_path(text, rest, param))


def _postgresql_url(text: str, param: str) -> DatabaseUrl:
    """The PostgreSQL database of ``text``; refuses a missing host or database, a bad port, a fragment
    and a password among the query parameters (it would be printed with them)."""
    shown = _redacted(text)

    def bad(problem: str, fix: str = _FIX_SERVER_FORM) -> ParamError:
        return ParamError(f"{LABEL} {shown!r} {problem}", param=param, value=shown, fix=fix)

    parts = urlsplit(text)
    try:
        port = parts.port
    except ValueError:
        raise bad("has a port that is not a number from 1 to 65535") from None
    if not parts.hostname:
        raise bad("names no host")
    if port == 0:
        raise bad("has a port that is not a number from 1 to 65535")
    database = unquote(parts.path[1:])
    if not database or "/" in database:
        raise bad("names no database (one name after the host: /DATABASE)")
    if parts.fragment:
        raise bad("has a fragment (#...), which a database URL does not take", fix="drop it")
    try:
        query = tuple(parse_qsl(parts.query, keep_blank_values=True, strict_parsing=True))
    except ValueError:
        raise bad("has query parameters that are not NAME=VALUE pairs") from None
    if any(key == "password" for key, _ in query):
        raise bad(
            "has its password among the query parameters",
            fix="write it as USER:PASSWORD@HOST (then it is never printed), or set PGPASSWORD",
        )
    return DatabaseUrl(
        POSTGRESQL_SCHEME,
        None,
        host=parts.hostname,
        port=port,
        database=database,
        username=None if parts.username is None else unquote(parts.username),
        password=None if parts.password is None else unquote(parts.password),
        query=query,
    )


def _sqlite_path(text: str, rest: str, param: str) -> Path:
    """The absolute file of ``sqlite://<rest>``; refuses a host, a relative or empty path, parameters."""
    if not rest.startswith("/"):
        # sqlite://host/path: SQLite has no hosts (SQLAlchemy would read "host/path" as a relative path).
        # A host may come with a password someone meant for a server: hidden like one.
        shown = _redacted(text)
        raise ParamError(
            f"{LABEL} {shown!r} names a host; a SQLite ledger is a file",
            param=param,
            value=shown,
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
    return f"{scheme}://{credentials.split(':', 1)[0]}:{_REDACTED}@{host}"

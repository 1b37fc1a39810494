"""A throwaway PostgreSQL cluster for tests and benchmarks: a real server, never a mock.

``PostgresCluster.start()`` runs ``initdb`` and ``pg_ctl start`` in a fresh directory: the server listens
on 127.0.0.1 only, at a port from ``unused_port`` (below the ephemeral range), with its unix socket in
the cluster's own directory, trust authentication (nothing but this machine can reach it, and it holds
nothing worth a password) and every durability setting off (``fsync``, ``synchronous_commit``,
``full_page_writes``): the data lives as long as a test session, and a crash of the machine loses
nothing anybody wants back. ``create_database`` gives each test its own database, ``restart``, ``stop``
and ``start_again`` take the server down and back as a team's database may go.

PostgreSQL refuses to run as root, and CI runs as root: then every server command runs as ``nobody``,
which exists on every Debian-like system and owns nothing (a dedicated system user would have to be
created, which needs more than a test should do to a machine). Its directory is made in the system's
temp dir (world-traversable, sticky) and handed to that user; pytest's own temp dir under root is 0700,
which ``nobody`` cannot enter.

Readiness is ``pg_ctl -w`` (it polls the server with its own deadline, ``-t``), never a sleep.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Final, LiteralString

from tpuctl.testing.ports import unused_port

__all__ = ["PostgresCluster", "PostgresError", "PostgresMissingError", "find_postgres_bin"]

#: What a cluster needs from a PostgreSQL installation, all in one directory.
SERVER_PROGRAMS: Final = ("initdb", "pg_ctl", "postgres")
#: Where Debian's packages put the server programs (one directory per major version).
DEBIAN_BIN_GLOB: Final = "/usr/lib/postgresql/*/bin"
INSTALL_HINT: Final = (
    "install PostgreSQL's server programs: on Debian or Ubuntu, as root, "
    "`apt-get update && apt-get install -y postgresql` (or postgresql-15); Debian puts initdb, pg_ctl "
    "and postgres in /usr/lib/postgresql/15/bin (15: the major version), which need not be on PATH: "
    "tpuctl's tests look there too"
)
#: The cluster's superuser: the name every PostgreSQL installation uses for it.
SUPERUSER: Final = "postgres"
#: Who runs the server when this process is root (PostgreSQL refuses root).
UNPRIVILEGED_USER: Final = "nobody"
#: How long pg_ctl waits for the server to come up or go down (its own polling, ``-t``).
_PG_CTL_WAIT_S: Final = 60
#: The server's settings: loopback only, and nothing durable (a throwaway cluster).
_BASE_SETTINGS: Final[Mapping[str, str]] = {
    "listen_addresses": "'127.0.0.1'",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    # No background noise in a test's timings or logs.
    "autovacuum": "off",
    "logging_collector": "off",
}
_DATABASE_NAME: Final = re.compile(r"[a-z_][a-z0-9_]{0,62}")


class PostgresError(RuntimeError):
    """A PostgreSQL server program failed; the message carries its output and the server log's tail."""


class PostgresMissingError(PostgresError):
    """PostgreSQL's server programs are not installed (the message says how to install them)."""


def find_postgres_bin(*, path: str | None = None, debian_glob: str = DEBIAN_BIN_GLOB) -> Path:
    """The directory holding ``initdb``, ``pg_ctl`` and ``postgres``: the one on ``PATH`` (``path``,
    default the environment's) first, then Debian's ``/usr/lib/postgresql/<major>/bin``, highest
    major version first. ``PostgresMissingError`` saying how to install them when there is none."""
    found = shutil.which(SERVER_PROGRAMS[0], path=path)
    if found is not None:
        # A symlink on PATH (/usr/local/bin/initdb -> /usr/lib/postgresql/15/bin/initdb) stands for
        # the installation it points into, where the other programs are.
        for candidate in (Path(found).parent, Path(found).resolve().parent):
            if _has_server_programs(candidate):
                return candidate
    debian = sorted(Path("/").glob(debian_glob.lstrip("/")), key=_major_version, reverse=True)
    for candidate in debian:
        if _has_server_programs(candidate):
            return candidate
    raise PostgresMissingError(
        f"PostgreSQL's server programs ({', '.join(SERVER_PROGRAMS)}) are neither on PATH nor in "
        f"{debian_glob}: {INSTALL_HINT}"
    )


def _has_server_programs(directory: Path) -> bool:
    return all(os.access(directory / name, os.X_OK) for name in SERVER_PROGRAMS)


def _major_version(bin_dir: Path) -> int:
    """15 for /usr/lib/postgresql/15/bin (0 for a name that is not a number)."""
    name = bin_dir.parent.name
    return int(name) if name.isdigit() else 0


@dataclass(frozen=True, slots=True)
class _RunAs:
    """The user the server's programs run as: this process's, or ``nobody``'s when this one is root."""

    uid: int
    gid: int

    @classmethod
    def for_server(cls) -> _RunAs | None:
        """None when this process may run the server itself; else the unprivileged user."""
        if os.geteuid() != 0:
            return None
        entry = pwd.getpwnam(UNPRIVILEGED_USER)
        return cls(entry.pw_uid, entry.pw_gid)


class PostgresCluster:
    """One running (or stopped) throwaway cluster. Build with ``PostgresCluster.start()``; ``destroy()``
    (or leaving the ``with`` block) stops it and removes its directory."""

    def __init__(self, root: Path, bin_dir: Path, port: int, run_as: _RunAs | None) -> None:
        self.root = root
        self.bin_dir = bin_dir
        self.port = port
        self._run_as = run_as
        self._destroyed = False

    # -- lifecycle ---------------------------------------------------------------------------------

    @classmethod
    def start(
        cls, *, base_dir: Path | None = None, settings: Mapping[str, str] | None = None
    ) -> PostgresCluster:
        """A new cluster in a fresh directory under ``base_dir`` (default: the system's temp dir),
        initialised and running. ``settings``: more ``postgresql.conf`` lines (``max_connections``...),
        values written as PostgreSQL reads them."""
        bin_dir = find_postgres_bin()
        run_as = _RunAs.for_server()
        parent = Path(tempfile.gettempdir()) if base_dir is None else base_dir
        if run_as is not None:
            _check_reachable(parent, run_as)
        root = Path(tempfile.mkdtemp(prefix="tpuctl-pg-", dir=parent))
        if run_as is not None:
            os.chown(root, run_as.uid, run_as.gid)
        cluster = cls(root, bin_dir, unused_port(), run_as)
        try:
            cluster._initdb({**_BASE_SETTINGS, **(settings or {})})
            cluster.start_again()
        except BaseException:
            cluster.destroy()
            raise
        return cluster

    def start_again(self) -> None:
        """Start the server of a stopped cluster: the same port, the same data."""
        self._pg_ctl("start", "-l", str(self.log_path))

    def stop(self) -> None:
        """Stop the server (fast shutdown: open connections are closed); the data stays."""
        self._pg_ctl("stop", "-m", "fast")

    def restart(self) -> None:
        """``pg_ctl restart``: every connection is dropped, the server comes back on the same port."""
        self._pg_ctl("restart", "-m", "fast", "-l", str(self.log_path))

    def destroy(self) -> None:
        """Stop the server (immediately: nothing here is worth a clean shutdown) and remove the
        directory. Idempotent, and safe on a cluster whose server is already down."""
        if self._destroyed:
            return
        self._destroyed = True
        pid = self.pid
        if pid is not None:
            try:
                self._pg_ctl("stop", "-m", "immediate")
            except PostgresError:
                # pg_ctl could not stop it (it may be dying already): the postmaster is ours to kill.
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> PostgresCluster:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.destroy()

    # -- what a test uses --------------------------------------------------------------------------

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def log_path(self) -> Path:
        return self.root / "server.log"

    @property
    def pid(self) -> int | None:
        """The postmaster's process id while the server runs (its ``postmaster.pid``), else None."""
        try:
            first = (self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0]
        except OSError:
            return None
        return int(first) if first.strip().isdigit() else None

    def url(self, database: str) -> str:
        """The SQLAlchemy URL of ``database`` in this cluster (psycopg 3, as the superuser, over TCP)."""
        return f"postgresql+psycopg://{SUPERUSER}@127.0.0.1:{self.port}/{database}"

    def create_database(self, name: str, *, template: str | None = None) -> str:
        """Create the database ``name`` (lower-case letters, digits, underscores): empty, or a copy of the
        database ``template`` (which nobody may be connected to); its URL."""
        if template is None:
            self._admin("CREATE DATABASE {}", name)
        else:
            self._admin("CREATE DATABASE {} TEMPLATE {}", name, template)
        return self.url(name)

    @contextlib.contextmanager
    def scratch_database(self, prefix: str, *, template: str | None = None) -> Iterator[str]:
        """A database of its own (``prefix`` and a random suffix; empty, or a copy of ``template``) for
        the block, its URL yielded, dropped after it with any connection left open to it."""
        import secrets

        name = f"{prefix}_{secrets.token_hex(6)}"
        url = self.create_database(name, template=template)
        try:
            yield url
        finally:
            self.drop_database(name)

    def drop_database(self, name: str) -> None:
        """Drop ``name``, closing any connection a test left open to it; a missing one is no error."""
        self._admin("DROP DATABASE IF EXISTS {} WITH (FORCE)", name)

    # -- the server's programs ---------------------------------------------------------------------

    def _initdb(self, settings: Mapping[str, str]) -> None:
        # --no-sync: no fsync of the new files; the cluster is thrown away anyway, and it saves seconds.
        options = [
            "-U",
            SUPERUSER,
            "--auth=trust",
            "-E",
            "UTF8",
            "--locale=C",
            "--no-sync",
            "--no-instructions",
        ]
        self._run("initdb", ["-D", str(self.data_dir), *options])
        lines = [f"{key} = {value}" for key, value in settings.items()]
        lines += [f"port = {self.port}", f"unix_socket_directories = '{self.root}'"]
        with (self.data_dir / "postgresql.conf").open("a") as conf:
            conf.write("\n# tpuctl.testing.postgres: a throwaway cluster\n" + "\n".join(lines) + "\n")

    def _pg_ctl(self, action: str, *args: str) -> None:
        self._run("pg_ctl", [action, "-D", str(self.data_dir), "-w", "-t", str(_PG_CTL_WAIT_S), *args])

    def _run(self, program: str, args: Sequence[str]) -> None:
        """Run one of the server's programs as the server's user; a PostgresError with its output and
        the log's tail when it fails."""
        run_as = self._run_as
        try:
            done = subprocess.run(
                [str(self.bin_dir / program), *args],
                cwd=self.root,
                env=_server_environment(),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=_PG_CTL_WAIT_S + 30,
                user=None if run_as is None else run_as.uid,
                group=None if run_as is None else run_as.gid,
                extra_groups=None if run_as is None else [],
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise PostgresError(f"{program} {' '.join(args)}: {exc}{self._log_tail()}") from exc
        if done.returncode != 0:
            output = (done.stdout + done.stderr).strip()
            raise PostgresError(
                f"{program} {' '.join(args)} exited {done.returncode}: {output}{self._log_tail()}"
            )

    def _log_tail(self, lines: int = 20) -> str:
        try:
            tail = self.log_path.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return ""
        return "\nserver log (last lines):\n" + "\n".join(tail) if tail else ""

    def _admin(self, statement: LiteralString, *databases: str) -> None:
        """``statement`` about ``databases`` (quoted into its ``{}``s, in order), outside a transaction
        (CREATE and DROP DATABASE must be), on the maintenance database ``postgres``."""
        import psycopg
        from psycopg import sql

        query = sql.SQL(statement).format(*(sql.Identifier(_database_name(d)) for d in databases))
        conninfo = f"host=127.0.0.1 port={self.port} user={SUPERUSER} dbname=postgres connect_timeout=10"
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(query)


def _database_name(name: str) -> str:
    """``name`` when it is a plain identifier (it is quoted into SQL); ValueError otherwise."""
    if not _DATABASE_NAME.fullmatch(name):
        raise ValueError(f"database name {name!r}: use lower-case letters, digits and underscores")
    return name


def _server_environment() -> dict[str, str]:
    """This process's environment without libpq's and PostgreSQL's own variables (a developer's
    PGDATA, PGPORT or PGHOST would steer pg_ctl at another cluster), in the C locale."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["LC_ALL"] = "C"
    return env


def _check_reachable(directory: Path, run_as: _RunAs) -> None:
    """Fail before initdb, saying why, when ``run_as`` cannot enter ``directory`` (each directory above
    it must be searchable by that user: pytest's per-user temp dir under root is 0700)."""
    for each in [directory.absolute(), *directory.absolute().parents]:
        st = each.stat()
        if st.st_uid == run_as.uid:
            mask = 0o100
        elif st.st_gid == run_as.gid:
            mask = 0o010
        else:
            mask = 0o001
        if not st.st_mode & mask:
            raise PostgresError(
                f"the server's user ({UNPRIVILEGED_USER}) cannot enter {each} (mode "
                f"{st.st_mode & 0o777:o}): put the cluster under a directory it can reach "
                f"(base_dir=None: the system's temp dir)"
            )

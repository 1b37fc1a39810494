"""Shared fixtures: every test gets its own state and config dirs and an environment without cloud
settings or package-index settings, so no test can see the developer's real config, reach Google or
reach a real package index."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tpuctl.testing.cli import Cli, CliResult, invoke

if TYPE_CHECKING:
    from tpuctl.sim import SimAdminClient, SimServer, World
    from tpuctl.store import Ledger
    from tpuctl.testing.backend import InProcessCli
    from tpuctl.testing.postgres import PostgresCluster
    from tpuctl.testing.stored_envs import StoredEnvs

# Variables that would steer tpuctl towards a real project or a foreign state dir, or the simulator's
# package mirror (fetching through to the index the user's pip/uv name) towards a real package index.
_CLEARED_PREFIXES = ("TPUCTL_", "PIP_", "UV_")
_CLEARED_NAMES = (
    "GOOGLE_CLOUD_PROJECT",
    "CLOUDSDK_CORE_PROJECT",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "XDG_CONFIG_HOME",
    "XDG_STATE_HOME",
)

# And no config file of pip's or uv's is read (a real index URL in pip.conf or uv.toml): pip reads none
# with PIP_CONFIG_FILE set to the null device, uv none with UV_NO_CONFIG.
_NO_PACKAGE_INDEX_CONFIG = {"PIP_CONFIG_FILE": "/dev/null", "UV_NO_CONFIG": "1"}


def pytest_configure(config: pytest.Config) -> None:
    """For the whole session, before any fixture (a session-scoped one too) copies the environment: no
    pip/uv setting of this machine, so nothing a test starts can reach a real package index."""
    import os

    for name in list(os.environ):
        if name.startswith(("PIP_", "UV_")):
            del os.environ[name]
    os.environ.update(_NO_PACKAGE_INDEX_CONFIG)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--slow", action="store_true", default=False, help="also run tests marked slow")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if config.getoption("--slow"):
        return
    skip_slow = pytest.mark.skip(reason="slow: run with --slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip_slow)


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """A clean environment with private XDG dirs under the test's tmp dir; yields the state dir."""
    import os

    for name in list(os.environ):
        if name.startswith(_CLEARED_PREFIXES) or name in _CLEARED_NAMES:
            monkeypatch.delenv(name, raising=False)
    config_home = tmp_path / "xdg-config"
    state_home = tmp_path / "xdg-state"
    monkeypatch.setenv("XDG_CONFIG_HOME", str(config_home))
    monkeypatch.setenv("XDG_STATE_HOME", str(state_home))
    # Google's auth library must never find real credentials or the metadata server from a test.
    monkeypatch.setenv("GCE_METADATA_HOST", "127.0.0.1:9")
    monkeypatch.setenv("NO_GCE_CHECK", "True")
    for name, value in _NO_PACKAGE_INDEX_CONFIG.items():  # a test may have changed them
        monkeypatch.setenv(name, value)
    yield state_home / "tpuctl"
    _discard_simulated_vms(tmp_path)


def _discard_simulated_vms(tmp_path: Path) -> None:
    """The simulated VMs of every simulator state the test made (below its tmp dir) live in the temp
    dir and outlive the simulator process, as VMs do: what the test left running is killed and their
    disks removed."""
    from tpuctl.sim.vms.layout import vm_roots_of
    from tpuctl.sim.vms.procs import discard_vms

    for vm_root in vm_roots_of(tmp_path):
        discard_vms(vm_root, remove=_remove_in_background)


def _remove_in_background(root: Path) -> None:
    """Rename ``root`` aside and remove it from a detached, low-priority ``rm``: a set-up VM's disk holds
    ~16,000 files (its Python environment), seconds of unlinking per host that the next test need not
    wait for. Nothing runs there any more (its processes were killed first)."""
    import secrets
    import subprocess

    aside = root.with_name(f"tpuctl-discarded-{root.name}-{secrets.token_hex(4)}")  # no VM root by name
    try:
        root.rename(aside)
    except OSError:
        return  # gone already, or not ours to move: the caller tries again
    subprocess.Popen(
        ["nice", "-n", "19", "rm", "-rf", "--", str(aside)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


@pytest.fixture
def state_dir(clean_environment: Path) -> Path:
    """The state dir tpuctl will use in this test (created by tpuctl itself)."""
    return clean_environment


@pytest.fixture
def cli() -> Cli:
    """The in-process CLI runner every test shares; a directory's conftest or a test file may wrap it
    (a fixture of the same name that asks for ``cli``) to add its own environment."""

    def run(*args: str, env: Mapping[str, str | None] | None = None, stdin: str = "") -> CliResult:
        return invoke(args, env=env, stdin=stdin)

    return run


@pytest.fixture
def sim_world() -> World | Mapping[str, Any]:
    """The world ``sim_cli``'s simulator runs: the default one. A module (or a test) overrides this
    fixture with its own, a ``World`` or the data of a world file."""
    from tpuctl.sim import default_world

    return default_world()


@pytest.fixture
def sim_cli(state_dir: Path, sim_world: World | Mapping[str, Any]) -> Iterator[InProcessCli]:
    """The CLI on a fresh ``InProcessBackend``: the simulator in this process over the test's state dir,
    on a frozen ``FakeClock`` that moves only when a command waits or the test calls ``clock.advance``.
    For every test whose commands reach no host; those that do use ``serve_sim``."""
    from tpuctl.sim import World
    from tpuctl.sim.world import world_from_data
    from tpuctl.store.paths import ensure_private_dir
    from tpuctl.testing.backend import InProcessBackend, InProcessCli
    from tpuctl.testing.cloud import InProcessSim

    world = sim_world if isinstance(sim_world, World) else world_from_data(dict(sim_world), "test world")
    with InProcessSim(ensure_private_dir(state_dir), world) as sim:
        runner = InProcessCli(InProcessBackend(sim))
        try:
            yield runner
        finally:
            runner.close()


@pytest.fixture(scope="session")
def stored_envs(tmp_path_factory: pytest.TempPathFactory) -> StoredEnvs:
    """The run environments this test process's simulators stored, kept for the next ones' buckets."""
    from tpuctl.testing.stored_envs import StoredEnvs

    return StoredEnvs(tmp_path_factory.mktemp("stored-envs"))


@pytest.fixture
def bucket_envs(request: pytest.FixtureRequest, stored_envs: StoredEnvs) -> StoredEnvs | None:
    """``stored_envs``, or None for a test marked ``fresh_bucket`` (one that watches an environment being
    built and stored): whether a test's simulated bucket starts with the environments stored before."""
    return None if request.node.get_closest_marker("fresh_bucket") else stored_envs


@pytest.fixture
def serve_sim(
    state_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    stored_envs: StoredEnvs,
    bucket_envs: StoredEnvs | None,
) -> Iterator[Callable[..., SimAdminClient]]:
    """``serve_sim(world, point_cli=True, **server_kwargs)`` serves a simulator over this test's state dir
    and returns its admin client; with ``point_cli`` every CLI command of the test talks to it
    (TPUCTL_SIM_URL). ``world`` is a ``World`` or the data of a world file; ``server_kwargs`` go to
    ``SimServer`` (``clock``, ``ticker_interval_s``, ``vms``). Everything is stopped at teardown.

    Its bucket starts with the run environments earlier tests stored (``tpuctl.testing.stored_envs``),
    unless the test is marked ``fresh_bucket``; what it stores is kept for the next tests."""
    from tpuctl.sim import SimAdminClient, SimServer, World
    from tpuctl.sim.storage import storage_dir_for
    from tpuctl.sim.world import world_from_data

    started: list[tuple[SimServer, SimAdminClient]] = []

    def serve(
        world: World | Mapping[str, Any], *, point_cli: bool = True, **server_kwargs: Any
    ) -> SimAdminClient:
        if not isinstance(world, World):
            world = world_from_data(dict(world), "test world")
        state_dir.mkdir(parents=True, exist_ok=True)
        if bucket_envs is not None and not started:
            bucket_envs.seed(storage_dir_for(state_dir))
        # As `tpuctl sim serve` does: the VMs run in the state's hypervisor process.
        server = SimServer(state_dir, world, **{"vms": "hypervisor", **server_kwargs})
        url = server.start()
        admin = SimAdminClient(url)
        started.append((server, admin))
        if point_cli:
            monkeypatch.setenv("TPUCTL_SIM_URL", url)
        return admin

    yield serve
    for server, admin in started:
        admin.close()
        server.stop()
    if started:
        stored_envs.harvest(storage_dir_for(state_dir))


@pytest.fixture
def one_server_vm() -> Iterator[None]:
    """Held by every test that runs a team server on a simulated VM, for the whole test (ask for it
    first: it is then given back last): the simulated VMs share this machine's loopback, so two such
    servers at once, on two xdist workers, would both listen on the server's port. An exclusive lock on
    a file of this machine's temp dir, waited for, not slept on."""
    import fcntl
    import tempfile

    with open(Path(tempfile.gettempdir()) / "tpuctl-tests-server-vm.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[PostgresCluster]:
    """A real PostgreSQL server on loopback for this test process (one per xdist worker), started when a
    test first asks for it and destroyed at the session's end. Without the server programs the tests
    that ask FAIL, saying how to install them: a database test never passes by not running."""
    from tpuctl.testing.postgres import PostgresCluster, PostgresMissingError

    try:
        cluster = PostgresCluster.start()
    except PostgresMissingError as exc:
        missing = str(exc)  # failed below, outside the except: the message alone, not a chain of two
    else:
        missing = ""
    if missing:
        pytest.fail(missing, pytrace=False)
    try:
        yield cluster
    finally:
        cluster.destroy()


@pytest.fixture
def postgres_url(postgres_cluster: PostgresCluster) -> Iterator[str]:
    """The SQLAlchemy URL of a fresh, empty database of this test's own in ``postgres_cluster``, dropped
    after it (with any connection the test left open)."""
    with postgres_cluster.scratch_database("test") as url:
        yield url


@pytest.fixture(scope="session")
def postgres_ledger_template(postgres_cluster: PostgresCluster) -> str:
    """The name of a database of ``postgres_cluster`` holding an empty ledger at the newest schema, made
    once per test process by the ledger's own migrations: each ``postgres_ledger_url`` is a copy of it,
    since migrating a fresh database costs each test half a second or more. (The migrations themselves
    are tested on empty databases: tests/store/test_migrate.py.)"""
    from tpuctl.store import Ledger

    name = "ledger_template"
    Ledger.open(postgres_cluster.create_database(name)).close()  # closed: a template must have no sessions
    return name


@pytest.fixture
def postgres_ledger_url(postgres_cluster: PostgresCluster, postgres_ledger_template: str) -> Iterator[str]:
    """The SQLAlchemy URL of this test's own database in ``postgres_cluster``, an empty ledger at the
    newest schema (a copy of ``postgres_ledger_template``), dropped after the test."""
    with postgres_cluster.scratch_database("test", template=postgres_ledger_template) as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def open_ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[..., Ledger]:
    """The test's ledger on each engine: a SQLite file, or an empty ledger of its own in the session's
    PostgreSQL. Each call opens it again (another process's ledger on the same database, in effect)."""
    from tpuctl.store import Ledger, parse_database_url
    from tpuctl.store.database import open_database

    if request.param == "sqlite":
        state = tmp_path / "state"
        return lambda **kwargs: Ledger(state, **kwargs)
    url = parse_database_url(str(request.getfixturevalue("postgres_ledger_url")))

    def on_postgresql(**kwargs: Any) -> Ledger:
        return Ledger(open_database(url), **kwargs)

    return on_postgresql

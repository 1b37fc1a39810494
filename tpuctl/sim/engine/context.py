"""What every part of the engine shares: the database, the clock, the catalog and the world in force."""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Callable

from tpuctl.catalog import Catalog
from tpuctl.errors import TpuctlError
from tpuctl.sim.state import SimDatabase
from tpuctl.sim.vms.layout import chosen_ports, vm_root_for
from tpuctl.sim.world import World

Clock = Callable[[], float]


class Context:
    """The shared state of one engine. Thread-safe; several engines may share one database file."""

    def __init__(self, db: SimDatabase, *, clock: Clock = time.time, catalog: Catalog | None = None) -> None:
        self.db = db
        self.clock = clock
        self.catalog = catalog or Catalog.load()
        self._world: World | None = None
        self._world_version = -1
        self._world_lock = threading.Lock()
        #: Where this state's VMs live (``tpuctl.sim.vms.layout.vm_root_for`` of the state dir).
        self.state_dir = db.path.parent.parent
        self.vm_root = vm_root_for(self.state_dir)
        self._vm_ports: tuple[int, int] | None = None

    @property
    def vm_ports(self) -> tuple[int, int]:
        """(ssh_port, metadata_port) every host serves on: the server's, else this process's choice."""
        return self._vm_ports or chosen_ports()

    @vm_ports.setter
    def vm_ports(self, ports: tuple[int, int]) -> None:
        self._vm_ports = ports

    def install_world(self, world: World | None) -> World:
        """Make ``world`` the one in force (persisted in the state), or with None keep the persisted one
        (the default world on first start). A different world replaces the old one; state is kept."""
        from tpuctl.sim.world import default_world

        now = self.clock()
        with self.db.write() as conn:
            row = conn.execute("SELECT value FROM meta WHERE key = 'world'").fetchone()
            if world is None:
                world = World.model_validate_json(row["value"]) if row is not None else default_world()
            encoded = world.model_dump_json()
            if row is None or row["value"] != encoded:
                self.store_world(conn, encoded)
            conn.execute("INSERT OR IGNORE INTO meta (key, value) VALUES ('epoch', ?)", (repr(now),))
            version = meta_int(conn, "world_version")
        with self._world_lock:
            self._world = world
            self._world_version = version
        return world

    @staticmethod
    def store_world(conn: sqlite3.Connection, encoded: str) -> None:
        """Persist a new world (JSON) inside the caller's transaction; other processes see its version."""
        version = meta_int(conn, "world_version") + 1
        conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('world', ?)", (encoded,))
        conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES ('world_version', ?)", (str(version),))
        # Runtime fault overrides and schedule counts belonged to the old world.
        conn.execute("DELETE FROM meta WHERE key = 'faults'")
        conn.execute("DELETE FROM schedule_fired")

    @property
    def world(self) -> World:
        """The world in force; re-read when another process replaced it (sim reset with a new world)."""
        with self.db.read() as conn:
            version = meta_int(conn, "world_version")
            if version != self._world_version or self._world is None:
                row = conn.execute("SELECT value FROM meta WHERE key = 'world'").fetchone()
                if row is None:
                    raise TpuctlError("the simulator's state has no world; start it with SimServer")
                with self._world_lock:
                    self._world = World.model_validate_json(row["value"])
                    self._world_version = version
        assert self._world is not None
        return self._world


def meta_int(conn: sqlite3.Connection, key: str) -> int:
    row = conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    return int(row["value"]) if row is not None else 0

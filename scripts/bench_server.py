#!/usr/bin/env python3
"""Benchmark: `tpuctl server` over a throwaway PostgreSQL, on a served simulator, in one run.

Three measures, each against its own fresh database of one PostgreSQL cluster (``PostgresCluster``, with
``pg_stat_statements`` loaded), the servers real child processes (`tpuctl server`), the simulator served
by this process with its VMs in a hypervisor process (real sshd sessions, real host processes):

- ``latency``: submit-to-first-step. The same tiny program (one host, v5e-8, ``--no-runtime-deps``)
  run by `tpuctl run` in a fresh client process, through the server (``--server``, the server's ledger
  on PostgreSQL) and in local mode (the supervisor in the client: on its own SQLite ledger, today's
  default, and on the same PostgreSQL), repetitions interleaved (the order rotates each round). The
  time is from the client's spawn to the program's first step, which stamps the wall clock in its own
  line (the simulated host is a process of this machine: one clock); also to the client printing that
  line. Judged: the median through the server over the median in local mode on SQLite (target <= 1.1x).
- ``takeover``: two replicas on one database; a run under one of them; that replica killed with
  SIGKILL by pid; the time from the kill to the other's TAKEOVER row in the run's lease history, against
  the lease length, at two lease lengths (renewal every quarter of the lease). The takeover must come
  after the dead replica's lease expired: the gap after expiry is what the replica's tick adds.
- ``scale``: one replica (``--max-runs`` above the largest level) supervising N concurrent runs of
  one-host slices whose program prints a step line every ``--step-every`` seconds and sleeps between
  (idle hosts, so 200 real simulated hosts fit this machine), at each level of ``--levels``: once all N
  have printed, the replica process's RSS, USS and threads, its CPU seconds over a ``--window``-second
  window, and the database load over the same window (``pg_stat_statements`` calls, transactions and
  rows from ``pg_stat_database``, connections from ``pg_stat_activity``; nothing else touches the
  database during the window). Also what the simulated hosts cost (the hypervisor's memory and the VMs'
  processes). The per-run cost is the slope of a least-squares line over the levels; runs per 8 GiB =
  (8 GiB - intercept) / slope (target >= 500; SkyPilot's controller: 600 per 16 GiB). The lease is the
  default (60 s, renewed every 15 s): what a deployed server runs with.

Writes docs/bench/server.json (or --out) and prints a summary. Run from the repository root:
``nice -n 10 .venv/bin/python scripts/bench_server.py`` (default sizes, ~10 minutes on a loaded 2-core
machine); the full sizes: ``--levels 50,100,200 --latency-rounds 5 --takeover-leases 4,12``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench_machine import machine  # scripts/ is on sys.path: the scripts run by path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

if TYPE_CHECKING:
    from tpuctl.sim import SimAdminClient
    from tpuctl.testing.postgres import PostgresCluster

ZONE = "us-central1-a"
TYPE = "v5e-8"  # one host
GIB = 1024**3
#: The memory a replica is judged against, and the runs it must fit in it.
BUDGET_BYTES = 8 * GIB
TARGET_RUNS_PER_BUDGET = 500
TARGET_LATENCY_RATIO = 1.1
#: SkyPilot's managed-jobs controller, as its docs size it: 600 running jobs per 16 GiB.
SKYPILOT_RUNS_PER_16_GIB = 600

WORLD: dict[str, Any] = {
    "speed": 1000,
    "zones": {ZONE: {"v5e": {"on_demand": 4096, "preemptible": 4096}}},
    "quotas": {
        "default": {"on_demand": {"zone": -1, "region": -1}, "preemptible": {"zone": -1, "region": -1}}
    },
    "latency": {"base_ms": 0, "jitter_ms": 0},
}

#: The latency program: its first step stamps the wall clock, then it ends.
FIRST_STEP = 'import time\nprint(f"step 0 at {time.time():.6f}", flush=True)\n'
#: The takeover program: lines every 0.25 s for ``argv[1]`` seconds on its first attempt; a takeover's
#: attempt ends at once (the measure is the takeover, not the rest of the run).
LONG_THEN_SHORT = """import os, sys, time
first = os.environ.get("TPUCTL_RESTART_COUNT", "0") == "0"
end = time.time() + (float(sys.argv[1]) if first else 0.5)
i = 0
while time.time() < end:
    print(f"step {i} at {time.time():.6f}", flush=True)
    i += 1
    time.sleep(0.25)
"""
#: The scale program: a step line every ``argv[1]`` seconds until the epoch ``argv[2]``, idle between.
IDLE_STEPS = """import sys, time
every, end = float(sys.argv[1]), float(sys.argv[2])
i = 0
while time.time() < end:
    print(f"step {i} at {time.time():.6f}", flush=True)
    i += 1
    time.sleep(every)
"""


# --- pure parts (tests/scripts/test_bench_server.py) ------------------------------------------------


def first_step_epoch(line: str) -> float | None:
    """The wall-clock stamp of a ``step N at EPOCH`` line (with or without the client's ``w0 | ``)."""
    _, sep, rest = line.rpartition("step ")
    if not sep:
        return None
    parts = rest.split()
    if len(parts) != 3 or parts[1] != "at":
        return None
    try:
        return float(parts[2])
    except ValueError:
        return None


def median_ratio(numerator: Sequence[float], denominator: Sequence[float]) -> float | None:
    """median(numerator) / median(denominator); None when either side is empty."""
    if not numerator or not denominator:
        return None
    return round(statistics.median(numerator) / statistics.median(denominator), 3)


@dataclass(frozen=True)
class Line:
    """A least-squares line y = intercept + slope * x."""

    intercept: float
    slope: float


def fit_line(xs: Sequence[float], ys: Sequence[float]) -> Line:
    """Least squares over the points (at least two distinct x)."""
    if len(xs) != len(ys) or len(set(xs)) < 2:
        raise ValueError("a line needs two distinct x values")
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    return Line(my - slope * mx, slope)


def runs_within(budget: float, line: Line) -> int | None:
    """How many runs fit ``budget`` of a resource that costs ``line`` per run count (None: no per-run
    cost measured, the slope not positive)."""
    if line.slope <= 0:
        return None
    return max(0, int((budget - line.intercept) / line.slope))


def parse_levels(text: str) -> list[int]:
    """``50,100,200`` -> [50, 100, 200]: at least two distinct positive counts, ascending."""
    levels = sorted({int(part) for part in text.split(",") if part.strip()})
    if len(levels) < 2 or levels[0] < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give two or more positive counts, e.g. 50,100,200")
    return levels


def parse_leases(text: str) -> list[float]:
    """``4,12`` -> [4.0, 12.0]: lease lengths in seconds (each at least 2 s: renewed every quarter)."""
    leases = sorted({float(part) for part in text.split(",") if part.strip()})
    if not leases or leases[0] < 2:
        raise argparse.ArgumentTypeError(f"{text!r}: give lease lengths of 2 s or more, e.g. 4,12")
    return leases


# --- processes ----------------------------------------------------------------------------------------


@dataclass
class ProcSample:
    """One process's memory and CPU, read from /proc."""

    rss_bytes: int
    uss_bytes: int
    cpu_s: float
    threads: int


def sample_process(pid: int) -> ProcSample:
    status = Path(f"/proc/{pid}/status").read_text()
    values = {k: v.split() for k, _, v in (line.partition(":") for line in status.splitlines())}
    rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
    private = sum(int(line.split()[1]) * 1024 for line in rollup.splitlines() if line.startswith("Private_"))
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return ProcSample(
        rss_bytes=int(values["VmRSS"][0]) * 1024,
        uss_bytes=private,
        cpu_s=(int(stat[11]) + int(stat[12])) / ticks,  # utime + stime of every thread
        threads=int(values["Threads"][0]),
    )


def vm_processes_pss(vm_root: Path) -> tuple[int, int]:
    """(count, total PSS: shared pages split among their sharers) of the processes this simulator's VMs
    run: those whose VM marker (the sshd puts ``TPUCTL_SIM_VM=<uid>/<worker>`` in every session's
    environment) names a disk under its VM root (other simulators on the machine have their own)."""
    needle = b"\0TPUCTL_SIM_VM="
    count = total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = b"\0" + (entry / "environ").read_bytes()
            at = environ.find(needle)
            if at < 0:
                continue
            value = environ[at + len(needle) :].split(b"\0", 1)[0].decode()
            uid, _, worker = value.partition("/")
            if not (vm_root / "disks" / f"{uid}-{worker}").exists():
                continue
            for line in (entry / "smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1]) * 1024
            count += 1
        except (OSError, UnicodeDecodeError):
            continue
    return count, total


@dataclass(frozen=True)
class Sim:
    """The served simulator: its URL, its admin client and its state dir."""

    url: str
    admin: SimAdminClient
    state: Path


@dataclass
class Place:
    """One database, the simulator, and the environments of servers and clients."""

    tmp: Path
    database: str
    sim: Sim
    started: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def base_env(self) -> dict[str, str]:
        """Every client's and server's environment: the served simulator, and its state dir as theirs.
        The simulator backend finds Cloud Storage's emulator at an address made from the caller's state
        dir; a caller with another dir gets connection refused at the checkpoint bucket's checks, which
        retry for ~1.8 s and then let the run go ahead (on Google the address is fixed)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("TPUCTL_")}
        env["TPUCTL_SIM_URL"] = self.sim.url
        env["TPUCTL_STATE_DIR"] = str(self.sim.state)
        return env

    def server_env(self, lease_s: float | None, secret: str) -> dict[str, str]:
        env = {
            **self.base_env(),
            "TPUCTL_DATABASE_URL": self.database,
            "TPUCTL_SECRET_KEY": secret,
        }
        if lease_s is not None:
            env["TPUCTL_LEASE_DURATION"] = f"{lease_s:g}"
            env["TPUCTL_LEASE_RENEW_EVERY"] = f"{lease_s / 4:g}"
        return env

    def start_server(self, env: dict[str, str], *, max_runs: int = 50) -> tuple[subprocess.Popen[bytes], str]:
        import httpx

        from tpuctl.testing.ports import unused_port

        url = f"http://127.0.0.1:{unused_port()}"
        log = (self.tmp / f"server-{len(self.started)}.log").open("wb")
        argv = [
            sys.executable,
            "-m",
            "tpuctl",
            "server",
            "--listen",
            url.removeprefix("http://"),
            "--max-runs",
            str(max_runs),
        ]
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.started.append(proc)

        def ready() -> bool:
            if proc.poll() is not None:
                raise SystemExit(f"server exited {proc.returncode}: see {log.name}")
            try:
                return httpx.get(f"{url}/readyz", timeout=2).status_code == 200
            except httpx.TransportError:
                return False

        wait(ready, 120, "the server to be ready")
        return proc, url

    def stop_all(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.started:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def wait(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(interval)
    raise SystemExit(f"timed out after {timeout:g} s waiting for {what}")


def program_dir(tmp: Path, name: str, text: str) -> Path:
    directory = tmp / f"prog-{name}"
    directory.mkdir(exist_ok=True)
    (directory / "prog.py").write_text(text)
    return directory


def submit(url: str, directory: Path, args: list[str], *, client: Any = None) -> str:
    """Submit ``directory/prog.py`` with ``args`` to the server at ``url`` (a detached run); its id."""
    from tpuctl.client.api import ServerClient
    from tpuctl.hosts.bundle import build_bundle
    from tpuctl.server.wire import SubmitRun

    data = build_bundle(directory, limit_bytes=1 << 20).tar_gz()
    import hashlib

    sha = hashlib.sha256(data).hexdigest()
    job = {
        "script": "prog.py",
        "args": args,
        "runtime_deps": False,
        "resources": {"accelerators": TYPE, "zone": ZONE},
    }
    with contextlib.ExitStack() as stack:
        api = client if client is not None else stack.enter_context(ServerClient(url))
        api.upload_bundle(sha, data)
        body = SubmitRun(job=job, bundle_sha256=sha, script_in_bundle="prog.py")
        return str(api.submit(body, key=str(uuid.uuid4())).run.run_id)


# --- latency ------------------------------------------------------------------------------------------


def one_client_run(env: dict[str, str], script: Path, database: str) -> dict[str, float]:
    """`tpuctl run script` in a fresh process: spawn -> the program's first step, and -> its line shown;
    from ``database`` (the run's ledger), spawn -> the run recorded and -> its lease first claimed."""
    argv = [
        sys.executable,
        "-m",
        "tpuctl",
        "run",
        str(script),
        "--type",
        TYPE,
        "--zone",
        ZONE,
        "--no-runtime-deps",
    ]
    spawned = time.time()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    step_at = shown_at = None
    output: list[str] = []
    for raw in proc.stdout:
        line = raw.decode(errors="replace").rstrip()
        output.append(line)
        if step_at is None and (stamp := first_step_epoch(line)) is not None:
            step_at, shown_at = stamp, time.time()
    code = proc.wait(timeout=300)
    if code != 0 or step_at is None or shown_at is None:
        raise SystemExit(f"run exited {code}:\n" + "\n".join(output[-30:]))
    from tpuctl.store.ledger import Ledger

    with Ledger.open(database) as ledger:
        run = ledger.list_runs(limit=1)[0]
        claimed = ledger.lease_history(run.run_id)[0].at
    return {
        "to_recorded_s": round(run.created_at - spawned, 3),
        "to_claimed_s": round(claimed - spawned, 3),
        "to_first_step_s": round(step_at - spawned, 3),
        "to_line_shown_s": round(shown_at - spawned, 3),
        "wall_s": round(time.time() - spawned, 3),
    }


def bench_latency(cluster: PostgresCluster, sim: Sim, tmp: Path, rounds: int) -> dict[str, Any]:
    from tpuctl.store.secrets import generate_key

    place = Place(tmp, cluster.create_database("latency_server"), sim)
    secret = generate_key().decode("ascii")
    try:
        _, url = place.start_server(place.server_env(None, secret))
        script = program_dir(tmp, "latency", FIRST_STEP) / "prog.py"
        envs = {
            "server": {**place.base_env(), "TPUCTL_SERVER": url},
            "local_sqlite": place.base_env(),
            "local_postgresql": {
                **place.base_env(),
                "TPUCTL_DATABASE_URL": cluster.create_database("latency_local"),
                "TPUCTL_SECRET_KEY": secret,
            },
        }
        ledgers = {
            "server": place.database,
            "local_sqlite": f"sqlite:///{sim.state / 'ledger.db'}",
            "local_postgresql": envs["local_postgresql"]["TPUCTL_DATABASE_URL"],
        }
        modes = list(envs)
        for mode in modes:
            # Not counted: the page cache, the image's first logins, and the modules a server imports at
            # its first run (a server that has been up a while has them).
            one_client_run(envs[mode], script, ledgers[mode])
        results: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
        for r in range(rounds):
            order = modes[r % len(modes) :] + modes[: r % len(modes)]
            for mode in order:
                results[mode].append(one_client_run(envs[mode], script, ledgers[mode]))
                print(f"latency round {r + 1} {mode}: {results[mode][-1]}", flush=True)
    finally:
        place.stop_all()
    step = {m: [x["to_first_step_s"] for x in rs] for m, rs in results.items()}
    shown = {m: [x["to_line_shown_s"] for x in rs] for m, rs in results.items()}
    phases = ("to_recorded_s", "to_claimed_s", "to_first_step_s", "to_line_shown_s", "wall_s")
    return {
        "median_by_phase_s": {
            m: {k: round(statistics.median(x[k] for x in rs), 3) for k in phases} for m, rs in results.items()
        },
        "rounds": rounds,
        "runs": results,
        "median_to_first_step_s": {m: round(statistics.median(v), 3) for m, v in step.items()},
        "median_to_line_shown_s": {m: round(statistics.median(v), 3) for m, v in shown.items()},
        "ratio_server_over_local_sqlite": median_ratio(step["server"], step["local_sqlite"]),
        "ratio_server_over_local_postgresql": median_ratio(step["server"], step["local_postgresql"]),
        "ratio_shown_server_over_local_sqlite": median_ratio(shown["server"], shown["local_sqlite"]),
        "target_ratio": TARGET_LATENCY_RATIO,
    }


# --- takeover -----------------------------------------------------------------------------------------


def one_takeover(
    cluster: PostgresCluster, sim: Sim, tmp: Path, lease_s: float, name: str
) -> dict[str, float]:
    from tpuctl.store.ledger import Ledger
    from tpuctl.store.records import LeaseAction
    from tpuctl.store.secrets import generate_key

    place = Place(tmp / name, cluster.create_database(name), sim)
    place.tmp.mkdir()
    env = place.server_env(lease_s, generate_key().decode("ascii"))
    try:
        a, a_url = place.start_server(env)
        b, _ = place.start_server(env)
        run_id = submit(a_url, program_dir(place.tmp, "takeover", LONG_THEN_SHORT), [f"{2 * lease_s + 60:g}"])
        with Ledger.open(place.database) as ledger:

            def holder() -> int | None:
                held = ledger.lease_of(run_id)
                return held.owner.pid if held is not None and len(ledger.log_lines(run_id)) >= 2 else None

            pid = wait(holder, 180, "a replica to run the program")
            victim, survivor = (a, b) if pid == a.pid else (b, a)
            victim.send_signal(signal.SIGKILL)
            killed_at = time.time()
            victim.wait(timeout=10)
            last = ledger.lease_of(run_id)
            assert last is not None and last.owner.pid == victim.pid

            def taken() -> Any:
                assert survivor.poll() is None, "the surviving replica died"
                return next(
                    (h for h in ledger.lease_history(run_id) if h.action is LeaseAction.TAKEOVER), None
                )

            takeover = wait(taken, 3 * lease_s + 60, "the takeover", interval=0.02)
    finally:
        place.stop_all()
    if takeover.owner.pid != survivor.pid or takeover.at < last.expires_at:
        raise SystemExit(f"takeover {takeover} before the lease's expiry {last.expires_at}")
    return {
        "kill_to_takeover_s": round(takeover.at - killed_at, 3),
        "kill_to_expiry_s": round(last.expires_at - killed_at, 3),
        "expiry_to_takeover_s": round(takeover.at - last.expires_at, 3),
    }


def bench_takeover(
    cluster: PostgresCluster, sim: Sim, tmp: Path, leases: list[float], reps: int
) -> dict[str, Any]:
    out: dict[str, Any] = {"reps": reps, "leases": {}}
    for lease_s in leases:
        rows = []
        for rep in range(reps):
            name = f"takeover_{int(lease_s * 1000)}_{rep}"
            rows.append(one_takeover(cluster, sim, tmp, lease_s, name))
            print(f"takeover lease {lease_s:g} s rep {rep + 1}: {rows[-1]}", flush=True)
        kill_to = [r["kill_to_takeover_s"] for r in rows]
        out["leases"][f"{lease_s:g}"] = {
            "lease_s": lease_s,
            "renew_every_s": lease_s / 4,
            "rows": rows,
            "median_kill_to_takeover_s": round(statistics.median(kill_to), 3),
            "median_over_lease": round(statistics.median(kill_to) / lease_s, 3),
            "median_expiry_to_takeover_s": round(
                statistics.median(r["expiry_to_takeover_s"] for r in rows), 3
            ),
        }
    return out


# --- scale --------------------------------------------------------------------------------------------


def pg_stats(cluster: PostgresCluster, database: str) -> dict[str, Any]:
    """The database's counters and connections, read over a connection to the ``postgres`` database (so
    that reading them adds nothing to what they count)."""
    import psycopg

    with psycopg.connect(f"host=127.0.0.1 port={cluster.port} user=postgres dbname=postgres") as conn:
        row = conn.execute(
            "SELECT xact_commit, xact_rollback, tup_returned, tup_fetched, tup_inserted, tup_updated,"
            " tup_deleted FROM pg_stat_database WHERE datname = %s",
            (database,),
        ).fetchone()
        names = (
            "xact_commit",
            "xact_rollback",
            "tup_returned",
            "tup_fetched",
            "tup_inserted",
            "tup_updated",
            "tup_deleted",
        )
        counters = dict(zip(names, row or (0,) * len(names), strict=True))
        calls = conn.execute(
            "SELECT coalesce(sum(calls), 0) FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid"
            " WHERE d.datname = %s",
            (database,),
        ).fetchone()
        per_statement = conn.execute(
            "SELECT s.query, sum(s.calls) FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid"
            " WHERE d.datname = %s GROUP BY s.query",
            (database,),
        ).fetchall()
        states = conn.execute(
            "SELECT coalesce(state, '?'), count(*) FROM pg_stat_activity WHERE datname = %s GROUP BY 1",
            (database,),
        ).fetchall()
    return {
        **counters,
        "statement_calls": int(calls[0]) if calls else 0,
        "connections": {str(s): int(n) for s, n in states},
        "statements": {str(q): int(n) for q, n in per_statement},
        "at": time.time(),
    }


def top_statements(
    before: dict[str, Any], after: dict[str, Any], runs: int, top: int = 8
) -> list[dict[str, Any]]:
    """The statements called most between two ``pg_stats`` readings: calls per second per run, and the
    statement's text (shortened)."""
    span = after["at"] - before["at"]
    deltas = [(n - before["statements"].get(q, 0), q) for q, n in after["statements"].items()]
    deltas.sort(reverse=True)
    return [
        {"calls_per_s_per_run": round(d / span / runs, 4), "query": " ".join(q.split())[:160]}
        for d, q in deltas[:top]
        if d > 0
    ]


def rates(before: dict[str, Any], after: dict[str, Any]) -> dict[str, float]:
    """Per-second rates of the counters between two ``pg_stats`` readings."""
    span = after["at"] - before["at"]
    keys = [k for k, v in before.items() if isinstance(v, int)]
    return {f"{k}_per_s": round((after[k] - before[k]) / span, 2) for k in keys}


def bench_scale(
    cluster: PostgresCluster,
    sim: Sim,
    tmp: Path,
    levels: list[int],
    window_s: float,
    step_every_s: float,
    level_timeout_s: float,
) -> dict[str, Any]:
    from tpuctl.client.api import ServerClient
    from tpuctl.store.ledger import Ledger
    from tpuctl.store.secrets import generate_key

    database = "scale"
    place = Place(tmp / "scale", cluster.create_database(database), sim)
    place.tmp.mkdir()
    hypervisor = _hypervisor_pid(sim.state)
    vm_root = _vm_root(sim.state)
    idle_hosts = vm_processes_pss(vm_root)
    server, url = place.start_server(
        place.server_env(None, generate_key().decode("ascii")), max_runs=levels[-1] + 10
    )
    directory = program_dir(place.tmp, "scale", IDLE_STEPS)
    # Long enough for every level's start-up and window; the hosts are torn down with the simulator.
    end = time.time() + 3 * 3600
    rows: list[dict[str, Any]] = []
    run_ids: list[str] = []
    seen: set[str] = set()  # runs whose program has printed
    baseline = {
        "replica": sample_process(server.pid).__dict__,
        "hypervisor": _hv(hypervisor),
        "vm_processes": idle_hosts,
    }
    not_reached: dict[str, Any] | None = None
    try:
        with ServerClient(url) as api, Ledger.open(place.database) as ledger:
            for level in levels:
                started = time.monotonic()
                while len(run_ids) < level:
                    run_ids.append(submit(url, directory, [f"{step_every_s:g}", f"{end:.0f}"], client=api))

                def printing(level: int = level) -> bool:
                    assert server.poll() is None, "the server died"
                    seen.update(r for r in run_ids if r not in seen and ledger.log_lines(r, worker=0))
                    return len(seen) >= level

                try:
                    wait(printing, level_timeout_s, f"{level} runs to print", interval=2.0)
                except SystemExit:
                    # The replica could not bring this many up (its own runs' leases lapsing, say): what
                    # it did reach is the finding; the levels above are not tried.
                    not_reached = {
                        "runs": level,
                        "printing": len(seen),
                        "after_s": level_timeout_s,
                        "takeovers": takeovers(ledger, run_ids),
                    }
                    print(f"scale {level}: not reached: {not_reached}", flush=True)
                    break
                up_s = time.monotonic() - started
                time.sleep(min(5.0, window_s / 4))  # the last ones' start-up settles
                rows.append(
                    _window(cluster, database, server.pid, hypervisor, vm_root, level, window_s, up_s)
                )
                # After the window (reading the ledger adds to its load): runs this replica lost and
                # took over again, its renewals having come too late.
                rows[-1]["takeovers_so_far"] = takeovers(ledger, run_ids)
                print(f"scale {level}: {json.dumps(rows[-1])}", flush=True)
    finally:
        place.stop_all()
    return {
        "not_reached": not_reached,
        "levels": levels,
        "window_s": window_s,
        "step_every_s": step_every_s,
        "baseline": baseline,
        "rows": rows,
        **extrapolate(rows),
    }


def takeovers(ledger: Any, run_ids: list[str]) -> int:
    """How many times the runs were taken over (each a lease that lapsed under its supervisor)."""
    from tpuctl.store.records import LeaseAction

    return sum(1 for r in run_ids for h in ledger.lease_history(r) if h.action is LeaseAction.TAKEOVER)


def _window(
    cluster: PostgresCluster,
    database: str,
    pid: int,
    hypervisor: int | None,
    vm_root: Path,
    level: int,
    window_s: float,
    up_s: float,
) -> dict[str, Any]:
    db0, p0, sim0 = pg_stats(cluster, database), sample_process(pid), sample_process(os.getpid())
    time.sleep(window_s)
    db1, p1, sim1 = pg_stats(cluster, database), sample_process(pid), sample_process(os.getpid())
    vm_count, vm_pss = vm_processes_pss(vm_root)
    return {
        "runs": level,
        "start_up_s": round(up_s, 1),
        "replica": {
            "rss_bytes": p1.rss_bytes,
            "uss_bytes": p1.uss_bytes,
            "threads": p1.threads,
            "cpu_s_per_s": round((p1.cpu_s - p0.cpu_s) / window_s, 4),
        },
        "database": {
            **rates(db0, db1),
            "connections": db1["connections"],
            "top_statements": top_statements(db0, db1, level),
        },
        # This process serves the simulator's API (the supervisors' polls of their slices land here).
        "simulator_api_cpu_s_per_s": round((sim1.cpu_s - sim0.cpu_s) / window_s, 4),
        "hypervisor": _hv(hypervisor),
        "vm_processes": {"count": vm_count, "pss_bytes": vm_pss},
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def _hv(pid: int | None) -> dict[str, int] | None:
    if pid is None:
        return None
    sample = sample_process(pid)
    return {"rss_bytes": sample.rss_bytes, "uss_bytes": sample.uss_bytes, "threads": sample.threads}


def _vm_root(sim_state: Path) -> Path:
    from tpuctl.sim.vms.layout import vm_root_for

    return vm_root_for(sim_state)


def _hypervisor_pid(sim_state: Path) -> int | None:
    from tpuctl.sim.hypervisor import hypervisor_pid
    from tpuctl.sim.vms.layout import vm_root_for

    return hypervisor_pid(vm_root_for(sim_state))


def extrapolate(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per-run costs (the slopes over the levels) and what fits a replica's budget."""
    if len(rows) < 2:
        return {}
    xs = [float(r["runs"]) for r in rows]
    rss = fit_line(xs, [float(r["replica"]["rss_bytes"]) for r in rows])
    uss = fit_line(xs, [float(r["replica"]["uss_bytes"]) for r in rows])
    cpu = fit_line(xs, [float(r["replica"]["cpu_s_per_s"]) for r in rows])
    qps = fit_line(xs, [float(r["database"]["statement_calls_per_s"]) for r in rows])
    tps = fit_line(xs, [float(r["database"]["xact_commit_per_s"]) for r in rows])
    return {
        "per_run": {
            "rss_bytes": round(rss.slope),
            "uss_bytes": round(uss.slope),
            "cpu_s_per_s": round(cpu.slope, 6),
            "statements_per_s": round(qps.slope, 3),
            "commits_per_s": round(tps.slope, 3),
        },
        "intercept": {"rss_bytes": round(rss.intercept), "uss_bytes": round(uss.intercept)},
        "runs_per_8_gib_rss": runs_within(BUDGET_BYTES, rss),
        "runs_per_8_gib_uss": runs_within(BUDGET_BYTES, uss),
        "runs_per_core": runs_within(1.0, cpu),
        "target_runs_per_8_gib": TARGET_RUNS_PER_BUDGET,
        "skypilot_runs_per_8_gib": SKYPILOT_RUNS_PER_16_GIB // 2,
    }


# --- the report's rows (scripts/bench_report.py) -------------------------------------------------------

Row = tuple[str, str, str, str]  # figure, value, target, note


def _s(value: Any, digits: int = 2) -> str:
    return f"{value:.{digits}f} s" if isinstance(value, int | float) else "n/a"


def _mib(value: Any) -> str:
    return f"{value / 2**20:.2f} MiB" if isinstance(value, int | float) else "n/a"


def report_rows(d: dict[str, Any]) -> list[Row]:
    """The rows of docs/benchmarks.md for one run's figures (any measure missing: no row for it)."""
    rows: list[Row] = []
    if "latency" in d:
        rows.append(_latency_row(d["latency"]))
    if "takeover" in d:
        rows.append(_takeover_row(d["takeover"]))
    if "scale" in d and "per_run" in d["scale"]:
        rows += _scale_rows(d["scale"])
    return rows


def _latency_row(lat: dict[str, Any]) -> Row:
    med = lat["median_by_phase_s"]
    phases = "; ".join(
        f"{mode}: recorded {_s(m['to_recorded_s'])}, claimed {_s(m['to_claimed_s'])}, first step "
        f"{_s(m['to_first_step_s'])}, shown {_s(m['to_line_shown_s'])}"
        for mode, m in med.items()
    )
    return (
        "submit-to-first-step through the server / local mode (SQLite), medians",
        f"{lat['ratio_server_over_local_sqlite']:.2f}x ({_s(med['server']['to_first_step_s'])} / "
        f"{_s(med['local_sqlite']['to_first_step_s'])})",
        f"≤ {lat['target_ratio']}x",
        f"{lat['rounds']} interleaved rounds of a one-host v5e-8 run of a program that stamps its first step,"
        f" from the client's spawn; against local mode on the same PostgreSQL "
        f"{lat['ratio_server_over_local_postgresql']:.2f}x; to the line shown by the client "
        f"{lat['ratio_shown_server_over_local_sqlite']:.2f}x. Medians from the spawn: {phases}",
    )


def _takeover_row(tk: dict[str, Any]) -> Row:
    parts = []
    for lease in tk["leases"].values():
        parts.append(
            f"lease {lease['lease_s']:g} s: {_s(lease['median_kill_to_takeover_s'])} "
            f"({lease['median_over_lease']:.2f}x the lease)"
        )
    gaps = ", ".join(
        f"{_s(row['expiry_to_takeover_s'])}" for lease in tk["leases"].values() for row in lease["rows"]
    )
    return (
        "a replica killed (SIGKILL) → another's TAKEOVER in the lease history, median",
        "; ".join(parts),
        "after the lease expires",
        f"{tk['reps']} kill(s) per lease length; renewal every quarter of the lease, so the dead replica's "
        f"lease expires 0.75-1x the lease after the kill; every takeover came after that expiry, by "
        f"{gaps} (the surviving replica's tick, every min(renewal, 2 s), then taking the run up)",
    )


def _scale_rows(sc: dict[str, Any]) -> list[Row]:
    per, last = sc["per_run"], sc["rows"][-1]
    levels = "/".join(str(r["runs"]) for r in sc["rows"])
    rss = " / ".join(_mib(r["replica"]["rss_bytes"]) for r in sc["rows"])
    cpu = " / ".join(f"{r['replica']['cpu_s_per_s']:.3f}" for r in sc["rows"])
    qps = " / ".join(f"{r['database']['statement_calls_per_s']:.0f}" for r in sc["rows"])
    threads = " / ".join(str(r["replica"]["threads"]) for r in sc["rows"])
    conns = sum(last["database"]["connections"].values())
    missed = sc.get("not_reached")
    beyond = (
        f"; {missed['runs']} runs NOT reached: {missed['printing']} printing after {missed['after_s']:g} s, "
        f"{missed['takeovers']} takeover(s) of its own runs (renewals too late)"
        if missed
        else ""
    )
    return [
        (
            f"runs one replica supervises in 8 GiB (RSS), from {levels} concurrent one-host runs",
            f"{sc['runs_per_8_gib_rss']} by memory (USS: {sc['runs_per_8_gib_uss']}); but CPU bounds it: "
            f"{sc['runs_per_core']} runs per core",
            f"≥ {sc['target_runs_per_8_gib']} (SkyPilot: {sc['skypilot_runs_per_8_gib']} per 8 GiB)",
            f"the replica process's RSS {rss} at {levels} runs: {_mib(per['rss_bytes'])} per run (USS "
            f"{_mib(per['uss_bytes'])}) over {_mib(sc['intercept']['rss_bytes'])} at none (least squares);"
            f" threads {threads}{beyond}",
        ),
        (
            f"the replica's CPU and the database load per supervised run ({levels} runs)",
            f"{per['cpu_s_per_s'] * 1000:.1f} ms CPU/s, {per['statements_per_s']:.2f} statements/s, "
            f"{per['commits_per_s']:.2f} commits/s per run",
            "",
            f"CPU seconds per second {cpu}, statements per second {qps}, over {sc['window_s']:g} s windows "
            f"(pg_stat_statements); {conns} connection(s) at {last['runs']} runs; one core fits "
            f"{sc['runs_per_core']} runs; each program prints a step every {sc['step_every_s']:g} s",
        ),
    ]


# --- main ---------------------------------------------------------------------------------------------


@contextlib.contextmanager
def simulator(state: Path) -> Iterator[Sim]:
    from tpuctl.sim import SimAdminClient, SimServer
    from tpuctl.sim.world import world_from_data

    state.mkdir(parents=True)
    server = SimServer(state, world_from_data(WORLD, "bench world"), vms="hypervisor")
    url = server.start()
    admin = SimAdminClient(url)
    try:
        yield Sim(url, admin, state)
    finally:
        admin.close()
        server.stop()
        _stop_vms(state)


def _stop_vms(state: Path) -> None:
    """Stop the simulator's hypervisor, kill what its VMs still run (their programs outlive it), and
    remove their root."""
    from tpuctl.sim.hypervisor import stop_hypervisor
    from tpuctl.sim.vms.layout import vm_root_for

    vm_root = vm_root_for(state)
    stop_hypervisor(vm_root, timeout_s=30)
    prefix = str(vm_root) + os.sep
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            with contextlib.suppress(OSError):
                if os.readlink(entry / "cwd").startswith(prefix):
                    os.kill(int(entry.name), signal.SIGKILL)
    shutil.rmtree(vm_root, ignore_errors=True)  # the disks and image of a simulator that is gone


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measures", default="latency,takeover,scale", help="which of the three to run")
    parser.add_argument("--latency-rounds", type=int, default=3)
    parser.add_argument("--takeover-leases", type=parse_leases, default=[4.0, 12.0])
    parser.add_argument("--takeover-reps", type=int, default=1)
    parser.add_argument(
        "--levels",
        type=parse_levels,
        default=[10, 20, 40],
        help="concurrent runs per level (full size: 50,100,200)",
    )
    parser.add_argument("--window", type=float, default=30.0, help="seconds of each scale level's window")
    parser.add_argument("--step-every", type=float, default=10.0, help="the scale program's step period")
    parser.add_argument(
        "--level-timeout", type=float, default=900.0, help="seconds for a scale level's runs to start"
    )
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "bench" / "server.json")
    args = parser.parse_args(argv)
    measures = {m.strip() for m in args.measures.split(",")}

    from tpuctl.testing.postgres import PostgresCluster

    load_start = [round(x, 2) for x in os.getloadavg()]
    started = time.time()
    result: dict[str, Any] = {}
    settings = {"shared_preload_libraries": "'pg_stat_statements'", "max_connections": "400"}
    with (
        tempfile.TemporaryDirectory(prefix="bench-server-") as tmp_name,
        PostgresCluster.start(settings=settings) as cluster,
    ):
        tmp = Path(tmp_name)
        _stat_statements(cluster)
        with simulator(tmp / "sim") as sim:
            if "latency" in measures:
                result["latency"] = bench_latency(cluster, sim, tmp, args.latency_rounds)
                _save(args.out, result, load_start, started)
            if "takeover" in measures:
                result["takeover"] = bench_takeover(
                    cluster, sim, tmp, args.takeover_leases, args.takeover_reps
                )
                _save(args.out, result, load_start, started)
            if "scale" in measures:
                result["scale"] = bench_scale(
                    cluster, sim, tmp, args.levels, args.window, args.step_every, args.level_timeout
                )
    _save(args.out, result, load_start, started)
    print(json.dumps({k: v for k, v in result.items() if k != "scale"}, indent=1)[:3000])
    print(f"wrote {args.out}")
    return 0


def _save(out: Path, result: dict[str, Any], load_start: list[float], started: float) -> None:
    """Write what is measured so far (a later measure that fails leaves the earlier ones' figures)."""
    result["settings"] = {
        "world_speed": WORLD["speed"],
        "type": TYPE,
        "load_average_start": load_start,
        "load_average_end": [round(x, 2) for x in os.getloadavg()],
        "took_s": round(time.time() - started, 1),
        "argv": sys.argv[1:],
    }
    result["machine"] = machine()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")


def _stat_statements(cluster: PostgresCluster) -> None:
    import psycopg

    with psycopg.connect(
        f"host=127.0.0.1 port={cluster.port} user=postgres dbname=postgres", autocommit=True
    ) as conn:
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")


if __name__ == "__main__":
    raise SystemExit(main())

"""Real implementations of tpuctl's interfaces for tests, as httpx ships ``MockTransport``.

- ``clock``: ``FakeClock`` (simulated time that only moves when told) and ``wait_for`` (a bounded
  real-time poll, for waits on real processes and files).
- ``cli``: ``invoke``, the one in-process runner of the ``tpuctl`` command line.
- ``cloud``: ``InProcessSim``, a simulator engine on a fake clock, and the real ``TpuApiCloud`` over its
  route table, with no socket.
- ``ports``: ``unused_port``, a loopback port for a child process to bind, drawn outside the
  ephemeral range so that no outgoing connection takes it first.
- ``postgres``: ``PostgresCluster``, a throwaway PostgreSQL server on loopback (run as ``nobody`` under
  root) with a database per test; the ``postgres_cluster`` and ``postgres_url`` fixtures wrap it.
- ``backend``: ``InProcessBackend``, a ``tpuctl.backends.base.Backend`` over ``InProcessSim`` that the CLI
  runner hands down to every session (``InProcessCli``): commands on simulated time, no server.

Nothing here is imported by tpuctl itself; each module imports what it needs when it is used.
"""

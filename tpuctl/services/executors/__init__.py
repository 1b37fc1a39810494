"""Executors: how a launched program gets onto the hosts of a slice and runs there.

One interface (:class:`~tpuctl.services.executors.base.Executor`) with two implementations:

- ``sim.SimExecutor``: one local process per simulated host (the simulator's hosts), and
- ``ssh.SshExecutor``: asyncssh to every worker of a real slice.

Submodules are imported on demand (asyncssh is heavy and only the SSH path needs it).
"""

from __future__ import annotations

"""Hosts: how a launched program (its bundle, ``bundle``) gets onto the hosts of a slice and runs there.

Below the services and beside the backends (a backend builds the executor for its local hosts), so
neither reaches up into the services. One interface (:class:`~tpuctl.hosts.base.Executor`) with two
implementations:

- ``sim.SimExecutor``: one local process per simulated host (the simulator's hosts), and
- ``ssh.SshExecutor``: asyncssh to every worker of a real slice.

Submodules are imported on demand (asyncssh is heavy and only the SSH path needs it).
"""

from __future__ import annotations

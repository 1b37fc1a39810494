"""Hosts: how a launched program (its bundle, ``bundle``) gets onto the hosts of a slice and runs there.

Below the services and beside the backends, so neither reaches up into the services. One interface
(:class:`~tpuctl.hosts.base.Executor`) and one implementation, ``ssh.SshExecutor``: asyncssh to every
worker of a slice, simulated or real (a simulated host is a VM with its own sshd). ``setup`` writes what
a host runs after each provision; ``follow`` is what runs on a host to keep the program detached from SSH.

Submodules are imported on demand (asyncssh is heavy and only the SSH path needs it).
"""

from __future__ import annotations

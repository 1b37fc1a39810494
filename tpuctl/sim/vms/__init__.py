"""The simulated hosts as VMs, served by the simulator process.

Each host of a READY node gets a distinct loopback address (``layout.host_address``), its own disk outside
tpuctl's state dir (``disks``), an asyncssh sshd and a metadata server on that address (``fleet``). What
runs on a host is found through /proc (``procs``): preemption, stop and delete reach every process of the
VM, not only the ones tpuctl started.
"""

"""Compute Engine's surface of the simulated cloud, for TPU VMs (``/compute/v1/projects/{p}/...``, as
google-cloud-compute's REST transport sends it).

One engine, two surfaces: a Compute Engine slice (one instance, or the instances of one MIG) is a row of
the engine's ``nodes`` table marked ``surface = 'compute'``, so capacity pools, world durations, the
preemption timeline and the fleet that serves hosts are the TPU API's. The TPU API does not see those
rows (docs/google-facts.md#two-surfaces). Instances, instance templates, resource policies, MIGs and
operations are rows of ``compute_resources`` and ``compute_operations`` (``tpuctl.sim.state``).

- ``errors``, ``links``: Compute's error bodies and its URLs, ids and timestamps;
- ``machines``: zones and the TPU machine types they offer;
- ``quota``: Compute Engine's TPU quotas (checks and the Cloud Quotas view);
- ``operations``: zonal, regional and global operations;
- ``specs``: an instance's (or a template's) properties, parsed and validated;
- ``slices``: placing a slice's node row, and the instances' JSON;
- ``instances``, ``groups`` (templates, workload policies, MIGs): the resources;
- ``progress``: what time does to them (the timeline's step), preemption included;
- ``metadata``: what a Compute Engine TPU VM's metadata server answers;
- ``routes``: the route table.
"""

from tpuctl.sim.compute.service import ComputeService

__all__ = ["ComputeService"]

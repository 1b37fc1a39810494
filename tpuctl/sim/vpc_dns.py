"""The simulated VPC's internal DNS: a stand-in, served by each simulated VM's metadata server under
``/tpuctl-sim/v1/resolve/<name>`` (a path of this simulator's own, nowhere in Google's metadata API).

Why: Compute Engine's ``worker-network-endpoints`` is bare instance names
(docs/google-facts.md#metadata-server). On a real VM they resolve through the VPC's internal DNS, whose
resolver is the metadata server (169.254.169.254 in resolv.conf) with the search domain
``ZONE.c.PROJECT.internal``. Simulated VMs are loopback addresses on one machine, whose resolver knows none of
those names, and the simulator must not touch machine-global state (/etc/hosts, resolv.conf). So the resolver
is, as on GCE, the VM's own metadata server, which knows which VM asks (the address the request arrived on)
and so its project and zone; a simulated host's program asks it (``tpuctl.runtime.simcluster.resolve``).

What resolves, as zonal DNS does: a bare NAME (through the search domain ``ZONE.c.PROJECT.internal`` of
the asking VM) and ``NAME.ZONE.c.PROJECT.internal``, for a Compute Engine instance of the asking VM's
project whose slice is up. Another project's names never resolve (another VPC), nor the global-DNS form
``NAME.c.PROJECT.internal`` (zonal DNS only: the stricter choice, unc. for projects still on global DNS).
Answers: 200 with the address as text; 404 with a line naming what did not resolve and where it was
looked up (the NXDOMAIN)."""

from __future__ import annotations

import re

from tpuctl.sim.engine import SimEngine
from tpuctl.sim.exchange import SimRequest, SimResponse, text_response

PREFIX = "/tpuctl-sim/v1/resolve/"
_LABEL = r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?"
_ZONAL_RE = re.compile(rf"^(?P<name>{_LABEL})\.(?P<zone>[a-z0-9-]+)\.c\.(?P<project>[a-z0-9.:-]+)\.internal$")
_SHORT_RE = re.compile(rf"^{_LABEL}$")


def answer(engine: SimEngine, request: SimRequest, host: tuple[str, str, str, int]) -> SimResponse:
    """The answer to ``GET PREFIX<name>`` from the VM ``host`` = (project, zone, node, worker)."""
    if request.headers.get("metadata-flavor") != "Google":
        return text_response("Missing required header: Metadata-Flavor\n", 403)
    project, zone = host[0], host[1]
    asked = request.path[len(PREFIX) :].rstrip(".").lower()
    target = lookup_key(asked, project, zone)
    address = engine.resolve_instance(*target) if target is not None else None
    if address is None:
        return text_response(
            f"NXDOMAIN: {asked!r} does not resolve from project {project!r}, zone {zone!r} (search domain "
            f"{zone}.c.{project}.internal): no running Compute Engine instance of that name there\n",
            404,
        )
    return text_response(address + "\n")


def lookup_key(asked: str, project: str, zone: str) -> tuple[str, str, str] | None:
    """(project, zone, instance) that ``asked`` names for a VM of ``project`` in ``zone``; None for a
    name outside the VM's VPC or not a zonal-DNS name."""
    if _SHORT_RE.match(asked):
        return project, zone, asked
    match = _ZONAL_RE.match(asked)
    if match is None or match["project"] != project:
        return None
    return project, match["zone"], match["name"]

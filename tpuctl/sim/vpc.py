"""The project's VPC networks, as a create request meets them: the network and subnetwork a node (TPU API)
or an instance (Compute Engine) names must exist, and the subnetwork must be in the zone's region and in
the network (docs/google-facts.md#networks).

Both APIs check the same things; each words the refusal as its own field (``tpuctl.sim.engine.plans``,
``tpuctl.sim.compute.networking``). Compute Engine's words are Google's, as its public error reports
quote them; the TPU API's for a network are unconfirmed, and it is refused synchronously in Compute
Engine's words, the stricter reading: a create Google might fail later fails here at once.

Shared VPC: a network whose world entry names a ``project`` (the host project) may be named by any
project with its full path; the IAM grant a service project needs on the host (compute.subnetworks.use)
is not simulated.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from tpuctl.sim.world import Network, World, region_of

_PREFIX_RE = re.compile(r"^(?:https://(?:www|compute)\.googleapis\.com/)?(?:compute/(?:v1|beta|alpha)/)?")
_NETWORK_RE = re.compile(r"^(?:(?:projects/(?P<project>[^/]+)/)?global/networks/)?(?P<name>[^/]+)$")
_SUBNETWORK_RE = re.compile(
    r"^(?:(?:projects/(?P<project>[^/]+)/)?regions/(?P<region>[^/]+)/subnetworks/)?(?P<name>[^/]+)$"
)

#: Compute Engine's reasons, as its 400 answers give them (public error reports quote them).
NETWORK_NOT_FOUND = "The referenced network resource cannot be found."
SUBNETWORK_NOT_FOUND = "The referenced subnetwork resource cannot be found."
SUBNETWORK_NEEDED = "Subnetwork should be specified for custom subnetmode network"


class VpcRefusal(Exception):
    """Why a network interface is refused: which part (``network``, ``subnetwork``, or ``""`` for the
    interface itself), the value as given, and Google's reason."""

    def __init__(self, part: str, value: str, why: str) -> None:
        super().__init__(why)
        self.part = part
        self.value = value
        self.why = why


@dataclass(frozen=True)
class Attachment:
    """Where the hosts are: the network's and the subnetwork's full paths."""

    network: str
    subnetwork: str


def attach(
    world: World,
    project: str,
    region: str | None,
    network: str | None,
    subnetwork: str | None,
    *,
    network_from_subnetwork: bool,
    template: bool = False,
) -> Attachment | None:
    """The network interface of a create in ``project`` in ``region`` (None: a global template's, whose
    region is not known yet), or ``VpcRefusal``. A missing network is ``default`` (the TPU API), or the
    subnetwork's own (``network_from_subnetwork``: Compute Engine). ``template``: a global instance
    template, whose subnetwork must be a full path (docs/google-facts.md#networks). Returns None for a
    template (its attachment is resolved where its instances are)."""
    sub = _parse(_SUBNETWORK_RE, subnetwork, "subnetwork") if subnetwork else None
    if template and sub is not None and sub.region is None:
        raise VpcRefusal(
            "subnetwork", sub.given, "A global instance template needs the subnetwork's full path."
        )
    net_project, net = _network_of(world, project, region, network, sub, network_from_subnetwork)
    network_path = f"projects/{net_project}/global/networks/{net.name}"
    if sub is None:
        if not net.auto_subnetworks:
            raise VpcRefusal("", "", SUBNETWORK_NEEDED)
        return None if region is None else Attachment(network_path, _sub_path(net_project, region, net.name))
    sub_path = _subnetwork_path(sub, net_project, net, region)
    return None if region is None else Attachment(network_path, sub_path)


def _network_of(
    world: World,
    project: str,
    region: str | None,
    network: str | None,
    sub: _Named | None,
    network_from_subnetwork: bool,
) -> tuple[str, Network]:
    """The named network (its project, and it), else the subnetwork's (Compute Engine), else
    ``default``; one that does not exist is refused."""
    if network:
        parsed = _parse(_NETWORK_RE, network, "network")
        found = world.network(parsed.project or project, parsed.name)
        if found is None:
            raise VpcRefusal("network", network, NETWORK_NOT_FOUND)
        return parsed.project or project, found
    if sub is not None and network_from_subnetwork:
        found = _network_with(world, sub.project or project, sub.name, sub.region or region)
        if found is None:
            raise VpcRefusal("subnetwork", sub.given, SUBNETWORK_NOT_FOUND)
        return sub.project or project, found
    found = world.network(project, "default")
    if found is None:
        raise VpcRefusal("network", f"projects/{project}/global/networks/default", NETWORK_NOT_FOUND)
    return project, found


def _subnetwork_path(sub: _Named, net_project: str, net: Network, region: str | None) -> str:
    """The subnetwork's full path, refused unless it is in the zone's region and in the network."""
    sub_region = sub.region or region
    if region is not None and sub_region != region:
        raise VpcRefusal(
            "subnetwork",
            sub.given,
            f"The subnetwork must be in the region of the zone ({region}), not {sub_region}.",
        )
    sub_project = sub.project or net_project
    sub_path = _sub_path(sub_project, sub_region or "REGION", sub.name)
    if sub_project != net_project:
        raise VpcRefusal(
            "subnetwork", sub.given, f'Subnetwork "{sub_path}" is not valid for Network "{net.name}".'
        )
    if sub_region is not None and not net.has_subnetwork(sub.name, sub_region):
        raise VpcRefusal("subnetwork", sub.given, SUBNETWORK_NOT_FOUND)
    return sub_path


def full_paths(project: str, zone: str, network: str | None, subnetwork: str | None) -> dict[str, str]:
    """The full paths reads answer for an accepted network and subnetwork (checked when created): the
    network ``default`` where none was named, the subnetwork named like its network (an auto-mode one's)
    where none was."""
    try:
        net = _parse(_NETWORK_RE, network or "default", "network")
        sub = _parse(_SUBNETWORK_RE, subnetwork, "subnetwork") if subnetwork else None
    except VpcRefusal:  # not one the simulator accepted (an admin-made node): the default network's
        net, sub = _Named("default", None, None, "default"), None
    net_project = net.project or project
    sub_path = _sub_path(
        (sub.project if sub else None) or net_project,
        (sub.region if sub else None) or region_of(zone),
        sub.name if sub else net.name,
    )
    return {"network": f"projects/{net_project}/global/networks/{net.name}", "subnetwork": sub_path}


def _network_with(world: World, project: str, subnetwork: str, region: str | None) -> Network | None:
    """The network of ``project`` that has ``subnetwork`` (in ``region``, where known)."""
    for net in world.networks:
        if net.project not in (None, project):
            continue
        if (region is not None and net.has_subnetwork(subnetwork, region)) or (
            region is None
            and (subnetwork in net.subnetworks or (net.auto_subnetworks and subnetwork == net.name))
        ):
            return net
    return None


@dataclass(frozen=True)
class _Named:
    """A network or subnetwork as a request names it: the name, and the project and region it gives."""

    name: str
    project: str | None
    region: str | None
    given: str  # as the request wrote it


def _parse(pattern: re.Pattern[str], value: str, part: str) -> _Named:
    match = pattern.match(_PREFIX_RE.sub("", value.strip(), count=1))
    if match is None:
        reason = NETWORK_NOT_FOUND if part == "network" else SUBNETWORK_NOT_FOUND
        raise VpcRefusal(part, value, reason)
    groups = match.groupdict()
    return _Named(match["name"], groups.get("project"), groups.get("region"), value)


def _sub_path(project: str, region: str, name: str) -> str:
    return f"projects/{project}/regions/{region}/subnetworks/{name}"

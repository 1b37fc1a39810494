"""``instances.getGuestAttributes``: what a simulated instance's guest agent publishes.

The guest agent of a TPU VM publishes its SSH host keys under ``hostkeys/`` (namespace ``hostkeys``, key
the key type, value the base64 key: GoogleCloudPlatform/guest-agent, instance_setup.go), which is what
``gcloud compute ssh`` and ``ComputeCloud.host_keys`` read to check a host's key. A simulated host
publishes the key its sshd presents, read from its disk; a VM with no disk (yet) has published nothing.
The TPU API surface publishes the same keys per worker (``tpuctl.sim.routes._guest_attributes``).

A Compute Engine VM publishes guest attributes only when they are enabled: metadata
``enable-guest-attributes`` TRUE on the instance, or, where the instance does not set it, on the project
(the world's ``guest_attributes``); off unless set (docs/google-facts.md#guest-attributes). A TPU API VM
always publishes (gcloud's ``tpu-vm ssh`` reads its keys without enabling anything).
"""

from __future__ import annotations

from typing import Any

from tpuctl.sim.compute import links, store
from tpuctl.sim.compute.context import ComputeContext
from tpuctl.sim.compute.errors import ComputeError, not_found
from tpuctl.sim.compute.machines import check_zone
from tpuctl.sim.vms.layout import disk_dir, read_host_public_key

HOSTKEYS = "hostkeys"
GUEST_ATTRIBUTES_KEY = "enable-guest-attributes"


def attribute_missing(what: str) -> ComputeError:
    """Nothing published at ``what``: the message gcloud's ``compute ssh`` matches to tell "no host keys
    yet" from a failure (googlecloudsdk/command_lib/compute/ssh_utils.py, GetHostKeysFromGuestAttributes,
    for ``hostkeys/``). The 404 notFound status around it is inferred (unc.): it is what a missing
    resource gets from Compute, and the client libraries' NotFound is what callers handle."""
    return ComputeError(404, f"The resource '{what}' of type 'Guest Attribute' was not found.", "notFound")


def published(cc: ComputeContext, project: str, zone: str, name: str) -> list[dict[str, str]]:
    """The instance's guest attributes (``namespace``, ``key``, ``value``); 404 for no such instance."""
    check_zone(cc.ctx.world, zone)
    cc.timeline.advance(cc.ctx.clock())
    with cc.ctx.db.read() as conn:
        inst = store.row(conn, project, f"zones/{zone}", store.INSTANCES, name)
        if inst is None:
            # The instance's own notFound, as instances.get answers it (unc.: Google may quote the
            # guestAttributes path instead; either way a 404 notFound, which is what clients act on).
            raise not_found(links.path(project, "zones", zone, "instances", name))
        node = store.node_of(conn, inst)
        uid, worker = (str(node["uid"]), int(inst["worker"] or 0)) if node is not None else ("", 0)
        enabled = guest_attributes_enabled(
            _metadata_of(store.body(inst)), project_default=cc.ctx.world.guest_attributes
        )
    if not enabled:
        return []  # the agent writes no guest attribute where they are off
    line = read_host_public_key(disk_dir(cc.ctx.vm_root, uid, worker)) if uid else None
    if line is None:
        return []  # not placed, or its VM has no disk yet: its agent has not published
    key_type, blob = line.split()[:2]
    return [{"namespace": HOSTKEYS, "key": key_type, "value": blob}]


def guest_attributes_enabled(metadata: dict[str, str], *, project_default: bool) -> bool:
    """The instance's ``enable-guest-attributes`` when it has one (TRUE in any case is on, anything else
    off, as gcloud's ``_MetadataHasGuestAttributesEnabled`` reads it), else the project's."""
    value = metadata.get(GUEST_ATTRIBUTES_KEY)
    if value is None:
        return project_default
    return value.strip().lower() == "true"


def _metadata_of(body: dict[str, Any]) -> dict[str, str]:
    items = (body.get("metadata") or {}).get("items") or []
    return {str(i["key"]): str(i.get("value", "")) for i in items if "key" in i}


def _matches(item: dict[str, str], query_path: str) -> bool:
    """``''`` is every attribute, ``ns/`` a namespace, ``ns/key`` one key. A path without a slash names a
    key of the default namespace, where the simulated agent publishes nothing (unc.: the discovery
    document names only these three forms; a bare ``hostkeys`` is not taken for ``hostkeys/``)."""
    if not query_path:
        return True
    namespace, sep, key = query_path.partition("/")
    return bool(sep) and item["namespace"] == namespace and key in ("", item["key"])


def guest_attributes(
    cc: ComputeContext, project: str, zone: str, name: str, query_path: str, variable_key: str
) -> dict[str, Any]:
    """A ``compute#guestAttributes``: the entries under ``query_path``, or with ``variable_key``
    (``namespace/key``, unc.) that one value. Nothing there is a 404 (see ``attribute_missing``)."""
    items = published(cc, project, zone, name)
    # The selfLink's form is inferred from Compute's other links (unc.); no client reads it.
    self_link = links.link(project, "zones", zone, "instances", name) + "/guestAttributes/"
    if variable_key:
        found = [i["value"] for i in items if f"{i['namespace']}/{i['key']}" == variable_key]
        if not found:
            raise attribute_missing(variable_key)
        return {
            "kind": "compute#guestAttributes",
            "selfLink": self_link + variable_key,
            "variableKey": variable_key,
            "variableValue": found[0],
        }
    wanted = [i for i in items if _matches(i, query_path)]
    if not wanted:
        raise attribute_missing(query_path)
    return {
        "kind": "compute#guestAttributes",
        "selfLink": self_link + query_path,
        "queryPath": query_path,
        "queryValue": {"items": wanted},
    }

"""What a simulated host's metadata server answers for one request, given the host (the transport,
``tpuctl.sim.vms.metadata_http``, knows which host from the address the request arrived on).

Plain text as GCE's metadata server answers (https://cloud.google.com/compute/docs/metadata/querying-metadata):
403 without ``Metadata-Flavor: Google``; 404 for an unknown key; ``?recursive=true`` on a directory
answers JSON; ``?wait_for_change=true`` long-polls until the value's ETag differs from ``last_etag``
(default: the current one) or ``timeout_sec`` passes.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable
from typing import Any

from tpuctl.sim import vpc_dns
from tpuctl.sim.api_errors import ApiError
from tpuctl.sim.engine import SimEngine
from tpuctl.sim.exchange import SimRequest, SimResponse, first, text_response

NOT_FOUND = "not found\n"
#: The longest long-poll a client may ask for, in seconds (GCE's own cap).
MAX_WAIT_S = 300.0
_POLL_S = 0.02
_PREFIX = "/computeMetadata/v1/"


def etag(value: str) -> str:
    return hashlib.sha1(value.encode(), usedforsecurity=False).hexdigest()[:16]


def answer(
    engine: SimEngine, request: SimRequest, host: tuple[str, str, str, int], *, stopping: Callable[[], bool]
) -> SimResponse:
    """What host ``(project, zone, node, worker)`` reads at ``request.path``. ``stopping`` ends a
    long-poll early (the server is going away)."""
    if request.headers.get("metadata-flavor") != "Google":
        # What the real metadata server says without the header.
        return text_response("Missing required header: Metadata-Flavor\n", 403)
    if request.path.startswith(vpc_dns.PREFIX):
        return vpc_dns.answer(engine, request, host)  # the simulated VPC's DNS (not a Google path)
    if request.path == "/":
        # The server's root lists its API versions; google-auth and tensorstore ask it to learn that
        # they run on Google (a 200 with Metadata-Flavor: Google).
        return text_response("computeMetadata/\n")
    if not request.path.startswith(_PREFIX):
        return text_response(NOT_FOUND, 404)
    key = request.path[len(_PREFIX) :]
    project, zone, node, worker = host

    def tree() -> dict[str, str] | None:
        try:
            return engine.metadata_tree(zone, node, worker, project=project)
        except ApiError:
            return None  # the node is gone: as for an unknown key, a plain 404

    recursive = first(request.query, "recursive") == "true"
    values = tree()
    if values is None:
        return text_response(NOT_FOUND, 404)
    identity = re.fullmatch(r"instance/service-accounts/([^/]+)/identity", key)
    if identity is not None:
        return _identity(engine, request, values.get(f"instance/service-accounts/{identity.group(1)}/email"))
    if recursive or key not in values:
        return _directory(values, key, recursive=recursive)
    value = values[key]
    if first(request.query, "wait_for_change") == "true":
        last_etag = first(request.query, "last_etag") or etag(value)
        timeout = min(float(first(request.query, "timeout_sec") or 60), MAX_WAIT_S)
        deadline = time.monotonic() + timeout
        while etag(value) == last_etag and time.monotonic() < deadline and not stopping():
            time.sleep(_POLL_S)
            values = tree()
            if values is None or key not in values:
                return text_response(NOT_FOUND, 404)
            value = values[key]
    content_type = "application/json" if key.endswith("/token") else "application/text"
    return SimResponse(200, value.encode(), content_type, etag(value))


def _identity(engine: SimEngine, request: SimRequest, email: str | None) -> SimResponse:
    """An ID token for the VM's service account (``email``; None: the VM has no such account) with the
    ``audience`` asked for; the email claims only with ``format=full``, as GCE's metadata server."""
    from tpuctl.sim.issuer import issuer_of

    if email is None:
        return text_response(NOT_FOUND, 404)
    audience = first(request.query, "audience")
    if not audience:
        return text_response("non-empty audience parameter required\n", 400)
    full = first(request.query, "format") == "full"
    return text_response(issuer_of(engine).id_token(email, audience, full=full))


def _directory(tree: dict[str, str], key: str, *, recursive: bool) -> SimResponse:
    """A directory: its entries, one per line (``name/`` for subdirectories), or with ``recursive`` the
    whole subtree as JSON (camelCase names, as GCE's, except attribute names, which are the user's)."""
    prefix = key if key.endswith("/") or key == "" else key + "/"
    if recursive and key in tree:
        return text_response(tree[key], etag=etag(tree[key]))
    below = {k[len(prefix) :]: v for k, v in tree.items() if k.startswith(prefix)}
    if not below:
        return text_response(NOT_FOUND, 404)
    if recursive:
        in_attributes = prefix.startswith("instance/attributes/")
        body = json.dumps(_lists(_nest(below, camel=not in_attributes)))
        return SimResponse(200, body.encode(), "application/json", etag(body))
    entries = sorted({k.split("/", 1)[0] + ("/" if "/" in k else "") for k in below})
    listing = "".join(f"{e}\n" for e in entries)
    return text_response(listing, etag=etag(listing))


#: Keys whose text is one item per line, and which a recursive answer gives as a JSON list, as GCE's does
#: (``service-accounts/default/?recursive=true``: ``{"aliases": ["default"], "email": ..., "scopes": [...]}``;
#: tensorstore's GCE credentials read ``scopes`` as a list and take none where it is a string).
_LINE_LISTS = frozenset({"aliases", "scopes"})


def _nest(flat: dict[str, str], *, camel: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for path, value in flat.items():
        parts = path.split("/")
        node = out
        for i, part in enumerate(parts):
            user_key = not camel or "attributes" in parts[:i]
            name = part if user_key else _camel(part)
            if i == len(parts) - 1:
                listed = not user_key and part in _LINE_LISTS
                node[name] = value.split() if listed else _json_value(value)
            else:
                node = node.setdefault(name, {})
    return out


def _camel(name: str) -> str:
    return re.sub(r"-([a-z0-9])", lambda m: m.group(1).upper(), name)


def _json_value(value: str) -> Any:
    if value.startswith("{"):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _lists(node: Any) -> Any:
    """Numbered directories (network-interfaces/0/...) become JSON lists, as GCE answers them."""
    if not isinstance(node, dict):
        return node
    converted = {k: _lists(v) for k, v in node.items()}
    if converted and all(k.isdigit() for k in converted):
        return [converted[k] for k in sorted(converted, key=int)]
    return converted

"""Google's discovery documents for the TPU API (``data/discovery``), loaded on first use and cached.

Every CLI command starts a simulator, so nothing is read at import time: the first request that needs a
schema (a body to validate, an answer to project, the document itself) loads one version's file (~1 ms).
"""

from __future__ import annotations

import copy
import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: The TPU API versions the simulator serves, each with its discovery document.
VERSIONS = ("v2", "v2alpha1")


@dataclass(frozen=True)
class Method:
    """One method of the document: how it is reached and what it reads and answers."""

    id: str  # e.g. "tpu.projects.locations.nodes.create"
    http_method: str
    pattern: re.Pattern[str]  # matches the URL path, e.g. /v2/projects/p/locations/z/nodes
    request: str | None  # the request body's schema name
    response: str | None
    parameters: dict[str, Any]


@functools.cache
def document(version: str) -> dict[str, Any]:
    """The discovery document of ``version`` as Google publishes it (do not mutate)."""
    if version not in VERSIONS:
        raise KeyError(version)
    text = (Path(__file__).parent / "data" / "discovery" / f"tpu.{version}.json").read_text()
    data: dict[str, Any] = json.loads(text)
    return data


def served_document(version: str, root_url: str) -> dict[str, Any]:
    """The document as the simulator serves it: Google's, with its URLs pointing at ``root_url``
    (ending in "/"), so a client built from it sends its calls here."""
    data = copy.deepcopy(document(version))
    data["rootUrl"] = root_url
    data["mtlsRootUrl"] = root_url
    data["baseUrl"] = root_url + data.get("servicePath", "")
    return data


def schemas(version: str) -> dict[str, Any]:
    schemas_: dict[str, Any] = document(version)["schemas"]
    return schemas_


def _path_regex(flat_path: str) -> re.Pattern[str]:
    parts = re.split(r"(\{[^}]+\})", flat_path)
    body = "".join("[^/:]+" if p.startswith("{") else re.escape(p) for p in parts)
    return re.compile("/" + body)


@functools.cache
def methods(version: str) -> tuple[Method, ...]:
    found: list[Method] = []

    def walk(resources_: dict[str, Any]) -> None:
        for resource in resources_.values():
            for method in resource.get("methods", {}).values():
                found.append(
                    Method(
                        id=method["id"],
                        http_method=method["httpMethod"],
                        pattern=_path_regex(method["flatPath"]),
                        request=method.get("request", {}).get("$ref"),
                        response=method.get("response", {}).get("$ref"),
                        parameters=method.get("parameters", {}),
                    )
                )
            walk(resource.get("resources", {}))

    walk(document(version)["resources"])
    return tuple(found)


def method_for(version: str, http_method: str, path: str) -> Method | None:
    """The document's method for one request, or None when it lists none there."""
    for method in methods(version):
        if method.http_method == http_method and method.pattern.fullmatch(path):
            return method
    return None

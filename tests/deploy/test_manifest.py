"""deploy/'s Kubernetes manifest, checked offline against the Kubernetes API's schema (the strict
schemas kubernetes-validate bundles: an unknown field is an error), and for what the server needs of it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

MANIFEST = Path(__file__).resolve().parents[2] / "deploy" / "tpuctl-server.yaml"
#: The oldest Kubernetes minor GKE's regular channel still runs as this is written.
KUBERNETES_VERSION = "1.31.0"


def _documents() -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(MANIFEST.read_text(encoding="utf-8")) if d]


def _kind(kind: str) -> dict[str, Any]:
    return next(d for d in _documents() if d["kind"] == kind)


def test_every_document_is_valid_against_the_api_schema() -> None:
    kinds = []
    for document in _documents():
        kubernetes_validate.validate(document, KUBERNETES_VERSION, strict=True)
        kinds.append(document["kind"])
    assert sorted(kinds) == ["Deployment", "Secret", "Service", "ServiceAccount"]


def test_the_check_can_fail() -> None:
    broken = _kind("Deployment")
    broken["spec"]["template"]["spec"]["containers"][0]["listenOn"] = "0.0.0.0"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_the_database_url_comes_from_the_secret_and_the_service_stays_inside() -> None:
    container = _kind("Deployment")["spec"]["template"]["spec"]["containers"][0]
    database = next(e for e in container["env"] if e["name"] == "TPUCTL_DATABASE_URL")
    secret = _kind("Secret")
    assert database["valueFrom"]["secretKeyRef"] == {"name": secret["metadata"]["name"], "key": "url"}
    assert secret["stringData"]["url"].startswith("postgresql://")
    assert container["args"][0] == "server"
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert _kind("Service")["spec"]["type"] == "ClusterIP"

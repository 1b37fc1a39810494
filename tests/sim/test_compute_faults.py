"""The world's transport faults on Compute Engine's surface, as on the TPU API's: transient 429/500/503
before the request is served, answered in Compute's error JSON (``error.errors[].reason``), and
ambiguous drops after a mutation was performed."""

from __future__ import annotations

import httpx
import pytest
import requests
from api_schema import schema_problems
from compute_helpers import ZONE, Clients, compute, instance_body
from google.api_core import exceptions
from sim_helpers import AUTH, PROJECT

from tpuctl.sim import SimAdminClient, SimServer

__all__ = ["compute", "schema_problems"]  # fixtures


def test_transient_errors_come_in_computes_shape_before_the_mutation(
    compute: tuple[SimServer, Clients],
) -> None:
    server, c = compute
    with SimAdminClient(server.url) as admin:
        admin.set_faults(transient_error_rate=1.0)
        with pytest.raises(
            (exceptions.TooManyRequests, exceptions.InternalServerError, exceptions.ServiceUnavailable)
        ):
            c.instances.insert(project=PROJECT, zone=ZONE, instance_resource=instance_body("never"))
        url = f"{server.url}/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances"
        seen: dict[int, tuple[str, str]] = {}
        with httpx.Client(headers=AUTH) as http:
            for _ in range(60):
                answer = http.get(url)
                error = answer.json()["error"]
                assert error["code"] == answer.status_code
                seen[answer.status_code] = (error["errors"][0]["reason"], error["errors"][0]["domain"])
        assert seen == {
            429: ("rateLimitExceeded", "usageLimits"),
            500: ("backendError", "global"),
            503: ("backendError", "global"),
        }
        admin.set_faults(transient_error_rate=0.0)
    assert list(c.instances.list(project=PROJECT, zone=ZONE)) == []


def test_ambiguous_drop_performs_the_compute_mutation(compute: tuple[SimServer, Clients]) -> None:
    server, c = compute
    with SimAdminClient(server.url) as admin:
        admin.set_faults(ambiguous_error_rate=1.0)
        # The connection closes with no response; the insert happened.
        with pytest.raises(requests.exceptions.ConnectionError):
            c.instances.insert(project=PROJECT, zone=ZONE, instance_resource=instance_body("maybe"))
        assert [vm.name for vm in c.instances.list(project=PROJECT, zone=ZONE)] == ["maybe"]  # reads: never
        admin.set_faults(ambiguous_error_rate=0.0)

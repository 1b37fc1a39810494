"""`pod delete` of a slice made through a queued resource deletes the queued resource too (it holds quota
until deleted), and says so; a multislice queued resource stays while another of its slices lives."""

from __future__ import annotations

from collections.abc import Callable

from allocator_helpers import InProcessEnv

from tpuctl.testing.cli import CliResult

Cli = Callable[..., CliResult]
ZONE = "us-central1-a"


def _queued_ids(env: InProcessEnv) -> list[str]:
    return [q["name"].rsplit("/", 1)[-1] for q in env.admin.status()["queued_resources"]]


def test_delete_removes_the_queued_resource_and_says_so(
    in_process_sim: Callable[..., InProcessEnv], cli: Cli
) -> None:
    env = in_process_sim()
    made = cli("pod", "create", "v5e-16", "--queued", "--zone", ZONE, "--name", "qd", "-o", "json", env=env)
    assert made.code == 0, made.stderr
    [qr_id] = _queued_ids(env)

    plan = cli("pod", "delete", "qd", "--dry-run", "-o", "json", env=env)
    [entry] = plan.json["plan"]
    assert entry["queued_resource"] == qr_id
    assert [r["method"] for r in entry["requests"]] == ["DELETE", "DELETE"]
    assert (
        "queuedResources/" + qr_id in entry["requests"][1]["url"]
        and "force=true" in entry["requests"][1]["url"]
    )

    deleted = cli("pod", "delete", "qd", "-y", env=env)
    assert deleted.code == 0, deleted.stderr
    assert f"deleted qd ({ZONE}) and its queued resource {qr_id}" in deleted.stdout + deleted.stderr
    assert _queued_ids(env) == [] and env.admin.status()["nodes"] == []


def test_a_multislice_queued_resource_goes_with_its_last_slice(
    in_process_sim: Callable[..., InProcessEnv], cli: Cli
) -> None:
    env = in_process_sim()
    made = cli(
        "pod", "create", "v5e-16", "--slices", "2", "--zone", ZONE, "--name", "ms", "-o", "json", env=env
    )
    assert made.code == 0, made.stderr
    [qr_id] = _queued_ids(env)
    first = cli("pod", "delete", "ms-0", "-y", "-o", "json", env=env)
    assert first.json["deleted"] == [{"name": "ms-0", "zone": ZONE}]  # ms-1 still uses it
    assert _queued_ids(env) == [qr_id]
    last = cli("pod", "delete", "ms-1", "-y", "-o", "json", env=env)
    assert last.json["deleted"] == [{"name": "ms-1", "zone": ZONE, "queued_resource": qr_id}]
    assert _queued_ids(env) == []


def test_describe_of_a_deleted_slice_shows_what_the_ledger_recorded(
    in_process_sim: Callable[..., InProcessEnv], cli: Cli
) -> None:
    env = in_process_sim()
    assert cli("pod", "create", "v5e-8", "--zone", ZONE, "--name", "old", env=env).code == 0
    assert cli("pod", "delete", "old", "-y", env=env).code == 0

    described = cli("pod", "describe", "old", "-o", "json", env=env)
    assert described.code == 0, described.stderr
    pod = described.json["pod"]
    assert (pod["state"], pod["zone"], pod["accelerator_type"], pod["network_endpoints"]) == (
        "DELETED",
        ZONE,
        "v5litepod-8",
        [],
    )
    assert pod["deleted_at"] is not None and pod["deleted_by"].endswith(" (user)")
    kinds = [e["kind"] for e in pod["events"]]
    assert kinds[0] == "requested" and kinds[-1] == "deleted"
    table = cli("pod", "describe", "old", env=env)
    assert "pod old (deleted: as the ledger recorded it)" in table.stdout and "deleted_by" in table.stdout

    never = cli("pod", "describe", "never-made", "-o", "json", env=env)
    assert never.code == 11 and never.json["message"] == "no slice named 'never-made'"


def test_slices_are_their_makers_and_seen_only_by_their_workspaces(
    in_process_sim: Callable[..., InProcessEnv],
) -> None:
    import dataclasses

    import pytest

    from tpuctl.catalog import Surface
    from tpuctl.errors import NotFoundError, UsageError
    from tpuctl.services.allocator import Allocator
    from tpuctl.services.placement_choices import PlacementChoices
    from tpuctl.services.pods import PodService
    from tpuctl.teams.actor import Actor, ForbiddenError
    from tpuctl.teams.workspaces import Role

    env = in_process_sim()
    a1 = Actor("a1@x.com", {"team-a": Role.MEMBER, "team-c": Role.MEMBER})
    maker = dataclasses.replace(env.session(), actor=a1)
    choices = PlacementChoices(zones=(ZONE,))
    with pytest.raises(UsageError, match="may submit to 2 workspaces"):
        Allocator(maker).plan(choices.request(maker.catalog, maker.settings, "v5e-8", name="ta"))
    request = dataclasses.replace(choices, workspace="team-a").request(
        maker.catalog, maker.settings, "v5e-8", name="ta"
    )
    Allocator(maker).place(request)
    record = maker.ledger.get_pod("ta", ZONE)
    assert record is not None and (record.principal, record.workspace) == ("a1@x.com", "team-a")

    def pods_as(actor: Actor) -> PodService:
        return PodService(dataclasses.replace(env.session(), actor=actor))

    outsider = pods_as(Actor("b1@x.com", {"team-b": Role.MEMBER}))
    tpu_api = (Surface.TPU_API,)  # the one the slice is on (listing Compute Engine too costs seconds)
    assert outsider.list(ZONE, surfaces=tpu_api) == []
    with pytest.raises(NotFoundError, match="no slice named 'ta'"):
        outsider.describe("ta", ZONE)
    with pytest.raises(NotFoundError):
        outsider.delete("ta", zone=ZONE)
    viewer = pods_as(Actor("a2@x.com", {"team-a": Role.VIEWER}))
    listed = viewer.list(ZONE, surfaces=tpu_api)
    assert [(v.name, v.workspace, v.principal) for v in listed] == [("ta", "team-a", "a1@x.com")]
    with pytest.raises(ForbiddenError) as refused:
        viewer.delete("ta", zone=ZONE)
    assert refused.value.exit_code == 13
    pods_as(a1).delete("ta", zone=ZONE)
    assert [e.workspace for e in maker.ledger.pod_events("ta", ZONE)][-1] == "team-a"

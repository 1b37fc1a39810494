"""Look-before-acting create/delete helpers, on a scripted in-memory cloud (every branch, deterministic)."""

from __future__ import annotations

from typing import Any, cast

import pytest

from tpuctl.catalog import CapacityType
from tpuctl.cloud.base import LABEL_REQUEST, Node, NodeRequest, TpuCloud
from tpuctl.cloud.idempotent import create_node_idempotent, delete_node_idempotent
from tpuctl.errors import (
    AlreadyExistsError,
    AmbiguousError,
    NotFoundError,
    StockoutError,
    TransientError,
)

REQ = NodeRequest(name="n1", zone="z-a", accelerator_type="v6e-8", runtime_version="rt")


def node(state: str = "READY", rid: str = "mine") -> Node:
    return Node(
        name="n1",
        zone="z-a",
        accelerator_type="v6e-8",
        state=state,
        capacity=CapacityType.ON_DEMAND,
        labels={LABEL_REQUEST: rid},
    )


class ScriptedCloud:
    """``creates``/``deletes``: what each call does in turn (a callable run against the cloud, or an error).
    ``gets``: the node states get_node returns in turn (None = NotFound); the last one repeats."""

    def __init__(
        self,
        *,
        creates: list[Any] | None = None,
        deletes: list[Any] | None = None,
        gets: list[Node | None] | None = None,
    ) -> None:
        self.creates, self.deletes, self.gets = creates or [], deletes or [], gets or []
        self.calls: list[str] = []

    def _next(self, script: list[Any]) -> Any:
        step = script.pop(0) if len(script) > 1 else script[0]
        if isinstance(step, Exception):
            raise step
        return step() if callable(step) else step

    def create_node(self, request: NodeRequest, **kw: Any) -> Node:
        self.calls.append("create")
        assert kw["request_id"] == "mine"
        return self._next(self.creates)  # type: ignore[no-any-return]

    def delete_node(self, zone: str, name: str, **kw: Any) -> None:
        self.calls.append("delete")
        self._next(self.deletes)

    def get_node(self, zone: str, name: str) -> Node:
        self.calls.append("get")
        current = self.gets.pop(0) if len(self.gets) > 1 else self.gets[0]
        if current is None:
            raise NotFoundError("gone")
        return current


def create(cloud: ScriptedCloud, **kw: Any) -> Node:
    return create_node_idempotent(
        cast(TpuCloud, cloud),  # it has the three methods the helpers call, not the whole protocol
        REQ,
        request_id="mine",
        sleep=lambda _: None,  # type: ignore[arg-type]
        poll_interval_s=0.001,
        poll_max_interval_s=0.001,
        **kw,
    )


def delete(cloud: ScriptedCloud, **kw: Any) -> None:
    delete_node_idempotent(
        cast(TpuCloud, cloud),
        "z-a",
        "n1",
        sleep=lambda _: None,  # type: ignore[arg-type]
        poll_interval_s=0.001,
        poll_max_interval_s=0.001,
        **kw,
    )


def test_plain_success_does_not_look() -> None:
    cloud = ScriptedCloud(creates=[node()])
    assert create(cloud).state == "READY" and cloud.calls == ["create"]


def test_ambiguous_and_ours_waits_for_ready_without_creating_again() -> None:
    cloud = ScriptedCloud(
        creates=[AmbiguousError("reset")], gets=[node("CREATING"), node("CREATING"), node()]
    )
    assert create(cloud).state == "READY"
    assert cloud.calls == ["create", "get", "get", "get"]


def test_ambiguous_and_absent_sends_again() -> None:
    cloud = ScriptedCloud(creates=[AmbiguousError("500"), node()], gets=[None])
    assert create(cloud).state == "READY" and cloud.calls == ["create", "get", "create"]


def test_already_exists_ours_is_success_theirs_is_an_error() -> None:
    cloud = ScriptedCloud(creates=[AlreadyExistsError("dup")], gets=[node()])
    assert create(cloud).state == "READY"
    cloud = ScriptedCloud(creates=[AlreadyExistsError("dup")], gets=[node(rid="someone-else")])
    with pytest.raises(AlreadyExistsError, match="not made by this request"):
        create(cloud)
    assert cloud.calls == ["create", "get"]


def test_found_ours_then_it_vanishes_sends_again_and_surfaces_the_real_error() -> None:
    cloud = ScriptedCloud(
        creates=[AmbiguousError("reset"), StockoutError("no capacity", zone="z-a")],
        gets=[node("CREATING"), None],
    )
    with pytest.raises(StockoutError):
        create(cloud)
    assert cloud.calls == ["create", "get", "get", "create"]


def test_answers_are_not_retried() -> None:
    cloud = ScriptedCloud(creates=[StockoutError("no capacity", zone="z-a")])
    with pytest.raises(StockoutError):
        create(cloud)
    assert cloud.calls == ["create"]


def test_attempts_are_bounded() -> None:
    cloud = ScriptedCloud(creates=[AmbiguousError("reset")], gets=[None])
    with pytest.raises(TransientError, match="outcome stayed unknown after 3 attempts"):
        create(cloud, attempts=3)
    assert cloud.calls.count("create") == 3


def test_no_wait_returns_the_creating_node() -> None:
    cloud = ScriptedCloud(creates=[AmbiguousError("reset")], gets=[node("CREATING")])
    assert create(cloud, wait=False).state == "CREATING"


@pytest.mark.parametrize(
    ("deletes", "gets", "calls"),
    [
        ([None], [None], ["delete"]),  # plain success
        ([NotFoundError("gone")], [None], ["delete"]),  # already gone
        ([AmbiguousError("reset")], [None], ["delete", "get"]),  # it happened
        (
            [AmbiguousError("reset")],
            [node("DELETING"), node("DELETING"), None],
            ["delete", "get", "get", "get"],
        ),
        ([AmbiguousError("500"), None], [node("READY")], ["delete", "get", "delete"]),  # it did not: again
    ],
)
def test_delete_idempotent(deletes: list[Any], gets: list[Any], calls: list[str]) -> None:
    cloud = ScriptedCloud(deletes=deletes, gets=gets)
    delete(cloud)
    assert cloud.calls == calls


def test_delete_gives_up_with_a_clear_error() -> None:
    cloud = ScriptedCloud(deletes=[AmbiguousError("reset")], gets=[node("READY")])
    with pytest.raises(TransientError, match="still there after 2 attempts"):
        delete(cloud, attempts=2)

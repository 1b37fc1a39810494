"""Which run a user means: a whole run id, a unique prefix or suffix of one, or ``latest``.

Run ids are long (``run-20261124-150943-ab16``); people type the end they can see (``ab16``) or the
newest one. Every command that names a run resolves it here, so they all accept the same forms.

Only the runs of the workspaces a caller may see count (``visible``): a run of another workspace is not
found, exactly as one that does not exist (``tpuctl.teams.actor``), and never makes a reference ambiguous.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING

from tpuctl.errors import NameNotFoundError, UsageError
from tpuctl.store.records import LOCAL_WORKSPACE

if TYPE_CHECKING:
    from tpuctl.store.ledger import Ledger

#: The word for the newest run.
LATEST = "latest"

#: How many candidates an ambiguous reference lists.
_SHOWN = 10


class RunNotFoundError(NameNotFoundError):
    """The one "no such run" error (exit 11): nothing the user named matches a run in the ledger."""

    def __init__(self, ref: str) -> None:
        super().__init__(
            f"no run {ref!r}",
            field="RUN",
            value=ref,
            fix="`tpuctl runs list` shows the runs; a unique start or end of an id, or `latest`, will do",
        )


def resolve_run_id(ledger: Ledger, ref: str | None, visible: Collection[str] | None = None) -> str:
    """The run id ``ref`` names (None or ``latest``: the newest run) among the runs of ``visible``'s
    workspaces (None: all). Exit 11 (``NameNotFoundError``) when no run matches; exit 2 (UsageError) when a
    prefix or suffix matches several (they are listed, newest first)."""
    if ref is None or ref == LATEST:
        newest = ledger.list_runs(limit=1, workspaces=visible)
        if not newest:
            raise NameNotFoundError(
                "there are no runs yet", field="RUN", value=ref, fix="start one with `tpuctl run`"
            )
        return newest[0].run_id
    if not ref.strip():
        raise UsageError("an empty run id", field="RUN", value=ref, fix="`tpuctl runs list` shows the runs")
    if _visible(ledger, ref, visible):
        return ref
    matches = ledger.run_ids_around(ref, limit=_SHOWN + 1, workspaces=visible)
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise RunNotFoundError(ref)
    listed = ", ".join(matches[:_SHOWN]) + (", ..." if len(matches) > _SHOWN else "")
    raise UsageError(
        f"{ref!r} matches {'more than ' if len(matches) > _SHOWN else ''}"
        f"{min(len(matches), _SHOWN)} runs: {listed}",
        field="RUN",
        value=ref,
        fix="give more of the id, enough to match only one",
    )


def _visible(ledger: Ledger, run_id: str, visible: Collection[str] | None) -> bool:
    """Whether run ``run_id`` exists in one of ``visible``'s workspaces (None: in any)."""
    record = ledger.get_run(run_id)
    if record is None:
        return False
    return visible is None or (record.workspace or LOCAL_WORKSPACE) in visible

"""Which run a user means: a whole run id, a unique prefix or suffix of one, or ``latest``.

Run ids are long (``run-20261124-150943-ab16``); people type the end they can see (``ab16``) or the
newest one. Every command that names a run resolves it here, so they all accept the same forms.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpuctl.errors import NameNotFoundError, UsageError

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


def resolve_run_id(ledger: Ledger, ref: str | None) -> str:
    """The run id ``ref`` names (None or ``latest``: the newest run). Exit 11 (``NameNotFoundError``) when
    no run matches; exit 2 (UsageError) when a prefix or suffix matches several (they are listed, newest
    first)."""
    if ref is None or ref == LATEST:
        newest = ledger.list_runs(limit=1)
        if not newest:
            raise NameNotFoundError(
                "there are no runs yet", field="RUN", value=ref, fix="start one with `tpuctl run`"
            )
        return newest[0].run_id
    if not ref.strip():
        raise UsageError("an empty run id", field="RUN", value=ref, fix="`tpuctl runs list` shows the runs")
    if ledger.get_run(ref) is not None:
        return ref
    matches = ledger.run_ids_around(ref, limit=_SHOWN + 1)
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

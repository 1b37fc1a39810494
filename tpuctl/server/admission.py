"""Admission to the server's run queue: which waiting run goes next, whether it fits its workspace now,
why it waits, and which runs can never fit. Pure decisions over a ``QueueSnapshot``; the transaction that
reads the snapshot, admits and claims is the ledger's (``Ledger.admit_queued``, ``tpuctl.store.queue``).

The order (docs/queue.md): a sort key of plain values, so it is one ``ORDER BY`` once spend is a table:

1. the priority band: production, then interactive, then batch (a run that names none is batch);
2. its workspace's spend this calendar month (UTC) as a fraction of the workspace's ``usd_per_month``
   (no monthly budget: 0), lowest first: between workspaces, the one that used less of its share;
3. its principal's spend this month in that workspace, in USD, lowest first: between users of one
   workspace, the one who spent less;
4. age: ``queued_at``, oldest first (then the run id, so the order is total).

A run fits when its workspace allows its chips beside the chips its workspace's admitted, unfinished runs
hold (per generation in all and per capacity type: ``ChipLimit``) and the workspace's spend this month is
under its ``usd_per_month``. A run that does not fit blocks the runs behind it in its workspace and
generation (no back-filling: a big run is never starved by a stream of small ones); they wait "behind" it.
A run that can never fit (more chips than its workspace could ever hold, a generation or capacity type
with a limit of 0, a zone the workspace does not allow, a monthly budget of 0) is refused at submission
(``never_fits``, exit 3), not queued.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from tpuctl.catalog import CapacityType
from tpuctl.errors import InfeasibleError, UsageError
from tpuctl.services.cost.monthly_spend import MonthSpend, Spend
from tpuctl.store.queue import RETRY_AT, QueueDecision, QueueEntry, QueueSnapshot, workspace_of
from tpuctl.store.records import UNKNOWN_PRINCIPAL, PriorityBand, RunRecord

if TYPE_CHECKING:
    from tpuctl.catalog import Catalog
    from tpuctl.services.run.model import PreparedRun, Target
    from tpuctl.services.session import Session
    from tpuctl.teams.workspaces import Workspace, Workspaces


#: The reason of a run just submitted, until the next tick (woken by the submission) decides.
SUBMITTED_REASON: Final = "submitted; the next admission decides"


@dataclass(frozen=True)
class Demand:
    """What a run asks of its workspace: ``chips`` of ``generation`` (every slice of it), of
    ``capacity`` (None: not fixed yet), in ``zone`` (None: the placement chooses)."""

    generation: str
    chips: int
    capacity: CapacityType | None = None
    zone: str | None = None


def demand_of(record: RunRecord, catalog: Catalog) -> Demand | None:
    """The run's demand from its record (its accelerator type, slices, capacity and zone); None when its
    type is not recorded or not known (such a run is not counted and not limited)."""
    if record.accelerator_type is None:
        return None
    try:
        accelerator = catalog.resolve(record.accelerator_type)
    except UsageError:
        return None
    slices = int((record.detail or {}).get("slices", 1) or 1)
    return Demand(accelerator.generation.name, accelerator.chips * slices, record.capacity, record.zone)


def band_of(record: RunRecord) -> PriorityBand:
    try:
        return PriorityBand(record.priority or PriorityBand.BATCH)
    except ValueError:  # a band a newer tpuctl wrote: behind the known ones
        return PriorityBand.BATCH


def order_key(record: RunRecord, workspaces: Workspaces, spend: MonthSpend) -> tuple[float | str, ...]:
    """The run's place in the queue (the module docstring): smaller goes first."""
    name = workspace_of(record)
    workspace = workspaces.get(name)
    budget = None if workspace is None else workspace.usd_per_month
    spent = spend.by_workspace.get(name, Spend()).spent_usd
    share = spent / budget if budget else 0.0
    mine = spend.by_principal.get((name, record.principal or UNKNOWN_PRINCIPAL), Spend()).spent_usd
    age = record.queued_at if record.queued_at is not None else record.created_at
    return (band_of(record).rank, share, mine, age, record.run_id)


def never_fits(workspace: Workspace, demand: Demand) -> InfeasibleError | None:
    """Why a run of ``demand`` can never run in ``workspace`` (its limits, not its usage), as the exit-3
    error a submission is refused with; None when it could fit some day."""
    fix = f"ask an admin of workspace {workspace.name} to raise the limit in the server's workspace file"
    if workspace.usd_per_month == 0:
        return InfeasibleError(
            f"workspace {workspace.name} has a monthly budget of 0 USD: no run of it can start", fix=fix
        )
    if demand.zone is not None and workspace.zones is not None and demand.zone not in workspace.zones:
        return InfeasibleError(
            f"workspace {workspace.name} may not use zone {demand.zone} (its zones: "
            f"{', '.join(workspace.zones)})",
            fix=f"choose one of its zones with --zone, or {fix[0].lower()}{fix[1:]}",
        )
    limit = workspace.chip_limit(demand.generation)
    if limit is None:
        return None
    # The binding limit: the capacity type's own where it is the lower one (and the run's type is known).
    cap = None if demand.capacity is None else limit.by_capacity.get(demand.capacity)
    by_type = cap is not None and (limit.total is None or cap < limit.total)
    largest = cap if by_type else limit.total
    if largest is None or demand.chips <= largest:
        return None
    what = f"{demand.capacity} {demand.generation}" if by_type else demand.generation
    if largest == 0:
        message = f"workspace {workspace.name} may not use {what} chips (its limit is 0)"
    else:
        message = (
            f"the run needs {demand.chips} {what} chips, more than workspace {workspace.name} may ever "
            f"hold at once ({largest})"
        )
    return InfeasibleError(message, fix=f"ask for a smaller slice, or {fix}")


def fitting_types(workspace: Workspace, target: Target) -> tuple[tuple[str, ...], InfeasibleError | None]:
    """Of the slice types a run to place may take (``target``'s first, then its others: API names, in the
    run's order), those ``workspace`` could some day hold under one of its capacity types, in one of its
    zones (any, where it names none). None fitting: the first type's refusal (exit 3). A run on existing
    slices (``--pod``) has their one type, capacity type and zone."""
    placement = target.placement
    if placement is None:
        chips = target.accelerator.chips * target.slices
        demand = Demand(target.accelerator.generation.name, chips, target.capacity, target.zone)
        refusal = never_fits(workspace, demand)
        return ((), refusal) if refusal is not None else ((target.accelerator.api_name,), None)
    accelerators = (placement.accelerator, *(t.accelerator for t in placement.other_types))
    fitting: list[str] = []
    first_refusal: InfeasibleError | None = None
    for accelerator in accelerators:
        refusals = [
            never_fits(
                workspace,
                Demand(accelerator.generation.name, accelerator.chips * placement.slices, capacity, zone),
            )
            for capacity in placement.capacity_types
            for zone in placement.zones or (None,)
        ]
        if any(refusal is None for refusal in refusals):
            fitting.append(accelerator.api_name)
        elif first_refusal is None:
            first_refusal = refusals[0]
    return tuple(fitting), None if fitting else first_refusal


def queue_entry(session: Session, workspaces: Workspaces, prepared: PreparedRun) -> QueueEntry:
    """How ``prepared`` enters the queue: its workspace (the actor's, ``--workspace``), principal, band
    and first reason; ``InfeasibleError`` (exit 3) when it can never fit its workspace (``never_fits``)."""
    request, target = prepared.request, prepared.target
    name = session.actor.submit_workspace(request.workspace)
    workspace = workspaces.get(name)
    if workspace is None:
        raise InfeasibleError(
            f"workspace {name} is not in the server's workspace file",
            fix="submit to a workspace the server's file names (`tpuctl workspace list`)",
        )
    _, refusal = fitting_types(workspace, target)
    if refusal is not None:
        raise refusal
    return QueueEntry(
        workspace=name,
        principal=session.actor.principal,
        priority=PriorityBand(request.priority or PriorityBand.BATCH).value,
        reason=SUBMITTED_REASON,
    )


@dataclass
class _Usage:
    """Chips held in one workspace, per generation, in all and per capacity type."""

    total: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    by_capacity: dict[tuple[str, CapacityType | None], int] = field(default_factory=lambda: defaultdict(int))

    def add(self, demand: Demand) -> None:
        self.total[demand.generation] += demand.chips
        self.by_capacity[(demand.generation, demand.capacity)] += demand.chips


class Admission:
    """Decides a tick's admissions (``decide``) under ``workspaces``' limits, with ``spend`` this month;
    ``room``: how many runs the deciding replica may take up now (those that fit beyond it wait for a
    replica with room)."""

    def __init__(self, workspaces: Workspaces, catalog: Catalog, spend: MonthSpend, *, room: int) -> None:
        self._workspaces = workspaces
        self._catalog = catalog
        self._spend = spend
        self._room = room

    def decide(self, snapshot: QueueSnapshot) -> QueueDecision:
        usage: dict[str, _Usage] = defaultdict(_Usage)
        for held in snapshot.holding:
            demand = demand_of(held, self._catalog)
            if demand is not None:
                usage[workspace_of(held)].add(demand)
        admit: list[str] = []
        reasons: dict[str, str] = {}
        blocked: dict[tuple[str, str], str] = {}  # (workspace, generation) -> the run that blocks it
        for record in sorted(snapshot.waiting, key=lambda r: order_key(r, self._workspaces, self._spend)):
            name = workspace_of(record)
            retry_at = (record.detail or {}).get(RETRY_AT)
            if isinstance(retry_at, int | float) and retry_at > snapshot.now:
                continue  # backing off from Google's quota or capacity: its reason stays, it blocks nobody
            demand = demand_of(record, self._catalog)
            reason = self.reason(record, demand, usage[name])
            if reason is None and demand is not None and (name, demand.generation) in blocked:
                reason = f"behind run {blocked[name, demand.generation]} (ahead of it in the queue)"
            if reason is None and len(admit) >= self._room:
                reason = f"fits workspace {name}; waiting for a replica with room to supervise it"
            if reason is not None:
                reasons[record.run_id] = reason
                if demand is not None:
                    blocked.setdefault((name, demand.generation), record.run_id)
                continue
            admit.append(record.run_id)
            if demand is not None:
                usage[name].add(demand)
        return QueueDecision(tuple(admit), reasons)

    def reason(self, record: RunRecord, demand: Demand | None, usage: _Usage) -> str | None:
        """Why ``record`` cannot be admitted now beside ``usage`` (its workspace's); None: it fits."""
        name = workspace_of(record)
        workspace = self._workspaces.get(name)
        if workspace is None:
            return f"workspace {name} is not in the server's workspace file"
        budget = workspace.usd_per_month
        spent = self._spend.by_workspace.get(name, Spend()).spent_usd
        if budget is not None and spent >= budget:
            return (
                f"workspace {name}: {spent:.2f} of {budget:.2f} USD spent this month "
                f"({self._spend.month}, UTC)"
            )
        limit = None if demand is None else workspace.chip_limit(demand.generation)
        if demand is None or limit is None:
            return None
        gen, more = demand.generation, demand.chips
        used = usage.total[gen]
        if limit.total is not None and used + more > limit.total:
            return _chips_reason(name, used, limit.total, gen, more)
        cap = None if demand.capacity is None else limit.by_capacity.get(demand.capacity)
        if cap is not None:
            used_there = usage.by_capacity[(gen, demand.capacity)]
            if used_there + more > cap:
                return _chips_reason(name, used_there, cap, f"{demand.capacity} {gen}", more)
        return None


def _chips_reason(workspace: str, used: int, limit: int, what: str, more: int) -> str:
    """``workspace team-a: 32 of 32 v5e chips in use`` (and what the run needs, where that is not all)."""
    text = f"workspace {workspace}: {used} of {limit} {what} chips in use"
    return text if used >= limit else f"{text}, the run needs {more}"

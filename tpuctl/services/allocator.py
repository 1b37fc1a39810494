"""The allocator: quota-checked, price-capped, multi-zone placement with failover.

``Allocator.plan(request)`` looks (the live listing, the queued resources, the quota limits from Cloud
Quotas, and what each zone offers, all through the cloud boundary, the independent reads in parallel),
builds and judges every candidate (``tpuctl.services.placement``), and adds the exact requests it would
send. It changes nothing: it is what ``pod create --dry-run`` prints.

``Allocator.place(request)`` carries the plan out:

* default (``--strategy cheapest``, no ``--queued``): create the node in the first candidate and wait
  until READY; on a stockout, a quota race, or anything another zone could cure, fail over to the next.
  Rate limits and transient errors are retried (tenacity, jittered, bounded); after an ambiguous failure
  (timeout, reset) it looks before creating again, so one request never makes two slices. Every attempt
  is recorded in the ledger with its outcome. A failed attempt leaves nothing behind: a leftover node of
  this request is deleted, and a final sweep over the listing deletes any other.
* ``--queued``, ``--slices N`` (N > 1) and ``--strategy race`` go through queued resources
  (``tpuctl.services.queued``); except ``--queued`` on Compute Engine, which has no queued resources:
  there it is a flex-start create, placed (and failed over) like any other create, its wait for capacity
  bounded by ``--valid-for``.

Plain Python: no CLI, no rendering; progress goes to an ``OperationProgress``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tpuctl import params
from tpuctl.catalog import AcceleratorType, CapacityType, Catalog, Surface, region_of_zone
from tpuctl.cloud.base import (
    LABEL_LEDGER,
    LABEL_MANAGED_BY,
    LABEL_MANAGED_BY_VALUE,
    LABEL_OWNER,
    LABEL_REQUEST,
    LABEL_RUN,
    HostNetwork,
    Node,
    OperationProgress,
    PlannedRequest,
    QueuedResource,
    QuotaLimit,
    TpuCloud,
)
from tpuctl.cloud.buckets import BucketLocation
from tpuctl.cloud.compute_shapes import FLEX_VALID_FOR_MAX_S
from tpuctl.cloud.retry import RetryPolicy, Sleep
from tpuctl.cloud.surfaces import asking_only
from tpuctl.errors import (
    AlreadyExistsError,
    AmbiguousError,
    CloudError,
    NotFoundError,
    PermissionDeniedError,
    QuotaExceededError,
    StockoutError,
    UnauthenticatedError,
    UsageError,
)
from tpuctl.services.attempts import (
    AttemptResult,
    NameTakenError,
    Placement,
    PlacementContext,
    Recorder,
    describe_error,
    exhausted_error,
    find_own_node,
    is_fatal,
    node_request,
    outcome_for,
    queued_request,
)
from tpuctl.services.placement import (
    DEFAULT_RACE_K,
    Candidate,
    Offer,
    PlacementRequest,
    Plan,
    SliceType,
    Strategy,
    TypePreference,
    build_candidates,
    candidate_zones,
    decide,
    resolve_capacity_types,
)
from tpuctl.services.pods import default_pod_name, new_request_id, validate_node_name
from tpuctl.services.quota import QuotaBook
from tpuctl.store.records import AttemptOutcome, EventKind

if TYPE_CHECKING:
    from tpuctl.services.session import Session
    from tpuctl.settings import Settings

Clock = Callable[[], float]


def build_request(
    catalog: Catalog,
    settings: Settings,
    type_name: str,
    *,
    name: str | None = None,
    zones: Sequence[str] = (),
    region: str | None = None,
    capacity_types: Sequence[CapacityType] = (),
    reserved: str | None = None,
    max_price: float | None = None,
    queued: bool = False,
    valid_for_s: float | None = None,
    strategy: Strategy = Strategy.CHEAPEST,
    race_k: int | None = None,
    slices: int = 1,
    runtime_version: str | None = None,
    labels: Mapping[str, str] | None = None,
    metadata: Mapping[str, str] | None = None,
    wait: bool = True,
    request_id: str | None = None,
    surface: Surface | None = None,
    network: HostNetwork | None = None,
    service_account: str | None = None,
    other_types: Sequence[str] = (),
    type_preference: TypePreference = TypePreference.ORDERED,
) -> PlacementRequest:
    """Check the request's parsed values against each other into a ``PlacementRequest``; given values win
    over settings (env, profile). The values come parsed from the edge (``tpuctl.params``): the allowed
    capacity types in order (``queued`` when ``--capacity-type queued`` or ``--queued`` was given), the
    reservation name, the price cap, seconds, the strategy, and ``race_k`` None when not given. A bad
    combination raises a ``UsageError`` (exit 2) naming the parameter, the value and the fix; nothing is
    contacted."""
    accel = catalog.resolve(type_name)
    chosen_surface = _surface(accel, surface, settings.api)
    types, reservation = resolve_capacity_types(
        capacity_types=capacity_types, reserved=reserved, defaults=settings.capacity_types
    )
    if slices > 1:
        _check_multislice(catalog, accel)
    if chosen_surface is Surface.COMPUTE:
        _check_compute(slices, strategy)
        if queued:
            types, valid_for_s = _flex_start(capacity_types, reservation, valid_for_s)
    _check_race(strategy, race_k, wait=wait)
    _check_valid_for(valid_for_s, queued=queued or slices > 1 or strategy is Strategy.RACE)
    host_network = settings.host_network if network is None else network
    explicit_zones, chosen_region = _places(settings, zones, region)
    chosen_region = _subnetwork_region(host_network, explicit_zones, chosen_region)
    rid = request_id or new_request_id()
    pod_name = _pod_name(name, accel, rid, slices)
    all_labels = dict(labels or {})
    all_labels.update({LABEL_MANAGED_BY: LABEL_MANAGED_BY_VALUE, LABEL_OWNER: settings.resolved_owner})
    others = _other_types(
        catalog,
        accel,
        other_types,
        demanded=surface,
        preferred=settings.api,
        runtime_version=runtime_version,
        through_queued=queued or slices > 1 or strategy is Strategy.RACE,
    )
    return PlacementRequest(
        accelerator=accel,
        name=pod_name,
        request_id=rid,
        capacity_types=types,
        runtime_version=runtime_version or accel.runtime_version,
        labels=all_labels,
        zones=explicit_zones,
        region=chosen_region,
        max_price=settings.max_price if max_price is None else max_price,
        slices=slices,
        queued=queued,
        valid_for_s=valid_for_s,
        strategy=strategy,
        race_k=DEFAULT_RACE_K if race_k is None else race_k,
        reservation=reservation,
        wait=wait,
        metadata=dict(metadata or {}),
        surface=chosen_surface,
        network=host_network,
        service_account=settings.service_account if service_account is None else service_account,
        other_types=others,
        type_preference=type_preference,
    )


def _other_types(
    catalog: Catalog,
    first: AcceleratorType,
    names: Sequence[str],
    *,
    demanded: Surface | None,
    preferred: Surface | None,
    runtime_version: str | None,
    through_queued: bool,
) -> tuple[SliceType, ...]:
    """The other slice types a request allows, each with its own API and runtime (a given
    ``--runtime-version`` holds for every type), without repeats. Several types are placed by direct
    creates, failing over from one candidate to the next; a queued resource (``--queued``, ``--slices``,
    a race) is of one type, so those are refused with several."""
    out: list[SliceType] = []
    seen = {first.api_name}
    for name in names:
        accel = catalog.resolve(name)
        if accel.api_name in seen:
            continue
        seen.add(accel.api_name)
        out.append(
            SliceType(accel, _surface(accel, demanded, preferred), runtime_version or accel.runtime_version)
        )
    if out and through_queued:
        raise UsageError(
            "several slice types are placed by creating a slice of one type after another; --queued, "
            "--slices and --strategy race place one type through a queued resource",
            field="type",
            value=", ".join([first.friendly_name, *(t.accelerator.friendly_name for t in out)]),
            fix="give one type, or drop --queued/--slices/--strategy race",
        )
    return tuple(out)


def _surface(accel: AcceleratorType, demanded: Surface | None, preferred: Surface | None) -> Surface:
    """The API that places the slice: ``--api`` is a demand (refused, exit 2, where the generation has
    no such path); the profile's ``api`` a preference, kept where the generation offers it."""
    generation = accel.generation
    if demanded is not None:
        generation.check_surface(demanded)
        return demanded
    if preferred is not None and preferred in generation.surfaces:
        return preferred
    return generation.default_surface


def _check_multislice(catalog: Catalog, accel: AcceleratorType) -> None:
    """Only generations Cloud TPU Multislice supports (v4 and later) join slices over the DCN."""
    if accel.generation.multislice:
        return
    able = [g.name for g in catalog.generations.values() if g.multislice]
    raise UsageError(
        f"{accel.generation.name} slices cannot be joined into a multislice (Cloud TPU Multislice supports "
        f"{', '.join(able)})",
        field="slices",
        value=accel.friendly_name,
        fix=f"drop --slices to run on one {accel.friendly_name}, or choose a type of {' or '.join(able)}",
    )


def _check_compute(slices: int, strategy: Strategy) -> None:
    """Multislice and a race need queued resources, which only the TPU API has."""
    for option, given in (("slices", slices > 1), ("strategy", strategy is Strategy.RACE)):
        if given:
            flag = "--slices" if option == "slices" else "--strategy race"
            raise UsageError(
                f"{flag} places through queued resources, which only the TPU API has",
                field=option,
                value=slices if option == "slices" else strategy.value,
                fix=f"drop {flag} to place on Compute Engine, or use --api tpu where the type allows it",
            )


def _flex_start(
    given: Sequence[CapacityType], reservation: str | None, valid_for_s: float | None
) -> tuple[tuple[CapacityType, ...], float]:
    """``--queued`` on Compute Engine is flex-start: a provisioning model of its own that spends
    preemptible quota (docs/google-facts.md#provisioning-models, the stricter of its two readings), so
    its capacity class is preemptible; a reservation is another model. It waits for capacity at most 2 h
    (docs/google-facts.md#flex-start): the default, and the most ``--valid-for`` may say."""
    if reservation is not None or CapacityType.RESERVED in given:
        raise UsageError(
            "--queued on Compute Engine is flex-start, which does not use a reservation",
            field="capacity_types",
            value=CapacityType.RESERVED.value,
            fix="drop --queued to use the reservation, or drop the reservation to wait for flex-start",
        )
    limit = float(FLEX_VALID_FOR_MAX_S)
    if valid_for_s is not None and valid_for_s > limit:
        raise UsageError(
            f"--valid-for {valid_for_s:.0f}s is longer than Compute Engine flex-start waits for capacity",
            field="valid_for",
            value=valid_for_s,
            fix="give --valid-for 2h or less",
        )
    return (CapacityType.PREEMPTIBLE,), limit if valid_for_s is None else valid_for_s


def _check_race(strategy: Strategy, race_k: int | None, *, wait: bool) -> None:
    """``race_k`` belongs to a race, and a race must wait for its winner."""
    if race_k is not None and strategy is not Strategy.RACE:
        raise UsageError(
            "--race-k only applies to --strategy race",
            field="race_k",
            value=race_k,
            fix="add --strategy race, or drop --race-k",
        )
    if strategy is Strategy.RACE and not wait:
        raise UsageError(
            "--strategy race cannot be combined with --no-wait",
            field="wait",
            fix="a race must wait to keep one winner and delete the others: drop --no-wait, or use --queued "
            "--no-wait to queue in the cheapest zone only",
        )


def _check_valid_for(valid_for_s: float | None, *, queued: bool) -> None:
    """A validity window only means something for a queued resource."""
    if valid_for_s is not None and not queued:
        raise UsageError(
            "--valid-for only applies to queued resources",
            field="valid_for",
            value=valid_for_s,
            fix="add --queued (or --strategy race), or drop --valid-for",
        )


def _places(
    settings: Settings, zones: Sequence[str], region: str | None
) -> tuple[tuple[str, ...], str | None]:
    """The explicit zones and the region: the given ones, else the settings'; zones and a region exclude
    each other."""
    explicit_zones = [params.zone(z, "zones") for z in zones] or ([] if region else list(settings.zones))
    chosen_region = region if region is not None else (None if explicit_zones else settings.region)
    if region is not None:
        params.region(region)
        if zones:
            raise UsageError(
                "--zone and --region exclude each other",
                field="region",
                value=region,
                fix="give zones (--zone, repeatable) or one region, not both",
            )
    return tuple(explicit_zones), chosen_region


def _subnetwork_region(network: HostNetwork, zones: Sequence[str], region: str | None) -> str | None:
    """A subnetwork is regional and a slice must be in its region (docs/google-facts.md#networks): one
    named with its region keeps placement there (the region, unless zones are given), and zones or a
    region elsewhere are a usage error, before any candidate is judged."""
    subnetwork = network.subnetwork
    if subnetwork is None or subnetwork.region is None:
        return region
    where = subnetwork.region
    outside = [z for z in zones if region_of_zone(z) != where]
    if outside or (region is not None and region != where):
        given = f"--zone {', '.join(outside)}" if outside else f"--region {region}"
        raise UsageError(
            f"{given} is not in the region of subnetwork {subnetwork.text} ({where}): a slice's hosts "
            "join a subnetwork of their own region",
            field="zones" if outside else "region",
            value=", ".join(outside) if outside else region,
            fix=f"place in {where} (--region {where}, or its zones), or name a subnetwork of that region",
        )
    return region if zones else where


def _pod_name(name: str | None, accel: AcceleratorType, request_id: str, slices: int) -> str:
    """The given name (checked; each slice's ``<name>-i`` must fit GCP's 63 characters), else a default."""
    pod_name = validate_node_name(name) if name else default_pod_name(accel, request_id)
    if slices > 1:
        for node_name in (f"{pod_name}-{i}" for i in range(slices)):
            if len(node_name) > 63:
                raise UsageError(
                    f"--name {pod_name!r} is too long for {slices} slices ({node_name!r} has more than 63 "
                    "characters)",
                    field="pod_name",
                    value=pod_name,
                    fix="use a shorter name",
                )
    return pod_name


@dataclass(frozen=True)
class Survey:
    """What the allocator saw before deciding: one snapshot of the project."""

    nodes: list[Node]
    queued: list[QueuedResource]
    book: QuotaBook
    zones: list[str]
    offers: dict[str, Offer]
    warnings: tuple[str, ...] = ()  # what the plan should say about the survey (unreadable quotas)
    bucket: BucketLocation | None = None  # where the run's checkpoint bucket is, when it could be read


class Allocator:
    """Plans and carries out placements for one session (cloud, ledger, catalog, settings)."""

    def __init__(
        self,
        session: Session,
        *,
        retry: RetryPolicy | None = None,
        poll_interval_s: float | None = None,
        poll_max_interval_s: float | None = None,
        ready_timeout_s: float = 3600.0,
        queued_timeout_s: float | None = None,
        max_workers: int = 16,
        sleep: Sleep | None = None,
        clock: Clock | None = None,
    ) -> None:
        """``sleep`` and ``clock`` (monotonic) default to the session's: a test's simulated time moves
        when the allocator waits."""
        self._session = session
        self._cloud = session.cloud
        self._catalog = session.catalog
        tuning = session.backend.tuning
        monotonic: Clock = clock or session.monotonic
        self._clock = monotonic
        self._max_workers = max_workers
        self.context = PlacementContext(
            cloud=self._cloud,
            recorder=Recorder(
                session.ledger,
                backend=self._cloud.backend,
                project=self._cloud.project,
                clock=monotonic,
                actor=session.actor,
            ),
            retry=retry or tuning.step_retry,
            sleep=sleep or session.sleep,
            clock=monotonic,
            poll_interval_s=poll_interval_s or tuning.poll_interval_s,
            poll_max_interval_s=poll_max_interval_s or tuning.poll_max_interval_s,
            ready_timeout_s=ready_timeout_s,
            max_workers=max_workers,
            queued_timeout_s=queued_timeout_s,
        )

    # --- looking --------------------------------------------------------------------------------------

    def survey(self, request: PlacementRequest) -> Survey:
        """The live listing, queued resources, quota limits and offers, read in parallel where independent.

        Only the surfaces the generation can use are asked (a caller may hold roles on one surface
        only: a v5e request never needs Compute Engine), and the offers only on the surface the create
        goes to: a type the other surface offers does not help it."""
        accel = request.accelerator
        cloud = asking_only(self._cloud, accel.generation.surfaces)
        creating_on = asking_only(self._cloud, (request.surface,))
        with ThreadPoolExecutor(max_workers=self._max_workers, thread_name_prefix="tpuctl-survey") as pool:
            # Cloud Quotas has its own HTTP client: start it at once. The first TPU API call runs alone:
            # it builds the API client, which must not happen in two threads at once.
            limits_f = pool.submit(cloud.quota_limits)
            bucket_f = pool.submit(self._bucket_location, request.checkpoint_bucket)
            nodes = cloud.list_nodes(None)
            queued_f = pool.submit(cloud.list_queued_resources, None)
            cloud_zones: list[str] = []
            if request.region and not request.zones:
                cloud_zones = pool.submit(cloud.list_zones).result()
            zones = candidate_zones(
                accel, zones=request.zones, region=request.region, cloud_zones=cloud_zones
            )
            offer_fs = {z: pool.submit(self._offer, creating_on, z, accel.api_name) for z in zones}
            offers = {z: f.result() for z, f in offer_fs.items()}
            limits, unread = _read_limits(limits_f)
            queued = queued_f.result()
            bucket, unplaced = bucket_f.result()
        self._check_name_free(request, nodes, queued)
        book = QuotaBook(self._catalog, limits, nodes, queued)
        return Survey(
            nodes=nodes,
            queued=queued,
            book=book,
            zones=zones,
            offers=offers,
            warnings=(*unread, *unplaced),
            bucket=bucket,
        )

    def _bucket_location(self, bucket: str | None) -> tuple[BucketLocation | None, list[str]]:
        """Where the run's checkpoint bucket is (None without one); a bucket whose location cannot be
        read is a warning, not a failure: placement goes on without it (the bucket itself is checked
        before a run starts, and by `tpuctl doctor`)."""
        if bucket is None:
            return None, []
        try:
            return self._session.buckets().location(bucket), []
        except CloudError as exc:
            return None, [
                f"the location of bucket gs://{bucket} could not be read ({exc.message}): zones are ranked "
                "without it"
            ]

    def _offer(self, cloud: TpuCloud, zone: str, api_name: str) -> Offer:
        try:
            types = cloud.list_accelerator_types(zone)
        except NotFoundError:
            return Offer(False, "the TPU API does not know this zone")
        except (PermissionDeniedError, UnauthenticatedError):
            raise
        except CloudError as exc:
            return Offer(False, f"could not list its accelerator types: {exc.message}")
        return Offer(api_name in types)

    def _check_name_free(
        self, request: PlacementRequest, nodes: Sequence[Node], queued: Sequence[QueuedResource]
    ) -> None:
        """A name already in use anywhere is refused up front: failing over would otherwise give two slices
        of one name in different zones, which `pod describe NAME` could not tell apart."""
        wanted = set(request.node_names)
        for node in nodes:
            if node.name in wanted:
                raise NameTakenError(
                    f"a slice named {node.name!r} already exists in {node.zone} ({node.state})",
                    fix="choose another --name, or delete that slice first (`tpuctl pod delete`)",
                )
        if request.uses_queued_resource:
            for qr in queued:
                if qr.id == request.name:
                    raise NameTakenError(
                        f"a queued resource named {qr.id!r} already exists in {qr.zone} ({qr.state})",
                        fix="choose another --name, or delete it first (`tpuctl pod gc` removes failed ones)",
                    )

    def plan(self, request: PlacementRequest, survey: Survey | None = None) -> Plan:
        """The dry-run plan: every candidate judged, the verdict, and the exact requests. Mutates nothing."""
        request = self.stamped(request)
        if request.other_types:
            return self._plan_types(request)
        seen = survey or self.survey(request)
        candidates = build_candidates(
            request,
            catalog=self._catalog,
            book=seen.book,
            zones=seen.zones,
            offers=seen.offers,
            bucket=seen.bucket,
        )
        # Unreadable quotas are said once, not once per quota and zone.
        warnings = [*seen.warnings, *quota_warnings(candidates, name_unknown=not seen.warnings)]
        plan = decide(request, candidates, zones=seen.zones, warnings=warnings, bucket=seen.bucket)
        plan.requests = self._planned_requests(request, plan)
        return plan

    def _plan_types(self, request: PlacementRequest) -> Plan:
        """The plan of a request of several types: each type surveyed through its own APIs (a
        generation may be offered on Compute Engine only, and each is offered in its own zones), every
        type x zone x capacity candidate ranked together."""
        candidates: list[Candidate] = []
        zones: list[str] = []
        warnings: list[str] = []
        bucket: BucketLocation | None = None
        for type_rank, slice_type in enumerate(request.slice_types):
            one = request.for_type(slice_type)
            seen = self.survey(one)
            found = build_candidates(
                one,
                catalog=self._catalog,
                book=seen.book,
                zones=seen.zones,
                offers=seen.offers,
                bucket=seen.bucket,
                type_rank=type_rank,
                several_types=True,
            )
            candidates += found
            zones += [z for z in seen.zones if z not in zones]
            bucket = bucket or seen.bucket
            said = [*seen.warnings, *quota_warnings(found, name_unknown=not seen.warnings)]
            warnings += [w for w in said if w not in warnings]
        plan = decide(request, candidates, zones=zones, warnings=warnings, bucket=bucket)
        plan.requests = self._planned_requests(request, plan)
        return plan

    def stamped(self, request: PlacementRequest) -> PlacementRequest:
        """The request with this ledger's identity among its labels: what lets `pod gc` prove a live
        slice is its own (``$USER`` cannot: two machines may both be root)."""
        identity = self._session.ledger.identity
        if LABEL_RUN not in request.labels:
            # A slice outside any run is its maker's, in the workspace asked for (checked here, before
            # anything is planned or created: exit 2 names the choices).
            workspace = self._session.actor.submit_workspace(request.workspace)
            if workspace != request.workspace:
                request = dataclasses.replace(request, workspace=workspace)
        if request.labels.get(LABEL_LEDGER) == identity:
            return request
        return dataclasses.replace(request, labels={**request.labels, LABEL_LEDGER: identity})

    def _planned_requests(self, request: PlacementRequest, plan: Plan) -> list[PlannedRequest]:
        if not plan.order:
            return []
        if not request.uses_queued_resource:
            chosen = plan.order[0]
            node = node_request(request.placing(chosen), chosen, request.request_id)
            return self._cloud.plan_create_node(node, request_id=request.request_id)
        targets = plan.racing if request.strategy is Strategy.RACE else plan.order[:1]
        out = []
        for cand in targets:
            qr, api_rid = queued_request(request, cand)
            out.append(self._cloud.plan_create_queued_resource(qr, request_id=api_rid))
        return out

    # --- placing --------------------------------------------------------------------------------------

    def place(
        self,
        request: PlacementRequest,
        *,
        progress: OperationProgress | None = None,
        plan: Plan | None = None,
    ) -> Placement:
        """Carry the plan out (see the module docstring). Raises the plan's InfeasibleError when no
        candidate can take the request, or one naming every attempt when all feasible ones failed."""
        started = self._clock()
        request = self.stamped(request)
        chosen_plan = plan or self.plan(request)
        error = chosen_plan.error()
        if error is not None:
            raise error
        if request.uses_queued_resource:
            from tpuctl.services.queued import QueuedPlacer

            placer = QueuedPlacer(self.context, wall_clock=self._session.clock)
            if request.strategy is Strategy.RACE:
                return placer.race(request, chosen_plan, progress=progress, started=started)
            return placer.sequential(request, chosen_plan, progress=progress, started=started)
        return self._place_nodes(request, chosen_plan, progress, started)

    def _place_nodes(
        self, request: PlacementRequest, plan: Plan, progress: OperationProgress | None, started: float
    ) -> Placement:
        attempts: list[AttemptResult] = []
        kept: str | None = None
        # Without waiting a stockout cannot be seen, so there is nothing to fail over on: one attempt.
        order = plan.order if request.wait else plan.order[:1]
        try:
            for rank, cand in enumerate(order, 1):
                if progress is not None:
                    progress.update(
                        f"trying {cand.label()} [{rank}/{len(order)}]", elapsed_s=self._clock() - started
                    )
                attempt, node, exc = self._attempt_node(request.placing(cand), cand, rank, progress)
                attempts.append(attempt)
                if node is not None:
                    kept = cand.zone
                    ready_at = self._clock() if request.wait else None
                    return Placement(
                        plan=plan,
                        candidate=cand,
                        nodes=[node],
                        attempts=attempts,
                        queued_resource=None,
                        started_at=started,
                        ready_at=ready_at,
                    )
                if exc is not None and (is_fatal(exc) or isinstance(exc, KeyboardInterrupt)):
                    raise exc
            raise exhausted_error(plan, attempts)
        finally:
            # One attempt that succeeded left nothing else; any failure may have (the listing finds it).
            if kept is None or len(attempts) > 1:
                self._sweep(request, keep=kept)

    def _attempt_node(
        self,
        request: PlacementRequest,
        cand: Candidate,
        rank: int,
        progress: OperationProgress | None,
    ) -> tuple[AttemptResult, Node | None, BaseException | None]:
        ctx = self.context
        rec = ctx.recorder
        name, zone, rid = request.name, cand.zone, request.request_id
        nreq = node_request(request, cand, rid)
        rec.pod_event(EventKind.REQUESTED, request, cand, name, labels=nreq.labels, detail={"rank": rank})
        t0 = self._clock()
        try:

            def create_once() -> Node:
                try:
                    return self._cloud.create_node(nreq, request_id=rid, wait=request.wait, progress=progress)
                except (AmbiguousError, AlreadyExistsError):
                    # The create may have happened (or happened on an earlier try): look before creating
                    # again. Our own node is adopted; nothing there means creating again is safe.
                    existing = find_own_node(self._cloud, zone, name, rid)
                    if existing is not None:
                        return existing
                    raise

            node = ctx.retried(create_once)
            rec.pod_event(EventKind.CREATED, request, cand, name, detail={"state": node.state})
            if request.wait:
                # A create waited on returns the node as its operation left it (READY); a node adopted
                # after an ambiguous failure may still be CREATING: follow it.
                if node.state != "READY":
                    node = ctx.wait_node_ready(zone, name, progress)
                rec.pod_event(EventKind.READY, request, cand, name)
        except BaseException as exc:  # every failure (Ctrl-C included) is recorded, cleaned up, then judged
            outcome = outcome_for(exc)
            rec.pod_event(
                EventKind.FAILED,
                request,
                cand,
                name,
                detail={"outcome": outcome.value, "error": describe_error(exc)},
            )
            # A clean refusal (stockout, quota) created nothing to look for; anything else may have left
            # a node behind, so look now (the final sweep catches the rest).
            if not isinstance(exc, StockoutError | QuotaExceededError | NameTakenError):
                self._clean_up_node(request, zone)
            attempt = rec.attempt(request, cand, outcome, message=describe_error(exc), started=t0)
            return attempt, None, exc
        state = node.state
        attempt = rec.attempt(request, cand, AttemptOutcome.CREATED, message=f"{state} in {zone}", started=t0)
        return attempt, node, None

    def _clean_up_node(self, request: PlacementRequest, zone: str) -> None:
        try:
            leftover = self.context.retried(
                lambda: find_own_node(self._cloud, zone, request.name, request.request_id)
            )
        except CloudError:
            return  # not ours, or cannot look now: the final sweep looks again
        if leftover is not None and self.context.delete_node_quietly(zone, request.name):
            self.context.recorder.gone(zone, request.name, request.request_id, "cleanup after failed attempt")

    def _sweep(self, request: PlacementRequest, keep: str | None) -> None:
        """Delete every node of this request but the one kept (in zone ``keep``): whatever a failed attempt
        may have left that the per-attempt cleanup did not see."""
        try:
            nodes = self._cloud.list_nodes(None)
        except CloudError:
            return  # `pod gc` finds leftovers later: they carry our labels and no live ledger entry
        for node in nodes:
            if node.labels.get(LABEL_REQUEST) != request.request_id:
                continue
            if node.name == request.name and node.zone == keep:
                continue
            if self.context.delete_node_quietly(node.zone, node.name):
                self.context.recorder.gone(node.zone, node.name, request.request_id, "cleanup sweep")


def _read_limits(limits_f: Future[list[QuotaLimit]]) -> tuple[list[QuotaLimit] | None, list[str]]:
    """The quota limits, or None and a warning when Cloud Quotas refuses to tell (403: the API not
    enabled, or a caller without roles/cloudquotas.viewer): every limit is then unknown and the create
    answers, as it would have without the check."""
    try:
        return limits_f.result(), []
    except PermissionDeniedError as exc:
        return None, [
            f"could not read quota limits from Cloud Quotas ({exc.message}); placement goes on without "
            "a quota check and lets the create answer"
        ]


def quota_warnings(candidates: Sequence[Candidate], *, name_unknown: bool = True) -> list[str]:
    """One warning per quota the request is short of while dead slices (PREEMPTED/TERMINATED, or failed
    and suspended queued resources) hold some of it: deleting them (`tpuctl pod gc`) may make room; and
    one per quota whose limit is unknown (the create is tried and answers for it)."""
    seen: set[tuple[str, str]] = set()
    out: list[str] = []
    for cand in candidates:
        if not cand.offered:
            continue
        for q in cand.quota:
            if name_unknown and not q.known and (q.quota_id, q.location) not in seen:
                seen.add((q.quota_id, q.location))
                out.append(q.shortfall())
            if q.fits or not q.reclaimable or (q.quota_id, q.location) in seen:
                continue
            seen.add((q.quota_id, q.location))
            holders = ", ".join(q.reclaimable_holders) or "dead slices"
            would = "would make room" if q.fits_after_gc else "would help but not be enough"
            out.append(
                f"preempted or failed slices hold {q.reclaimable} {q.unit} of {q.scope} quota "
                f"{q.quota_id} in {q.location}, which this request needs ({q.needed} {q.unit}, "
                f"{q.available} available): {holders}; deleting them (`tpuctl pod gc`) {would}"
            )
    return out

"""The simulator's world file: which zones exist, what they offer, how much capacity and quota there is,
how fast time runs and what goes wrong.

A world is YAML validated with pydantic. Any mistake raises ``tpuctl.errors.ConfigError`` naming the
file, the dotted field, the bad value and the fix. The bundled default world (``data/world.yaml``, also
reachable as ``configs/world.yaml``) is commented and doubles as the reference for every field.

Decisions worth knowing:

- Zones may be any well-formed zone name (``us-central1-a``), whether or not the catalog lists the
  generation there: a world is a what-if, and tests use made-up placements. The default world offers
  each generation exactly in the catalog's zones.
- All durations are in SIMULATED seconds; ``speed`` converts them: real seconds = simulated / speed.
  Two exceptions: ``preemption_grace_s`` and ``maintenance_notice_s`` are REAL seconds, whatever the
  speed (a program on a host has that long to checkpoint, as on Google's VMs).
- Quota limits are in each generation's quota units (catalog ``quota_unit``: chips for v5e/v6e,
  TensorCores for v2/v3/v4/v5p). -1 means unlimited.
"""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from tpuctl.catalog import CapacityType, Catalog, Generation
from tpuctl.cloud.iam import PREDEFINED_ROLES
from tpuctl.errors import ConfigError

_ZONE_RE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-(?:[a-z]|ai[0-9][a-z]?)$")
_REGION_RE = re.compile(r"^[a-z]+-[a-z]+[0-9]+$")
_PROJECT_RE = re.compile(r"^[a-z][-a-z0-9]{4,28}[a-z0-9]$")
_RESERVATION_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")

#: The capacity classes the simulator keeps pools and quotas for. Spot and preemptible share one class
#: (they share quota on GCP and here share capacity too); reserved capacity lives in reservations.
CapacityClass = Literal["on_demand", "preemptible", "reserved"]
PoolClass = Literal["on_demand", "preemptible"]

NonNegInt = Annotated[int, Field(ge=0)]
NonNegFloat = Annotated[float, Field(ge=0)]
Rate = Annotated[float, Field(ge=0, le=1)]


def capacity_class_of(capacity: CapacityType) -> CapacityClass:
    """The simulator's capacity class for a catalog capacity type (spot and preemptible share one)."""
    if capacity is CapacityType.RESERVED:
        return "reserved"
    return "preemptible" if capacity.is_preemptible else "on_demand"


def region_of(zone: str) -> str:
    return zone.rsplit("-", 1)[0]


class _Strict(BaseModel):
    # Unknown keys are errors: a typo in a world file must not silently fall back to a default.
    model_config = ConfigDict(extra="forbid", frozen=True)


class PoolCapacity(_Strict):
    """Chips of one generation a zone has, per capacity class."""

    on_demand: NonNegInt = 0
    preemptible: NonNegInt = 0


class Reservation(_Strict):
    """A named block of reserved chips; ``schedulingConfig.reserved`` nodes draw on it."""

    name: str
    zone: str
    generation: str
    chips: NonNegInt


class ScopeLimits(_Strict):
    """A quota limit in one zone and in one region (quota units; -1 = unlimited)."""

    zone: Annotated[int, Field(ge=-1)] = 0
    region: Annotated[int, Field(ge=-1)] = 0


class ClassLimits(_Strict):
    on_demand: ScopeLimits = ScopeLimits()
    preemptible: ScopeLimits = ScopeLimits()


class QuotaOverride(_Strict):
    """One explicit limit: ``location`` is a zone (zone quota) or a region (region quota)."""

    generation: str
    capacity: PoolClass
    location: str
    limit: Annotated[int, Field(ge=-1)]
    serving: bool = False  # the generation's serving family (v5e single-host shapes)


class Quotas(_Strict):
    default: ClassLimits = ClassLimits()
    generations: dict[str, ClassLimits] = Field(default_factory=dict)
    #: The serving families' limits, per generation that has one (zone only on GCP; region unused).
    serving: dict[str, ClassLimits] = Field(default_factory=dict)
    overrides: list[QuotaOverride] = Field(default_factory=list)


class ComputeQuotaLimit(_Strict):
    """One limit of a Compute Engine TPU quota (Cloud Quotas, service compute.googleapis.com), in chips.
    ``location`` (a region or a zone, per the quota's scope) and ``tpu_family`` (the per-family quota's
    dimension) narrow it; the most specific entry wins. A quota with no entry for a location is 0: "A
    region missing from the family listing has effective 0" (docs/google-facts.md#compute-engine-quotas)."""

    quota_id: str
    limit: Annotated[int, Field(ge=-1)]
    location: str | None = None
    tpu_family: str | None = None


class RegionPrice(_Strict):
    """USD per chip-hour by the catalog's price keys (``tpuctl.catalog.price_key``); unset: the catalog's."""

    on_demand: NonNegFloat | None = None
    spot: NonNegFloat | None = None
    flex_start: NonNegFloat | None = None
    pod_on_demand: NonNegFloat | None = None  # v2/v3 slices of several hosts
    pod_spot: NonNegFloat | None = None


class Latency(_Strict):
    """Added to every TPU API and Cloud Quotas request (never to admin or metadata requests)."""

    base_ms: NonNegFloat = 20.0
    jitter_ms: NonNegFloat = 5.0
    spike_probability: Rate = 0.0
    spike_ms: NonNegFloat = 500.0


class Faults(_Strict):
    transient_error_rate: Rate = 0.0
    ambiguous_error_rate: Rate = 0.0


class Durations(_Strict):
    """Simulated seconds each transition takes."""

    node_create_s: NonNegFloat = 120.0
    node_delete_s: NonNegFloat = 30.0
    node_stop_s: NonNegFloat = 30.0
    node_start_s: NonNegFloat = 60.0
    queued_provision_s: NonNegFloat = 120.0
    stockout_s: NonNegFloat = 10.0
    #: Compute Engine operations that change no VM (templates, policies, a MIG's own record, resize).
    compute_op_s: NonNegFloat = 2.0
    #: REAL seconds (never scaled by ``speed``): from the notice (SIGTERM, metadata flag) to SIGKILL.
    preemption_grace_s: NonNegFloat = 30.0
    #: REAL seconds (never scaled): from a host maintenance's notice (metadata ``maintenance-event``) to the
    #: VM's stop; Compute Engine documents 60 s (docs/google-facts.md#host-maintenance).
    maintenance_notice_s: NonNegFloat = 60.0
    #: How long a maintained slice stays REPAIRING before its VMs are restarted (where they are).
    maintenance_s: NonNegFloat = 600.0


class Network(_Strict):
    """A VPC network. ``project``: the project that holds it (a Shared VPC's host project); None: every
    project the simulator serves has one of this name (as every new Google project gets ``default``).
    An auto-mode network has a subnetwork named like itself in every region; ``subnetworks`` (name ->
    region) are its others, a custom-mode network's only ones."""

    name: str
    project: str | None = None
    auto_subnetworks: bool = True
    subnetworks: dict[str, str] = Field(default_factory=dict)

    def has_subnetwork(self, name: str, region: str) -> bool:
        return (self.auto_subnetworks and name == self.name) or self.subnetworks.get(name) == region


def _default_networks() -> list[Network]:
    return [Network(name="default")]


class ScheduledPreemption(_Strict):
    """Preempt nodes whose name matches ``node`` (an fnmatch glob) ``after_s`` simulated seconds after
    they become READY. ``count`` bounds how many preemptions this entry makes in total (a recreated
    node with the same name is matched again until the count is used up)."""

    after_s: NonNegFloat
    node: str = "*"
    zone: str | None = None
    notice: bool = True
    count: Annotated[int, Field(ge=1)] = 1


class Preemption(_Strict):
    # Mean preemptions per simulated hour for each READY spot/preemptible node (exponential
    # inter-arrival, drawn when the node becomes READY). 0 = never at random.
    rate_per_hour: NonNegFloat = 0.0
    notice: bool = True
    schedule: list[ScheduledPreemption] = Field(default_factory=list)


class IamBinding(_Strict):
    """One binding of a project's IAM policy, in Google's shape: ``role`` granted to each of ``members``
    (``user:EMAIL``, ``serviceAccount:EMAIL``, ``allAuthenticatedUsers``)."""

    role: str
    members: list[
        Annotated[str, Field(pattern=r"^(?:(?:user|serviceAccount):[^@\s]+@[^@\s]+|allAuthenticatedUsers)$")]
    ]


class World(_Strict):
    """A simulated TPU cloud. Build with ``load_world`` / ``default_world``."""

    project: str = "tpuctl-sim"
    speed: Annotated[float, Field(gt=0)] = 60.0
    seed: int = 0
    # zone -> generation (catalog name: v5e, v6e, v5p, v4, v3, v2) -> chips per capacity class.
    zones: dict[str, dict[str, PoolCapacity]] = Field(default_factory=dict)
    reservations: list[Reservation] = Field(default_factory=list)
    quotas: Quotas = Quotas()
    #: Compute Engine's TPU quotas (disjoint from the TPU API's ``quotas``;
    #: docs/google-facts.md#compute-engine-quotas).
    compute_quotas: list[ComputeQuotaLimit] = Field(default_factory=list)
    # generation -> region -> USD per chip-hour; overrides the catalog's prices where given.
    prices: dict[str, dict[str, RegionPrice]] = Field(default_factory=dict)
    latency: Latency = Latency()
    faults: Faults = Faults()
    durations: Durations = Durations()
    preemption: Preemption = Preemption()
    #: OS Login on for the whole project (its metadata has ``enable-oslogin=TRUE``; the same key in a node's
    #: or an instance's metadata overrides it): hosts then accept only the keys imported through OS Login,
    #: under the importing account's POSIX name, and ignore ``ssh-keys``.
    os_login: bool = False
    #: The Google account logged in on this machine: the simulated Application Default Credentials that
    #: tpuctl's clients send stand for it (``tpuctl.sim.iam``), OAuth's tokeninfo names it, and OS Login
    #: imports its keys into its profile.
    principal: Annotated[str, Field(pattern=r"^[^@\s/]+@[^@\s/]+\.[^@\s/]+$")] = "sim-user@example.com"
    #: ``enable-guest-attributes=TRUE`` in the project's metadata: Compute Engine VMs whose own metadata
    #: does not say publish their guest attributes (SSH host keys) too. Off, as on a new project: a VM
    #: publishes only when its metadata enables them (docs/google-facts.md#guest-attributes).
    guest_attributes: bool = False
    #: Whether Compute Engine TPU VMs publish the ``agent-worker-number`` attribute, which JAX's
    #: ``GceTpuCluster`` needs to auto-detect the slice. Unconfirmed (docs/google-facts.md#worker-identity),
    #: so off: the stricter reading, under which only the ``TPU_WORKER_ID``/``TPU_WORKER_HOSTNAMES`` that
    #: tpuctl derives from ``tpu-env`` and ``worker-network-endpoints`` (JAX's GKE path) let a program find
    #: its peers. On: both paths answer, as they would if Google publishes it. TPU API VMs always publish it.
    compute_agent_worker_number: bool = False
    #: Whether the hosts have a route to the package index (the simulator's package mirror), as a VM with
    #: an external IP reaches PyPI. Off: as VMs without external IPs and no Cloud NAT, they reach Google's
    #: APIs and the bucket (Private Google Access) and nothing else; the mirror answers them nothing.
    hosts_reach_package_index: bool = True
    #: The VPC networks a node or an instance may join (docs/google-facts.md#networks); a create naming
    #: another, or none where ``default`` is not here, is refused as Google refuses it.
    networks: list[Network] = Field(default_factory=_default_networks)
    #: The package mirror fetches what its wheelhouse lacks from the package index that this machine's
    #: pip/uv configuration names (PyPI if none), caching it in the state dir, as a host with an external
    #: IP reaches PyPI. Off: hosts install only what the wheelhouse has (``tpuctl.sim.fetch_through``).
    package_fetch_through: bool = False
    #: Each project's IAM policy: project id -> bindings (a project with no entry grants nobody
    #: anything). None: the world's project alone, granting ``principal`` roles/owner and the hosts'
    #: default service account roles/editor (what a new project gives its creator and, where the
    #: organization lets it, its default service account).
    iam: dict[str, list[IamBinding]] | None = None

    # --- lookups ---------------------------------------------------------------------------------

    def iam_bindings(self, project: str) -> list[IamBinding]:
        """The IAM policy bindings of ``project``."""
        if self.iam is not None:
            return self.iam.get(project, [])
        if project != self.project:
            return []
        from tpuctl.sim.iam import default_service_account, member  # it imports this module

        return [
            IamBinding(role="roles/owner", members=[member(self.principal)]),
            IamBinding(role="roles/editor", members=[member(default_service_account(project))]),
        ]

    def real_seconds(self, simulated_s: float) -> float:
        """Real seconds that ``simulated_s`` simulated seconds take at this world's speed."""
        return simulated_s / self.speed

    def offers(self, zone: str, generation: str) -> bool:
        return generation in self.zones.get(zone, {})

    def pool_chips(self, zone: str, generation: str, capacity_class: PoolClass) -> int:
        pool = self.zones.get(zone, {}).get(generation)
        if pool is None:
            return 0
        return pool.on_demand if capacity_class == "on_demand" else pool.preemptible

    def reservation(self, name: str) -> Reservation | None:
        for res in self.reservations:
            if res.name == name:
                return res
        return None

    def quota_limit(
        self, generation: str, capacity_class: PoolClass, location: str, serving: bool = False
    ) -> int:
        """The limit at ``location`` (a zone or a region) in quota units; -1 = unlimited."""
        override = self.quota_override(generation, capacity_class, location, serving)
        return (
            override
            if override is not None
            else self.quota_default(generation, capacity_class, location, serving)
        )

    def quota_override(
        self, generation: str, capacity_class: PoolClass, location: str, serving: bool = False
    ) -> int | None:
        """The explicit limit at ``location``, if the world sets one."""
        for override in self.quotas.overrides:
            if (
                override.generation == generation
                and override.capacity == capacity_class
                and override.location == location
                and override.serving == serving
            ):
                return override.limit
        return None

    def quota_default(
        self, generation: str, capacity_class: PoolClass, location: str, serving: bool = False
    ) -> int:
        """The project default for every zone (or region) of the scope ``location`` is in."""
        limits = self.quotas.generations.get(generation, self.quotas.default)
        if serving:  # a world that does not set the serving family gives it the training limits
            limits = self.quotas.serving.get(generation, limits)
        scope = limits.on_demand if capacity_class == "on_demand" else limits.preemptible
        return scope.zone if _ZONE_RE.match(location) else scope.region

    def compute_quota_limit(self, quota_id: str, location: str, tpu_family: str | None) -> int:
        """The limit of Compute Engine quota ``quota_id`` at ``location`` (a region or zone) for
        ``tpu_family``, in chips; -1 = unlimited, 0 when the world sets none
        (docs/google-facts.md#compute-engine-quotas)."""
        best: ComputeQuotaLimit | None = None
        best_rank = -1
        for entry in self.compute_quotas:
            if entry.quota_id != quota_id or entry.location not in (None, location):
                continue
            if entry.tpu_family not in (None, tpu_family):
                continue
            rank = 2 * (entry.location is not None) + (entry.tpu_family is not None)
            if rank > best_rank:
                best, best_rank = entry, rank
        return best.limit if best is not None else 0

    def network(self, project: str, name: str) -> Network | None:
        """Project ``project``'s network ``name`` (a host project's, for a Shared VPC), if it has one."""
        return next((n for n in self.networks if n.name == name and n.project in (None, project)), None)

    def regions(self) -> list[str]:
        return sorted({region_of(z) for z in self.zones})

    def generations_offered(self) -> list[str]:
        return sorted({g for gens in self.zones.values() for g in gens})

    def summary(self) -> dict[str, Any]:
        return {
            "project": self.project,
            "speed": self.speed,
            "seed": self.seed,
            "zones": sorted(self.zones),
            "generations": self.generations_offered(),
            "reservations": [r.model_dump() for r in self.reservations],
            "faults": self.faults.model_dump(),
            "durations": self.durations.model_dump(),
            "latency": self.latency.model_dump(),
            "preemption": self.preemption.model_dump(),
            "package_fetch_through": self.package_fetch_through,
        }


# --- loading -----------------------------------------------------------------------------------------


def load_world(path: Path | str) -> World:
    """Read and validate a world file; any problem raises ConfigError naming file, field and value."""
    where = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(
            f"cannot read world file {where}: {exc.strerror or exc}",
            path=where,
            fix="check the path, or drop --world to use the default world",
        ) from exc
    return parse_world(text, where)


def default_world() -> World:
    """The bundled default world (tpuctl/sim/data/world.yaml)."""
    text = resources.files("tpuctl.sim").joinpath("data", "world.yaml").read_text(encoding="utf-8")
    return parse_world(text, "tpuctl/sim/data/world.yaml")


def parse_world(text: str, where: str) -> World:
    """Validate world YAML text; ``where`` names its source in errors."""
    # libyaml's loader when present: ~10x faster than the pure-Python one, and a first start of the
    # in-process simulator parses the default world on the CLI's clock.
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        data = yaml.load(text, Loader=loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(
            f"world file {where} is not valid YAML{at}: {getattr(exc, 'problem', None) or exc}",
            path=where,
            fix="fix the YAML syntax (indentation, colons, quotes)",
        ) from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"world file {where} must be a mapping of fields, got {type(data).__name__}",
            path=where,
            value=data,
            fix="start the file with fields such as `project:` and `zones:`",
        )
    return world_from_data(data, where)


def world_from_data(data: dict[str, Any], where: str) -> World:
    try:
        world = World.model_validate(data)
    except ValidationError as exc:
        raise _config_error_from(exc, where) from None
    check_world(world, where)
    return world


def _config_error_from(exc: ValidationError, where: str) -> ConfigError:
    first = exc.errors()[0]
    field = ".".join(str(part) for part in first["loc"]) or "(top level)"
    value = first.get("input")
    kind = first["type"]
    if kind == "extra_forbidden":
        parent = field.rsplit(".", 1)[0] if "." in field else "the top level"
        return ConfigError(
            f"world file {where}: unknown field {field!r}",
            path=where,
            field=field,
            value=field.rsplit(".", 1)[-1],
            fix="remove it or correct its spelling; tpuctl/sim/data/world.yaml documents the fields of "
            + parent,
        )
    if kind == "missing":
        name = field.rsplit(".", 1)[-1]
        return ConfigError(
            f"world file {where}: {field} is required",
            path=where,
            field=field,
            fix=f"add `{name}:` there; tpuctl/sim/data/world.yaml documents it",
        )
    return ConfigError(
        f"world file {where}: {field} = {value!r} is invalid: {first['msg']}",
        path=where,
        field=field,
        value=value,
        fix=_fix_hint(kind, first["msg"]),
    )


def _fix_hint(kind: str, msg: str) -> str:
    if kind.startswith(("greater_than", "less_than")):
        return f"use a value that is {msg.lower().removeprefix('input should be ')}"
    if kind in ("int_parsing", "int_from_float", "float_parsing", "int_type", "float_type"):
        return "use a number"
    if kind in ("bool_parsing", "bool_type"):
        return "use true or false"
    if kind in ("dict_type", "model_type"):
        return "use a mapping (key: value lines)"
    if kind == "list_type":
        return "use a list (lines starting with `- `)"
    if kind == "literal_error":
        return msg.lower().replace("input should be", "use")
    return msg


def check_world(world: World, where: str) -> None:
    """The checks a schema cannot express: names must exist in the catalog and be well formed."""
    catalog = Catalog.load()

    def fail(field: str, value: object, message: str, fix: str) -> ConfigError:
        return ConfigError(
            f"world file {where}: {field} = {value!r} {message}",
            path=where,
            field=field,
            value=value,
            fix=fix,
        )

    def check_generation(field: str, name: str) -> Generation:
        gen = catalog.generations.get(name)
        if gen is None:
            raise fail(
                field, name, "is not a TPU generation", "use one of: " + ", ".join(catalog.generations)
            )
        return gen

    if not _PROJECT_RE.match(world.project):
        raise fail(
            "project",
            world.project,
            "is not a valid project id",
            "6-30 lowercase letters, digits or dashes, starting with a letter, e.g. tpuctl-sim",
        )
    for zone, gens in world.zones.items():
        if not _ZONE_RE.match(zone):
            raise fail(f"zones.{zone}", zone, "is not a zone name", "a zone looks like us-central1-a")
        for gen_name in gens:
            check_generation(f"zones.{zone}.{gen_name}", gen_name)
    seen: set[str] = set()
    for i, res in enumerate(world.reservations):
        if not _RESERVATION_RE.match(res.name) or len(res.name) > 63:
            raise fail(
                f"reservations.{i}.name", res.name, "is not a valid name", "lowercase letters, digits, dashes"
            )
        if res.name in seen:
            raise fail(
                f"reservations.{i}.name", res.name, "is used twice", "give each reservation its own name"
            )
        seen.add(res.name)
        check_generation(f"reservations.{i}.generation", res.generation)
        if res.zone not in world.zones:
            raise fail(
                f"reservations.{i}.zone",
                res.zone,
                "is not one of the world's zones",
                "add the zone under `zones:` or use one of: " + ", ".join(sorted(world.zones)),
            )
    for gen_name in world.quotas.generations:
        check_generation(f"quotas.generations.{gen_name}", gen_name)
    for gen_name in world.quotas.serving:
        check_generation(f"quotas.serving.{gen_name}", gen_name)
    for i, override in enumerate(world.quotas.overrides):
        check_generation(f"quotas.overrides.{i}.generation", override.generation)
        if not (_ZONE_RE.match(override.location) or _REGION_RE.match(override.location)):
            raise fail(
                f"quotas.overrides.{i}.location",
                override.location,
                "is neither a zone nor a region",
                "use a zone (us-central1-a) for a zone quota or a region (us-central1) for a region quota",
            )
    compute_ids = {
        q.quota_id
        for gen in catalog.generations.values()
        if gen.compute is not None
        for q in (gen.compute.on_demand_quota, gen.compute.preemptible_quota)
    }
    for i, limit in enumerate(world.compute_quotas):
        if limit.quota_id not in compute_ids:
            raise fail(
                f"compute_quotas.{i}.quota_id",
                limit.quota_id,
                "is not a Compute Engine TPU quota id",
                "use one of: " + ", ".join(sorted(compute_ids)),
            )
        if limit.location is not None and not (
            _ZONE_RE.match(limit.location) or _REGION_RE.match(limit.location)
        ):
            raise fail(
                f"compute_quotas.{i}.location",
                limit.location,
                "is neither a zone nor a region",
                "use a region (us-central1) for a per-region quota or a zone for a per-zone one",
            )
    for project, bindings in (world.iam or {}).items():
        for i, binding in enumerate(bindings):
            if binding.role not in PREDEFINED_ROLES:
                raise fail(
                    f"iam.{project}.{i}.role",
                    binding.role,
                    "is not a role the simulator knows",
                    "use one of: " + ", ".join(PREDEFINED_ROLES),
                )
    for gen_name, regions in world.prices.items():
        check_generation(f"prices.{gen_name}", gen_name)
        for region in regions:
            if not _REGION_RE.match(region):
                raise fail(f"prices.{gen_name}.{region}", region, "is not a region", "e.g. us-central1")
    seen_networks: set[tuple[str | None, str]] = set()
    for i, net in enumerate(world.networks):
        if not _RESERVATION_RE.match(net.name) or len(net.name) > 63:
            raise fail(
                f"networks.{i}.name", net.name, "is not a valid name", "lowercase letters, digits, dashes"
            )
        if net.project is not None and not _PROJECT_RE.match(net.project):
            raise fail(f"networks.{i}.project", net.project, "is not a valid project id", "e.g. host-project")
        if (net.project, net.name) in seen_networks:
            raise fail(f"networks.{i}.name", net.name, "is listed twice", "give each network once")
        seen_networks.add((net.project, net.name))
        for sub, region in net.subnetworks.items():
            if not _RESERVATION_RE.match(sub) or not _REGION_RE.match(region):
                raise fail(
                    f"networks.{i}.subnetworks.{sub}", region, "is not a subnetwork and its region",
                    "map a subnetwork name to its region, e.g. tpu-subnet: us-central1",
                )  # fmt: skip
    for i, entry in enumerate(world.preemption.schedule):
        if entry.zone is not None and not _ZONE_RE.match(entry.zone):
            raise fail(
                f"preemption.schedule.{i}.zone", entry.zone, "is not a zone name", "e.g. us-central1-a"
            )

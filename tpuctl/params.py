"""Typed parameters: the one place a flag, an environment variable or a profile key becomes a value.

Every user-given value is parsed here once, at the edge (the CLI's commands and ``tpuctl.settings``), by
one function per kind of value: a USD amount, hours, a duration, a whole number, a size in MiB, the
allowed capacity types. A bad value raises ``ParamError`` (a ``UsageError``, exit 2) that carries the
parameter's name, the value and the fix; non-finite numbers (inf, nan) are refused everywhere.

Services name parameters, not flags: their errors say ``field="pod"``. ``FLAGS`` is the table that turns
a parameter name into what the user typed (``--pod``); the CLI applies it when it renders an error
(``flag_error``), and settings name the environment variable or the profile key instead
(``ParamError.for_source``), so one bad value reads the same from every source.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Final

from tpuctl.catalog import CapacityType, Surface, validate_zone
from tpuctl.cloud.base import HostNetwork, VpcNetwork, VpcSubnetwork
from tpuctl.errors import ConfigError, UsageError

if TYPE_CHECKING:
    from tpuctl.services.placement import Strategy

#: Parameter name -> the flag a user types for it. Names not listed are shown as they are (arguments
#: such as TYPE or RUN, and fields that are already spelled for the user).
FLAGS: Final[Mapping[str, str]] = {
    # settings (flags shared by every command)
    "profile": "--profile",
    "project": "--project",
    "backend": "--backend",
    "output": "-o/--output",
    "state_dir": "--state-dir",
    "database": "--database",
    "config_file": "--config",
    "zones": "--zone",
    "zone": "--zone",
    "region": "--region",
    "capacity_types": "--capacity-type",
    "max_price": "--max-price",
    # placement
    "pod_name": "--name",
    "label": "--label",
    "reserved": "--reserved",
    "spot": "--spot",
    "preemptible": "--preemptible",
    "slices": "--slices",
    "strategy": "--strategy",
    "race_k": "--race-k",
    "wait": "--no-wait",  # the only wait-related error is about --no-wait
    "valid_for": "--valid-for",
    "max_hours": "--max-hours",
    "force": "--force",
    "api": "--api",
    "network": "--network",
    "subnetwork": "--subnetwork",
    "tags": "--tags",
    "service_account": "--service-account",
    # runs
    "pod": "--pod",
    "type": "--type",
    "accelerator_type": "--type",
    "example": "--example",
    "env": "--env",
    "workdir": "--workdir",
    "executor": "--executor",
    "timeout": "--timeout",
    "grace": "--grace",
    "budget": "--budget",
    "assume_price_per_hour": "--assume-price-per-hour",
    "checkpoint_every": "--checkpoint-every",
    "max_restarts": "--max-restarts",
    "max_preemptions": "--max-preemptions",
    "max_bundle_mb": "--max-bundle-mb",
    "limit": "--limit",
    "worker": "--worker",
    "run_id": "--run-id",
    # bench step
    "steps": "--steps",
    "batch_per_device": "--batch-per-device",
    "seq_len": "--seq-len",
    "d_model": "--d-model",
    "layers": "--layers",
    "matmul_n": "--matmul-n",
    "compute_dtype": "--compute-dtype",
    # cost
    "hours": "--hours",
    "since": "--since",
    "until": "--until",
    "group_by": "--group-by",
    # sim
    "port": "--port",
}

#: What ``--capacity-type`` accepts besides the catalog's capacity types: ``queued`` asks for a queued
#: resource (a way of provisioning, not a capacity class).
QUEUED_CAPACITY: Final = "queued"

#: The fix for a bad whole number, where a generic "give a whole number" would not say enough.
COUNT_FIXES: Final[Mapping[str, str]] = {
    "slices": "use --slices 1 for one slice, or N >= 2 for N slices through one queued resource (multislice)",
    "race_k": "use --race-k 2 or more: how many zones to queue in at once",
}

# Where a message or fix names the parameter and where it shows an example. Marked with NUL, not with
# str.format's braces: the text also quotes the user's value, and no argument or variable holds a NUL.
LABEL: Final = "\0label\0"
EG: Final = "\0eg\0"

_REGION_RE = re.compile(r"[a-z]+-[a-z]+[0-9]+")
_WHOLE_RE = re.compile(r"[+]?[0-9]+")
_DURATION_PART_RE = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*(d|h|m|s)")
_DURATION_RE = re.compile(r"(\s*[0-9]+(\.[0-9]+)?\s*[dhms])+\s*")
_PLAIN_SECONDS_RE = re.compile(r"[0-9]+(\.[0-9]+)?")
_DURATION_UNITS: Final = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}


def flag(name: str) -> str:
    """How the user spells parameter ``name`` on the command line."""
    return FLAGS.get(name, name)


def example(label: str, value: str) -> str:
    """``value`` given as ``label`` would be written: a flag, an environment variable or a profile key."""
    if label.startswith("-"):
        return f"{label} {value}"
    if label.isupper():
        return f"{label}={value}"
    return f"{label.rsplit('.', 1)[-1]}: {value}"


class ParamError(UsageError):
    """A bad value for one parameter. The message and the fix are templates over ``LABEL`` (how the
    parameter is named where the value came from) and ``EG`` (an example written that way), so the
    same error can name a flag, an environment variable or a profile key."""

    def __init__(self, template: str, *, param: str, value: object, fix: str, eg: str | None = None) -> None:
        self.param = param
        self.template = template
        self.fix_template = fix
        self.eg = eg
        label = flag(param)
        super().__init__(
            self._render(template, label), field=param, value=value, fix=self._render(fix, label)
        )

    def _render(self, text: str, label: str) -> str:
        eg = "" if self.eg is None else example(label, self.eg)
        return text.replace(LABEL, label).replace(EG, eg)

    def for_source(self, label: str, *, path: str | None = None) -> UsageError:
        """This error, naming ``label`` (an environment variable; with ``path``, a config file's key)."""
        message = self._render(self.template, label)
        fix = self._render(self.fix_template, label)
        if path is None:
            return UsageError(message, field=label, value=self.value, fix=fix)
        return ConfigError(f"{message} in {path}", path=path, field=label, value=self.value, fix=fix)


def flag_error(exc: UsageError) -> UsageError:
    """``exc`` with its field spelled as the user typed it (the CLI's rendering of a service's error)."""
    if isinstance(exc, ConfigError) or exc.field is None:
        return exc
    exc.field = flag(exc.field)
    return exc


# --------------------------------------------------------------------------------------------------
# Numbers


def _finite(value: str | float, param: str, *, fix: str, eg: str) -> float:
    try:
        number = float(str(value).strip())
    except ValueError:
        raise ParamError(
            f"{LABEL} {value!r} is not a number", param=param, value=value, fix=fix, eg=eg
        ) from None
    if not math.isfinite(number):
        raise ParamError(
            f"{LABEL} must be a finite number, got {value!r}", param=param, value=value, fix=fix, eg=eg
        )
    return number


def usd(value: str | float, param: str, *, per_hour: bool = False) -> float:
    """An amount of US dollars (per hour for a price cap): a finite number > 0."""
    unit = "USD per hour" if per_hour else "USD"
    fix = (
        f"give a positive number of USD per hour for the whole request (all slices), e.g. {EG}"
        if per_hour
        else f"give the limit in US dollars, a positive number, e.g. {EG}"
    )
    eg = "20" if per_hour else "50"
    amount = _finite(value, param, fix=fix, eg=eg)
    if amount <= 0:
        raise ParamError(
            f"{LABEL} must be a positive number of {unit}, got {value!r}",
            param=param,
            value=value,
            fix=fix,
            eg=eg,
        )
    return amount


def slice_usd_per_hour(value: str | float, param: str) -> float:
    """The price of one slice in US dollars per hour (a price a budget assumes): a finite number > 0."""
    fix = f"give the price of one slice in USD per hour, a positive number, e.g. {EG}"
    amount = _finite(value, param, fix=fix, eg="40")
    if amount <= 0:
        raise ParamError(
            f"{LABEL} must be a positive number of USD per hour, got {value!r}",
            param=param,
            value=value,
            fix=fix,
            eg="40",
        )
    return amount


def hours(value: str | float, param: str) -> float:
    """Hours: a finite number > 0 (fractions allowed: 1.5 is 90 minutes)."""
    fix = f"give a positive number of hours, e.g. {EG} (1.5 is 90 minutes)"
    amount = _finite(value, param, fix=fix, eg="12")
    if amount <= 0:
        raise ParamError(
            f"{LABEL} must be a positive number of hours, got {value!r}",
            param=param,
            value=value,
            fix=fix,
            eg="12",
        )
    return amount


def mebibytes(value: str | float, param: str) -> float:
    """A size in MiB: a finite number > 0."""
    fix = f"give a positive size in MiB, e.g. {EG}"
    size = _finite(value, param, fix=fix, eg="128")
    if size <= 0:
        raise ParamError(
            f"{LABEL} must be positive, got {value!r}", param=param, value=value, fix=fix, eg="128"
        )
    return size


def duration(value: str | float, param: str, *, allow_zero: bool = False) -> float:
    """``2h``, ``90m``, ``1h30m``, ``1d``, ``3600s`` or plain seconds (``3600``, ``2.5``) -> seconds,
    finite and > 0 (>= 0 with ``allow_zero``)."""
    text = str(value).strip().lower()
    fix = "use a duration such as 2h, 30m, 1h30m, 1d or 3600s"
    seconds: float | None = None
    if _PLAIN_SECONDS_RE.fullmatch(text):
        seconds = float(text)
    elif text and _DURATION_RE.fullmatch(text):
        seconds = sum(float(n) * _DURATION_UNITS[u] for n, u in _DURATION_PART_RE.findall(text))
    if seconds is None or not math.isfinite(seconds):
        raise ParamError(f"cannot parse {LABEL} {value!r} as a duration", param=param, value=value, fix=fix)
    if seconds < 0 or (seconds == 0 and not allow_zero):
        bound = "zero or more" if allow_zero else "longer than zero"
        raise ParamError(f"{LABEL} must be {bound}, got {value!r}", param=param, value=value, fix=fix)
    return seconds


def whole(
    value: str | int,
    param: str,
    *,
    minimum: int = 1,
    maximum: int | None = None,
    fix: str | None = None,
) -> int:
    """A whole number in ``[minimum, maximum]`` (``--slices``, ``--max-restarts``, ``--port``...)."""
    text = str(value).strip()
    bounds = f">= {minimum}" if maximum is None else f"from {minimum} to {maximum}"
    eg = str(max(minimum, 1) if maximum is None else minimum)
    how = fix or COUNT_FIXES.get(param) or f"give a whole number {bounds}, e.g. {EG}"
    number = int(text) if _WHOLE_RE.fullmatch(text) else None
    if number is None or number < minimum or (maximum is not None and number > maximum):
        raise ParamError(
            f"{LABEL} must be a whole number {bounds}, got {value!r}",
            param=param,
            value=value,
            fix=how,
            eg=eg,
        )
    return number


# --------------------------------------------------------------------------------------------------
# Paths


def local_path(value: str) -> str:
    """A path on this machine, made absolute where the user typed it (``~`` expanded, relative to the
    current directory): the value may be used later from elsewhere (a detached supervisor starts in the
    run's log directory; ``runs resume`` in any directory). A URL (``gs://...``) is left as it is."""
    if "://" in value:
        return value
    return str(Path(value).expanduser().absolute())


# --------------------------------------------------------------------------------------------------
# Places


def zone(
    value: str,
    param: str = "zone",
    *,
    known: Collection[str] | None = None,
    suggest_from: Collection[str] | None = None,
) -> str:
    """A zone, shaped like ``us-central1-a``; with ``known`` (the catalog's and the backend's zones), one
    of them. A typo is a usage error (exit 2, "did you mean" among ``suggest_from`` if given, else
    ``known``), never a capacity problem. A region given as a zone says to use the region setting."""
    if _REGION_RE.fullmatch(value):
        raise RegionGivenAsZone(value, param=param)
    try:
        validate_zone(value, field_name=param)
    except UsageError as exc:
        raise ParamError(exc.message, param=param, value=value, fix=exc.fix or "") from None
    if known is not None and value not in known:
        near_from = known if suggest_from is None else suggest_from
        raise _unknown_place("zone", value, param, near_from, listing="`tpuctl catalog zones` lists them")
    return value


def region(value: str, param: str = "region", *, known: Collection[str] | None = None) -> str:
    """A region, shaped like ``us-central1``; with ``known``, one of them."""
    if not _REGION_RE.fullmatch(value):
        raise ParamError(
            f"malformed region {value!r}",
            param=param,
            value=value,
            fix="a region looks like us-central1 (`tpuctl catalog zones` lists them)",
        )
    if known is not None and value not in known:
        raise _unknown_place("region", value, param, known, listing="`tpuctl catalog zones` lists the zones")
    return value


class RegionGivenAsZone(ParamError):
    """A region where a zone was asked for (``--zone us-central1``): the fix names the region setting,
    spelled as the zone one was (``--zone`` -> ``--region``, ``TPUCTL_ZONES`` -> ``TPUCTL_REGION``,
    ``profiles.P.zones`` -> ``profiles.P.region``); an argument (``ZONE``) has no region sibling."""

    def __init__(self, value: str, *, param: str) -> None:
        self.region = value
        super().__init__(
            f"{LABEL} {value!r} is a region, not a zone",
            param=param,
            value=value,
            fix=f"{_REGION_FIX}name one of its zones (`tpuctl catalog zones` lists them)",
        )

    def _render(self, text: str, label: str) -> str:
        argument = self.param.isupper() and self.param not in FLAGS  # e.g. `sim stockout ZONE`
        region_label = re.sub(r"(?i)zones?$", lambda m: "REGION" if m[0].isupper() else "region", label)
        use = "" if argument else f"use {example(region_label, self.region)} (any of its zones), or "
        return super()._render(text, label).replace(_REGION_FIX, use)


# Where RegionGivenAsZone's fix says how to give the region (NUL-marked, like LABEL and EG).
_REGION_FIX: Final = "\0region\0"


def did_you_mean(value: str, choices: Iterable[str]) -> str | None:
    """The choice nearest to ``value`` (difflib's ratio >= 0.6), if one is near enough."""
    near = difflib.get_close_matches(value, sorted(set(choices)), n=1, cutoff=0.6)
    return near[0] if near else None


def _unknown_place(kind: str, value: str, param: str, known: Collection[str], *, listing: str) -> ParamError:
    near = did_you_mean(value, known)
    # An argument (ZONE) is given as the value alone; a flag, variable or key as they are written.
    eg = near if param.isupper() and param not in FLAGS else EG
    return ParamError(
        f"unknown {kind} {value!r}" + (f"; did you mean {near}?" if near else ""),
        param=param,
        value=value,
        fix=(f"use {eg}; " if near else "") + listing,
        eg=near,
    )


# --------------------------------------------------------------------------------------------------
# Networks and the hosts' identity

#: A network, subnetwork or tag name: RFC 1035 (lowercase letter first, then letters, digits and dashes,
#: not ending in a dash; 1-63 characters), Compute Engine's rule for its resource names.
_RFC1035 = r"[a-z](?:[-a-z0-9]{0,61}[a-z0-9])?"
_RFC1035_RE = re.compile(_RFC1035)
#: A project id (6-30 characters) or a project number, as a resource path names it.
_PROJECT = r"[a-z][-a-z0-9]{4,28}[a-z0-9]|[0-9]+"
#: What may precede a resource path: the API's URL, or the collection's ``compute/v1/`` prefix
#: (docs/google-facts.md#networks lists the forms the TPU API and Compute Engine accept).
_URL_PREFIX_RE = re.compile(r"(?:https://(?:www|compute)\.googleapis\.com/)?(?:compute/(?:v1|beta|alpha)/)?")
_NETWORK_RE = re.compile(rf"(?:(?:projects/(?P<project>{_PROJECT})/)?global/networks/)?(?P<name>{_RFC1035})")
_SUBNETWORK_RE = re.compile(
    rf"(?:(?:projects/(?P<project>{_PROJECT})/)?regions/(?P<region>[a-z]+-[a-z]+[0-9]+)/subnetworks/)?"
    rf"(?P<name>{_RFC1035})"
)
#: A service account's email (``NAME@PROJECT.iam.gserviceaccount.com``, or the Compute Engine default
#: ``NUMBER-compute@developer.gserviceaccount.com``): one @, a domain with a dot, no spaces.
_EMAIL_RE = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s]+")
#: Compute Engine allows at most 64 network tags on an instance (docs/google-facts.md#networks).
MAX_NETWORK_TAGS: Final = 64


def network(value: str | VpcNetwork, param: str = "network") -> VpcNetwork:
    """A VPC network: ``NAME``, or ``projects/HOST/global/networks/NAME`` for a Shared VPC (also the
    ``global/networks/NAME`` and URL forms the APIs take)."""
    if isinstance(value, VpcNetwork):
        return value
    match = _NETWORK_RE.fullmatch(_URL_PREFIX_RE.sub("", value.strip(), count=1))
    if match is None:
        raise ParamError(
            f"malformed network {value!r}",
            param=param,
            value=value,
            fix=f"name the network (lowercase letters, digits and dashes, e.g. {EG}), or a Shared VPC's as "
            "projects/HOST_PROJECT/global/networks/NAME",
            eg="my-vpc",
        )
    return VpcNetwork(name=match["name"], project=match["project"])


def subnetwork(value: str | VpcSubnetwork, param: str = "subnetwork") -> VpcSubnetwork:
    """A subnetwork: ``NAME`` (in the zone's region), ``regions/R/subnetworks/NAME``, or a Shared VPC's
    ``projects/HOST/regions/R/subnetworks/NAME``."""
    if isinstance(value, VpcSubnetwork):
        return value
    match = _SUBNETWORK_RE.fullmatch(_URL_PREFIX_RE.sub("", value.strip(), count=1))
    if match is None:
        raise ParamError(
            f"malformed subnetwork {value!r}",
            param=param,
            value=value,
            fix=f"name the subnetwork (e.g. {EG}, in the slice's region), or give its path: "
            "regions/REGION/subnetworks/NAME, or a Shared VPC's projects/HOST_PROJECT/regions/REGION/"
            "subnetworks/NAME",
            eg="tpu-subnet",
        )
    return VpcSubnetwork(name=match["name"], project=match["project"], region=match["region"])


def network_tags(values: Iterable[str], param: str = "tags") -> tuple[str, ...]:
    """Network tags (``--tags a,b``, repeatable): each an RFC 1035 name, without repeats, in order."""
    tags: list[str] = []
    for raw in values:
        for tag in (t.strip() for t in raw.split(",")):
            if not _RFC1035_RE.fullmatch(tag):
                raise ParamError(
                    f"bad network tag {tag!r}: a tag is 1-63 lowercase letters, digits and dashes, starting "
                    "with a letter and not ending with a dash",
                    param=param,
                    value=tag,
                    fix=f"e.g. {EG} (several: comma-separated, or the flag repeated)",
                    eg="tpu-ssh",
                )
            if tag not in tags:
                tags.append(tag)
    if len(tags) > MAX_NETWORK_TAGS:
        raise ParamError(
            f"{len(tags)} network tags: an instance has at most {MAX_NETWORK_TAGS}",
            param=param,
            value=",".join(tags),
            fix="give fewer tags",
        )
    return tuple(tags)


def service_account(value: str, param: str = "service_account") -> str:
    """A service account's email, e.g. ``trainer@my-project.iam.gserviceaccount.com``."""
    email = value.strip()
    if not _EMAIL_RE.fullmatch(email):
        raise ParamError(
            f"malformed service account {value!r}: give its email",
            param=param,
            value=value,
            fix=f"e.g. {EG}",
            eg="trainer@my-project.iam.gserviceaccount.com",
        )
    return email


def host_network(
    network_value: VpcNetwork | None, subnetwork_value: VpcSubnetwork | None, tags: Iterable[str] = ()
) -> HostNetwork:
    """The hosts' network from its parsed parts, checked against each other: a subnetwork in a host
    project (Shared VPC) needs its network named (the APIs take ``default`` otherwise, which is the
    slice's own project's), in the same project."""
    if subnetwork_value is not None and subnetwork_value.project is not None:
        if network_value is None:
            raise ParamError(
                f"--subnetwork {subnetwork_value.text} is in project {subnetwork_value.project}: name its "
                "network too",
                param="network",
                value=subnetwork_value.text,
                fix=f"add --network projects/{subnetwork_value.project}/global/networks/NETWORK",
            )
        if network_value.project != subnetwork_value.project:
            holder = network_value.project or "the slice's own"
            raise ParamError(
                f"subnetwork {subnetwork_value.text} is not in the network's project ({holder}): a "
                "subnetwork belongs to its network's project",
                param="subnetwork",
                value=subnetwork_value.text,
                fix="give the network and the subnetwork of one project (a Shared VPC's host project)",
            )
    return HostNetwork(network=network_value, subnetwork=subnetwork_value, tags=tuple(tags))


# --------------------------------------------------------------------------------------------------
# Capacity types


def capacity_types(
    values: Iterable[str] = (), *, spot: bool = False, preemptible: bool = False
) -> tuple[list[CapacityType], bool]:
    """The allowed capacity types from ``--capacity-type`` (repeatable) plus the shorthands ``--spot`` and
    ``--preemptible``, in that order and without repeats; with whether ``queued`` was given. The same on
    every command: each flag adds a type to the allowed set, and placement takes the cheapest allowed."""
    types: list[CapacityType] = []
    queued = False
    allowed = ", ".join([*(c.value for c in CapacityType), QUEUED_CAPACITY])
    for raw in values:
        if raw.strip().lower() == QUEUED_CAPACITY:
            queued = True
            continue
        try:
            capacity = CapacityType.parse(raw, field_name="capacity_types")
        except UsageError:
            raise ParamError(
                f"unknown capacity type {raw!r}",
                param="capacity_types",
                value=raw,
                fix=f"use one of: {allowed} (repeat the flag to allow several)",
            ) from None
        if capacity not in types:
            types.append(capacity)
    for capacity, given in ((CapacityType.SPOT, spot), (CapacityType.PREEMPTIBLE, preemptible)):
        if given and capacity not in types:
            types.append(capacity)
    return types, queued


# --------------------------------------------------------------------------------------------------
# Placement strategy


def strategy(value: str, param: str = "strategy") -> Strategy:
    """``cheapest`` (one zone at a time, cheapest first) or ``race`` (queue in several zones at once)."""
    from tpuctl.services.placement import Strategy

    try:
        return Strategy(value.strip().lower())
    except ValueError:
        raise ParamError(
            f"unknown strategy {value!r}",
            param=param,
            value=value,
            fix="use --strategy cheapest (one zone at a time, cheapest first) or --strategy race "
            "(queue in the top --race-k zones at once, keep the first to become ACTIVE)",
        ) from None


def api(value: str, param: str = "api") -> Surface:
    """``tpu`` (the Cloud TPU API) or ``compute`` (Compute Engine): which Google API places a slice."""
    try:
        return Surface(value.strip().lower())
    except ValueError:
        raise ParamError(
            f"unknown API {value!r}",
            param=param,
            value=value,
            fix="use --api tpu (the Cloud TPU API: v2 to v6e) or --api compute (Compute Engine: TPU7x, "
            "v6e, v5p)",
        ) from None


# --------------------------------------------------------------------------------------------------
# Labels

#: GCP's label rules: a key starts with a lowercase letter; keys and values hold lowercase letters,
#: digits, - and _ (keys 1-63 characters, values 0-63).
LABEL_KEY_RE: Final = re.compile(r"[a-z][a-z0-9_-]{0,62}")
LABEL_VALUE_RE: Final = re.compile(r"[a-z0-9_-]{0,63}")


def slice_types(value: str | None, param: str = "type") -> tuple[str, ...]:
    """``--type v5e-16,v6e-8`` -> ``("v5e-16", "v6e-8")``: the types a run may be placed on, in the order
    given (the catalog checks each name); none given -> ``()``."""
    if value is None:
        return ()
    names = tuple(name.strip() for name in value.split(","))
    if not all(names):
        raise ParamError(
            f"{LABEL} {value!r} has an empty type in its list",
            param=param,
            value=value,
            fix="give types separated by single commas, e.g. v5e-16,v6e-8",
        )
    return names


def labels(pairs: Iterable[str], param: str = "label") -> dict[str, str]:
    """``["team=ml", "env=dev"]`` -> a dict, each pair checked against GCP's label rules; the keys
    tpuctl sets itself are refused."""
    from tpuctl.cloud.base import LABEL_LEDGER, LABEL_MANAGED_BY, LABEL_OWNER, LABEL_REQUEST

    reserved = {LABEL_MANAGED_BY, LABEL_OWNER, LABEL_REQUEST, LABEL_LEDGER}
    out: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ParamError(
                f"bad label {pair!r}: expected KEY=VALUE",
                param=param,
                value=pair,
                fix=f"write labels as KEY=VALUE, e.g. {EG}",
                eg="team=ml",
            )
        if not LABEL_KEY_RE.fullmatch(key) or not LABEL_VALUE_RE.fullmatch(value):
            raise ParamError(
                f"bad label {pair!r}: keys must start with a lowercase letter and both key and value may "
                "hold only lowercase letters, digits, - and _ (keys 1-63, values 0-63 characters)",
                param=param,
                value=pair,
                fix=f"e.g. {EG}",
                eg="team=ml-infra",
            )
        if key in reserved:
            raise ParamError(
                f"label key {key!r} is reserved for tpuctl", param=param, value=pair, fix="choose another key"
            )
        out[key] = value
    return out

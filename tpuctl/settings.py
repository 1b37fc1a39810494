"""Settings: what backend, project, zones, capacity types, price cap, state dir and ledger a command uses.

Precedence, highest first: command-line flag > environment (``TPUCTL_*``; the project also from
``CLOUDSDK_CORE_PROJECT`` and ``GOOGLE_CLOUD_PROJECT``) > the chosen profile of the YAML config file
(``$TPUCTL_CONFIG``, else ``$XDG_CONFIG_HOME/tpuctl/config.yaml``) > defaults.

Nothing here is read at import: ``load_settings(flags)`` builds a ``Settings`` for one command, and the
caller passes it on. Values are parsed by the same functions as the commands' flags (``tpuctl.params``),
so a bad one reads the same from every source: ``ConfigError`` from the config file (names the file, the
key, the value and the fix), else ``UsageError`` naming the flag or the environment variable.
"""

from __future__ import annotations

import getpass
import os
import re
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import (
    AliasChoices,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    PrivateAttr,
    SecretStr,
    SerializationInfo,
    ValidationError,
    field_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from tpuctl.catalog import CapacityType, Surface
from tpuctl.cloud.base import HostNetwork, VpcNetwork, VpcSubnetwork
from tpuctl.errors import ConfigError, TpuctlError, UsageError
from tpuctl.params import (
    ParamError,
    duration,
    flag,
    host_network,
    network,
    network_tags,
    region,
    service_account,
    subnetwork,
    usd,
    zone,
)
from tpuctl.store.secrets import SECRET_KEY_FILENAME, parse_secret_key
from tpuctl.store.url import DatabaseUrl, default_database_url, parse_database_url

DEFAULT_PROFILE = "default"
_LABEL_VALUE_RE = re.compile(r"[^a-z0-9_-]")


class Backend(StrEnum):
    SIM = "sim"
    GCP = "gcp"


class OutputFormat(StrEnum):
    TABLE = "table"
    JSON = "json"
    YAML = "yaml"
    CSV = "csv"


def _usd_setting(name: str, *, per_hour: bool) -> BeforeValidator:
    # tpuctl.params.usd raises a ParamError, which pydantic lets through (it wraps only ValueError):
    # load_settings and read_profile then name the variable or the key it came from.
    def parse(value: Any) -> float | None:
        return None if value is None else usd(value, name, per_hour=per_hour)

    return BeforeValidator(parse)


#: USD amounts, parsed by the same function as the flags: finite and > 0.
MaxPrice = Annotated[float | None, _usd_setting("max_price", per_hour=True)]
MonthlyBudget = Annotated[float | None, _usd_setting("monthly_budget", per_hour=False)]


def _database(value: Any) -> DatabaseUrl | None:
    return None if value is None else parse_database_url(value)


def _database_dumped(url: DatabaseUrl | None, info: SerializationInfo) -> str | None:
    """Its text (the password as ***) in JSON, which is printed; its secret URL in a Python dump, which
    is read back (a profile's values on their way into the settings) and must keep the password."""
    if url is None:
        return None
    return url.text if info.mode_is_json() else url.secret_url


#: The ledger's location: a URL parsed once, here (``tpuctl.store.url``).
DatabaseSetting = Annotated[
    DatabaseUrl | None,
    PlainValidator(_database),
    PlainSerializer(_database_dumped),
]


def server_url(value: Any) -> str | None:
    """A `tpuctl server`'s address, ``http(s)://HOST[:PORT]``, without a trailing slash; exit 2 (naming
    the setting) for anything else."""
    if value is None:
        return None
    from urllib.parse import urlsplit

    from tpuctl.errors import UsageError

    text = str(value).strip().rstrip("/")
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise UsageError(
            f"server {value!r} is not an http(s) URL",
            field="server",
            value=value,
            fix="e.g. --server http://127.0.0.1:8471 (where `tpuctl server` listens)",
        )
    return text


#: Where `tpuctl server` is (flag --server, TPUCTL_SERVER, profile key server): the CLI is its client.
ServerSetting = Annotated[str | None, PlainValidator(server_url)]


def _network_setting(value: Any) -> VpcNetwork | None:
    return None if value is None else network(value)


def _subnetwork_setting(value: Any) -> VpcSubnetwork | None:
    return None if value is None else subnetwork(value)


def _text(value: VpcNetwork | VpcSubnetwork | None) -> str | None:
    return None if value is None else value.text


#: The hosts' network and subnetwork (``NAME``, or a Shared VPC host project's path), parsed once here by
#: the flags' functions (``tpuctl.params``), written back as the user wrote them.
NetworkSetting = Annotated[VpcNetwork | None, PlainValidator(_network_setting), PlainSerializer(_text)]
SubnetworkSetting = Annotated[
    VpcSubnetwork | None, PlainValidator(_subnetwork_setting), PlainSerializer(_text)
]


def _tags_setting(value: Any) -> list[str] | None:
    if value is None:
        return None
    return list(network_tags([value] if isinstance(value, str) else [str(v) for v in value]))


def _service_account_setting(value: Any) -> str | None:
    return None if value is None else service_account(str(value))


#: Network tags (``a,b`` in the environment, a list in the profile) and the hosts' service account.
NetworkTags = Annotated[list[str] | None, BeforeValidator(_tags_setting)]
ServiceAccount = Annotated[str | None, BeforeValidator(_service_account_setting)]


def _duration_setting(name: str) -> BeforeValidator:
    def parse(value: Any) -> float | None:
        return None if value is None else duration(value, name)

    return BeforeValidator(parse)


#: How long a supervisor's lease on a run lasts without renewal, and how often it renews it (seconds,
#: or durations such as 30s, 2m): the longest a dead supervisor's run waits for a new owner.
LeaseDuration = Annotated[float, _duration_setting("lease_duration")]
LeaseRenewEvery = Annotated[float, _duration_setting("lease_renew_every")]
DEFAULT_LEASE_DURATION_S = 60.0
DEFAULT_LEASE_RENEW_EVERY_S = 15.0
#: How long a run's backstop waits for its supervisor to check in before it deletes the run's slice once
#: the program is over or the run's deadline passed (docs/architecture.md, "The backstop").
BackstopGrace = Annotated[float, _duration_setting("backstop_grace")]
DEFAULT_BACKSTOP_GRACE_S = 600.0
#: How long a run's SSH key imported into OS Login stays valid (renewed before a new connection once half
#: of it is spent): it bounds how long a key outlives the run, so keys do not pile up in the profile.
OsLoginKeyTtl = Annotated[float, _duration_setting("os_login_key_ttl")]
DEFAULT_OS_LOGIN_KEY_TTL_S = 3600.0


def _split_list(value: Any) -> Any:
    # Environment variables hold lists as "a,b"; YAML and flags give real lists.
    if isinstance(value, str):
        return [item.strip() for item in value.split(",") if item.strip()]
    return value


def _check_zones(zones: list[str]) -> list[str]:
    return [zone(z, "zones") for z in zones]


def _check_region(value: str | None) -> str | None:
    return None if value is None else region(value)


class Profile(BaseModel):
    """What one profile of the config file may set. Unknown keys are an error (typos are caught)."""

    model_config = ConfigDict(extra="forbid")

    backend: Backend | None = None
    project: str | None = None
    zones: list[str] | None = None
    region: str | None = None
    capacity_types: list[CapacityType] | None = None
    # The Google API new slices go through where their generation offers it (a preference: TPU7x is
    # Compute Engine's alone, v5e and older the TPU API's alone; --api is a demand).
    api: Surface | None = None
    max_price: MaxPrice = None
    monthly_budget: MonthlyBudget = None
    # The hosts' VPC network, subnetwork and network tags, and the service account they act as.
    network: NetworkSetting = None
    subnetwork: SubnetworkSetting = None
    tags: NetworkTags = None
    service_account: ServiceAccount = None
    state_dir: Path | None = None
    sim_world: Path | None = None
    server: ServerSetting = None
    output: OutputFormat | None = None
    owner: str | None = None
    # Runs: the bucket they checkpoint to, what every host installs and runs after each provision, and
    # a ProxyCommand for hosts without external IPs (e.g. an IAP tunnel).
    bucket: str | None = None
    setup: list[str] | None = None
    requirements: Path | None = None
    ssh_proxy_command: str | None = None
    sim_wheelhouse: Path | None = None
    # The ledger (a URL, default: the state dir's ledger.db), the file of the key that encrypts runs'
    # secrets in it, and the runs' leases. The key itself is never a profile key (TPUCTL_SECRET_KEY).
    database: DatabaseSetting = None
    secret_key_file: Path | None = None
    lease_duration: LeaseDuration | None = None
    lease_renew_every: LeaseRenewEvery | None = None
    backstop_grace: BackstopGrace | None = None
    # Google: the project user credentials bill API quota to (x-goog-user-project), and the lifetime of
    # the key a run imports into OS Login.
    quota_project: str | None = None
    os_login_key_ttl: OsLoginKeyTtl | None = None

    _zones = field_validator("zones")(lambda cls, v: v if v is None else _check_zones(v))
    _region = field_validator("region")(lambda cls, v: _check_region(v))

    @field_validator("capacity_types", mode="before")
    @classmethod
    def _normalize_capacity(cls, value: Any) -> Any:
        value = _split_list(value)
        if isinstance(value, list):
            return [str(v).strip().lower().replace("_", "-") for v in value]
        return value


def default_config_path(environ: Mapping[str, str]) -> Path:
    if environ.get("TPUCTL_CONFIG"):
        return Path(environ["TPUCTL_CONFIG"]).expanduser()
    base = environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "tpuctl" / "config.yaml"


def default_state_dir(environ: Mapping[str, str]) -> Path:
    base = environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "tpuctl"


def read_profile(path: Path, profile: str | None, *, explicit: bool) -> Profile:
    """The named profile from the config file at ``path`` (None: the file's ``default_profile``).

    A missing file is fine unless it was named explicitly (flag or TPUCTL_CONFIG) or a non-default profile
    was asked for; a broken file, an unknown profile or a bad field is a ConfigError naming all of it.
    """
    where = str(path)
    if not path.exists():
        return _without_file(where, profile, explicit=explicit)
    data = _load_config(path)
    profile = profile or str(data.get("default_profile") or DEFAULT_PROFILE)
    profiles = data.get("profiles") or {}
    if not isinstance(profiles, dict):
        raise ConfigError(
            f"'profiles' in {where} must be a mapping of profile names to settings",
            path=where,
            field="profiles",
            fix="see configs/config.example.yaml",
        )
    if profile not in profiles:
        if profile == DEFAULT_PROFILE and "default_profile" not in data:
            return Profile()
        known = ", ".join(sorted(profiles)) or "none"
        raise ConfigError(
            f"unknown profile {profile!r} in {where}",
            path=where,
            field="profile",
            value=profile,
            fix=f"use one of the profiles defined there ({known})",
        )
    return _validate_profile(profiles[profile] or {}, profile, where)


def _without_file(where: str, profile: str | None, *, explicit: bool) -> Profile:
    """No config file at ``where``: the empty default profile, unless a file or a profile was asked for."""
    if explicit:
        raise ConfigError(
            f"config file {where} does not exist",
            path=where,
            fix="create it (see configs/config.example.yaml) or point TPUCTL_CONFIG at an existing file",
        )
    profile = profile or DEFAULT_PROFILE
    if profile != DEFAULT_PROFILE:
        raise ConfigError(
            f"unknown profile {profile!r}: no config file at {where}",
            path=where,
            field="profile",
            value=profile,
            fix="create the config file with that profile, or drop --profile",
        )
    return Profile()


def _load_config(path: Path) -> dict[Any, Any]:
    """The config file's top-level mapping (empty for an empty file)."""
    where = str(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(
            f"config file {where} is not valid YAML{at}",
            path=where,
            fix="fix the YAML syntax (indentation, colons, quotes) at that spot",
        ) from None
    except OSError as exc:
        raise ConfigError(
            f"cannot read config file {where}: {exc.strerror}",
            path=where,
            fix="check the path and its permissions",
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"config file {where} must be a mapping with a 'profiles' key",
            path=where,
            fix="see configs/config.example.yaml",
        )
    return data


def _validate_profile(raw: object, profile: str, where: str) -> Profile:
    """Profile ``profile``'s settings as read from the file at ``where``; a bad one names its key."""
    if not isinstance(raw, dict):
        raise ConfigError(
            f"profile {profile!r} in {where} must be a mapping",
            path=where,
            field=f"profiles.{profile}",
            fix="see configs/config.example.yaml",
        )
    try:
        return Profile.model_validate(raw)
    except ParamError as exc:
        raise exc.for_source(f"profiles.{profile}.{exc.param}", path=where) from None
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise ConfigError(
            f"invalid value {err.get('input')!r} for profiles.{profile}.{loc} in {where}: {err['msg']}",
            path=where,
            field=f"profiles.{profile}.{loc}",
            value=err.get("input"),
            fix=_fix_for(loc, err["msg"]),
        ) from None


def _fix_for(field: str, message: str) -> str:
    hints = {
        "backend": "use backend: sim or backend: gcp",
        "capacity_types": "use a list of: " + ", ".join(c.value for c in CapacityType),
        "output": "use one of: " + ", ".join(f.value for f in OutputFormat),
    }
    top = field.split(".")[0]
    if "extra" in message.lower() or "not permitted" in message.lower():
        return f"remove the unknown key {field!r}; allowed: " + ", ".join(Profile.model_fields)
    return hints.get(top, f"fix the value of {field}")


class _ProfileSource(PydanticBaseSettingsSource):
    """Settings from the chosen profile of the YAML config file (below flags and environment)."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        # Unused: __call__ returns the whole profile at once.
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        # current_state holds what the flags and the environment already decided, so the profile name and
        # the config path follow the same precedence as everything else.
        state = self.current_state
        profile = state.get("profile")
        explicit = state.get("config_file") is not None
        path = Path(state["config_file"]) if explicit else default_config_path(os.environ)
        explicit = explicit or bool(os.environ.get("TPUCTL_CONFIG"))
        chosen = str(profile) if profile else None
        values = read_profile(path, chosen, explicit=explicit).model_dump(exclude_none=True)
        values["config_file"] = path
        return values


class Settings(BaseSettings):
    """The settings in force for one command. Build with ``load_settings``."""

    model_config = SettingsConfigDict(
        env_prefix="TPUCTL_", extra="ignore", populate_by_name=True, validate_default=False
    )

    profile: str | None = None  # None: the config file's default_profile, else "default"
    config_file: Path | None = None
    backend: Backend | None = None
    project: str | None = Field(
        default=None,
        validation_alias=AliasChoices(
            "project", "TPUCTL_PROJECT", "CLOUDSDK_CORE_PROJECT", "GOOGLE_CLOUD_PROJECT"
        ),
    )
    zones: Annotated[list[str], NoDecode] = Field(default_factory=list)
    region: str | None = None
    capacity_types: Annotated[list[CapacityType], NoDecode] = Field(default_factory=list)
    api: Surface | None = None
    max_price: MaxPrice = None
    monthly_budget: MonthlyBudget = None
    network: NetworkSetting = None
    subnetwork: SubnetworkSetting = None
    # TPUCTL_TAGS holds them comma-separated (split by the parser, as a flag's value is).
    tags: Annotated[NetworkTags, NoDecode] = None
    service_account: ServiceAccount = None
    state_dir: Path | None = None
    sim_world: Path | None = None
    # An already running simulator (`tpuctl sim serve`) to talk to instead of starting one in-process.
    sim_url: str | None = None
    # A `tpuctl server` that runs and keeps the runs (``run``, ``runs ...``) instead of this machine.
    server: ServerSetting = None
    output: OutputFormat = OutputFormat.TABLE
    owner: str | None = None
    bucket: str | None = None
    setup: Annotated[list[str], NoDecode] = Field(default_factory=list)
    requirements: Path | None = None
    ssh_proxy_command: str | None = None
    # The wheels the simulator's package mirror serves its hosts (primed by scripts/setup).
    sim_wheelhouse: Path | None = None
    # The simulated VM this tpuctl runs on (node uid/worker), which every login on one says
    # (TPUCTL_SIM_VM, ``tpuctl.sim.vms.sshd``); None: not on one. On one, a simulator backend calls as
    # the VM's service account, from its metadata server (``SimBackend.on_vm``), as a tpuctl on a Google VM
    # does; not GCE_METADATA_HOST, which test and sandbox environments set to keep google-auth away from a
    # real metadata server.
    sim_vm: str | None = None
    # Where the ledger is (flag --database, TPUCTL_DATABASE_URL, profile key database); None: the state
    # dir's (resolved_database).
    database: DatabaseSetting = Field(
        default=None, validation_alias=AliasChoices("database", "TPUCTL_DATABASE_URL")
    )
    # The key that encrypts runs' secrets in the ledger: TPUCTL_SECRET_KEY (the key itself, for the
    # supervisors of a team sharing a ledger), else the file secret_key_file (resolved_secret_key_file).
    secret_key: SecretStr | None = None
    secret_key_file: Path | None = None
    lease_duration: LeaseDuration = DEFAULT_LEASE_DURATION_S
    lease_renew_every: LeaseRenewEvery = DEFAULT_LEASE_RENEW_EVERY_S
    backstop_grace: BackstopGrace = DEFAULT_BACKSTOP_GRACE_S
    # The project user credentials bill API quota to (google-auth sends it as x-goog-user-project); None:
    # what the ADC file or GOOGLE_CLOUD_QUOTA_PROJECT names, if anything.
    quota_project: str | None = None
    os_login_key_ttl: OsLoginKeyTtl = DEFAULT_OS_LOGIN_KEY_TTL_S
    # The gcloud/ADC variable the project was taken from (set by load_settings), when nothing of
    # tpuctl's own (flag, TPUCTL_PROJECT, profile) chose it: the CLI announces it on stderr.
    _project_from: str | None = PrivateAttr(default=None)

    @field_validator("setup", mode="before")
    @classmethod
    def _setup_from_env(cls, value: Any) -> Any:
        # TPUCTL_SETUP holds one shell command (commands have commas and spaces: never split it).
        return [value] if isinstance(value, str) else value

    @field_validator("zones", mode="before")
    @classmethod
    def _zones_from_env(cls, value: Any) -> Any:
        return _split_list(value)

    @field_validator("zones")
    @classmethod
    def _zones_valid(cls, value: list[str]) -> list[str]:
        return _check_zones(value)

    @field_validator("region")
    @classmethod
    def _region_valid(cls, value: str | None) -> str | None:
        return _check_region(value)

    @field_validator("capacity_types", mode="before")
    @classmethod
    def _capacity_from_env(cls, value: Any) -> Any:
        return Profile._normalize_capacity(value)

    @field_validator("secret_key", mode="before")
    @classmethod
    def _secret_key_valid(cls, value: Any) -> Any:
        # Checked here, once, so a malformed key is a usage error naming the variable up front, not a
        # failure at the first secret a run stores.
        return value if value is None else parse_secret_key(str(value)).decode("ascii")

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings, _ProfileSource(settings_cls))

    # --- derived ---------------------------------------------------------------------------------

    @property
    def resolved_backend(self) -> Backend:
        """sim unless GCP was chosen: explicitly, or by giving a project."""
        if self.backend is not None:
            return self.backend
        return Backend.GCP if self.project else Backend.SIM

    @property
    def project_from(self) -> str | None:
        """``GOOGLE_CLOUD_PROJECT`` or ``CLOUDSDK_CORE_PROJECT`` when the project (and with it real Google)
        came from that variable alone; None when tpuctl's own settings chose it, or no project is set."""
        return self._project_from

    @property
    def host_network(self) -> HostNetwork:
        """The hosts' network, subnetwork and tags, checked against each other."""
        return host_network(self.network, self.subnetwork, self.tags or ())

    @property
    def resolved_state_dir(self) -> Path:
        # Absolute, where the user typed it: a detached supervisor runs in another directory.
        return (self.state_dir or default_state_dir(os.environ)).expanduser().absolute()

    @property
    def resolved_database(self) -> DatabaseUrl:
        """The ledger's URL: the ``database`` setting, else ``sqlite:///<state dir>/ledger.db``."""
        return self.database or default_database_url(self.resolved_state_dir)

    @property
    def resolved_secret_key_file(self) -> Path:
        """The file of the key that encrypts runs' secrets (``TPUCTL_SECRET_KEY`` overrides it)."""
        path = self.secret_key_file or self.resolved_state_dir / SECRET_KEY_FILENAME
        return path.expanduser().absolute()

    @property
    def resolved_owner(self) -> str:
        """The owner label value: lowercase letters, digits, - and _ only (GCP label rules)."""
        raw = self.owner or os.environ.get("USER") or _safe_getuser()
        value = _LABEL_VALUE_RE.sub("-", raw.lower())[:63]
        return value or "unknown"


def _safe_getuser() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def load_settings(flags: Mapping[str, Any] | None = None) -> Settings:
    """Settings for one command: ``flags`` holds only the flags the user gave (None values are dropped)."""
    given = {k: v for k, v in (flags or {}).items() if v is not None and v != [] and v != ()}
    try:
        settings = Settings(**given)
    except ParamError as exc:
        raise exc.for_source(_source(exc.param, given)) from None
    except ValidationError as exc:
        err = exc.errors()[0]
        field = str(err["loc"][0]) if err["loc"] else "settings"
        source = _source(field, given)
        raise UsageError(
            f"invalid value {err.get('input')!r} for {source}: {err['msg']}",
            field=source,
            value=err.get("input"),
            fix=_fix_for(field, err["msg"]),
        ) from None
    except TpuctlError:
        raise
    settings._project_from = _ambient_project_source(settings, given)
    _check_lease_timing(settings)
    if settings.resolved_backend is Backend.GCP and not settings.project:
        raise ConfigError(
            "backend gcp needs a project",
            path=str(settings.config_file) if settings.config_file else None,
            field="project",
            fix="pass --project ID, set GOOGLE_CLOUD_PROJECT, or set project: in the profile",
        )
    return settings


def _check_lease_timing(settings: Settings) -> None:
    """A lease renewed less often than twice per lease length lapses on one slow or failed renewal. (The
    two may come from different sources, so the error names the settings, not a flag or a variable.)"""
    ttl, every = settings.lease_duration, settings.lease_renew_every
    if every * 2 > ttl:
        raise UsageError(
            f"lease_renew_every ({every:g} s) must be at most half of lease_duration ({ttl:g} s): a "
            "supervisor must have time to renew again after one failed renewal, before its lease expires",
            field="lease_renew_every",
            value=every,
            fix=f"set lease_renew_every to {ttl / 4:g}s or less, or lengthen lease_duration",
        )


#: Variables other tools set (gcloud, client libraries) that tpuctl also reads for the project, first wins.
_AMBIENT_PROJECT_VARS = ("CLOUDSDK_CORE_PROJECT", "GOOGLE_CLOUD_PROJECT")


def _ambient_project_source(settings: Settings, given: Mapping[str, Any]) -> str | None:
    """The ambient variable the project came from, when no flag or TPUCTL_PROJECT gave one. (A profile
    with the same project is tpuctl's own choice too: then there is nothing to announce.)"""
    if settings.project is None or "project" in given or os.environ.get("TPUCTL_PROJECT"):
        return None
    var = next((v for v in _AMBIENT_PROJECT_VARS if os.environ.get(v)), None)
    if var is None or os.environ[var] != settings.project:
        return None
    try:
        path = settings.config_file or default_config_path(os.environ)
        profile_project = read_profile(path, settings.profile, explicit=False).project
    except TpuctlError:
        profile_project = None
    return None if profile_project == settings.project else var


#: Settings whose environment variable is not ``TPUCTL_<NAME>``.
_ENV_NAMES: Mapping[str, str] = {"database": "TPUCTL_DATABASE_URL"}


def _source(name: str, given: Mapping[str, Any]) -> str:
    """How the user gave setting ``name``: its flag, else its environment variable (a bad profile value
    never gets here: read_profile names the file and the key)."""
    return flag(name) if name in given else _ENV_NAMES.get(name, f"TPUCTL_{name.upper()}")

"""Settings precedence (flag > env > YAML profile > default) as a table of cases, and bad configs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tpuctl.catalog import CapacityType
from tpuctl.cloud.base import HostNetwork, VpcNetwork, VpcSubnetwork
from tpuctl.errors import ConfigError, UsageError
from tpuctl.settings import Backend, load_settings

CONFIG = """\
default_profile: team
profiles:
  team:
    zones: [us-east5-b]
    max_price: 10
    capacity_types: [spot, on-demand]
    project: from-yaml
    backend: sim
  other:
    region: europe-west4
    max_price: 99
"""


@pytest.fixture
def config_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "xdg-config" / "tpuctl" / "config.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(CONFIG)
    return path


@pytest.mark.parametrize(
    ("flags", "env", "field", "expected"),
    [
        # default only (no file): see test_defaults_without_config
        ({}, {}, "max_price", 10.0),  # YAML over default
        ({}, {"TPUCTL_MAX_PRICE": "7"}, "max_price", 7.0),  # env over YAML
        ({"max_price": 3.0}, {"TPUCTL_MAX_PRICE": "7"}, "max_price", 3.0),  # flag over env
        ({}, {}, "zones", ["us-east5-b"]),
        ({}, {"TPUCTL_ZONES": "us-west4-a,us-central1-a"}, "zones", ["us-west4-a", "us-central1-a"]),
        ({"zones": ["us-central1-a"]}, {"TPUCTL_ZONES": "us-west4-a"}, "zones", ["us-central1-a"]),
        ({}, {}, "project", "from-yaml"),
        ({}, {"GOOGLE_CLOUD_PROJECT": "g"}, "project", "g"),
        ({}, {"GOOGLE_CLOUD_PROJECT": "g", "CLOUDSDK_CORE_PROJECT": "c"}, "project", "c"),
        ({}, {"CLOUDSDK_CORE_PROJECT": "c", "TPUCTL_PROJECT": "t"}, "project", "t"),
        ({"project": "f"}, {"TPUCTL_PROJECT": "t"}, "project", "f"),
        ({}, {}, "capacity_types", [CapacityType.SPOT, CapacityType.ON_DEMAND]),
        ({}, {"TPUCTL_CAPACITY_TYPES": "preemptible"}, "capacity_types", [CapacityType.PREEMPTIBLE]),
        ({"profile": "other"}, {}, "max_price", 99.0),  # flag picks the profile
        ({}, {"TPUCTL_PROFILE": "other"}, "region", "europe-west4"),  # env picks the profile
        ({"profile": "team"}, {"TPUCTL_PROFILE": "other"}, "max_price", 10.0),  # flag over env
        ({}, {}, "backend", Backend.SIM),
        ({"backend": "gcp"}, {}, "backend", Backend.GCP),
    ],
)
def test_precedence(
    config_file: Path,
    monkeypatch: pytest.MonkeyPatch,
    flags: dict[str, Any],
    env: dict[str, str],
    field: str,
    expected: Any,
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings = load_settings(flags)
    assert getattr(settings, field) == expected


def test_defaults_without_config(state_dir: Path) -> None:
    settings = load_settings({})
    assert settings.resolved_backend is Backend.SIM
    assert settings.project is None
    assert settings.zones == []
    assert settings.max_price is None
    assert settings.resolved_state_dir == state_dir


def test_a_project_selects_gcp_unless_backend_says_sim(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "p")
    assert load_settings({}).resolved_backend is Backend.GCP
    assert load_settings({"backend": "sim"}).resolved_backend is Backend.SIM


def test_gcp_without_project_is_a_config_error() -> None:
    with pytest.raises(ConfigError) as info:
        load_settings({"backend": "gcp"})
    assert "--project" in (info.value.fix or "")


def test_explicit_config_file_via_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "elsewhere.yaml"
    path.write_text("profiles:\n  default:\n    max_price: 5\n")
    monkeypatch.setenv("TPUCTL_CONFIG", str(path))
    assert load_settings({}).max_price == 5.0


@pytest.mark.parametrize(
    ("text", "profile", "field", "value", "fix_part"),
    [
        ("profiles:\n  a:\n    max_price: -3\n", "a", "profiles.a.max_price", -3, "positive"),
        ("profiles:\n  a:\n    max_price: lots\n", "a", "profiles.a.max_price", "lots", "positive"),
        ("profiles:\n  a:\n    zonez: [x]\n", "a", "profiles.a.zonez", ["x"], "unknown key"),
        ("profiles:\n  a:\n    zones: [uscentral1]\n", "a", "profiles.a.zones", None, "us-central1-a"),
        ("profiles:\n  a:\n    backend: aws\n", "a", "profiles.a.backend", "aws", "sim or backend: gcp"),
        (
            "profiles:\n  a:\n    capacity_types: [cheap]\n",
            "a",
            "profiles.a.capacity_types.0",
            "cheap",
            "spot",
        ),
        ("profiles:\n  a: {}\n", "nope", "profile", "nope", "a"),
    ],
)
def test_bad_config_names_file_field_value_and_fix(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    text: str,
    profile: str,
    field: str,
    value: Any,
    fix_part: str,
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    monkeypatch.setenv("TPUCTL_CONFIG", str(path))
    with pytest.raises(ConfigError) as info:
        load_settings({"profile": profile})
    err = info.value
    assert err.path == str(path)
    assert err.field == field
    if value is not None:
        assert err.value == value
    assert fix_part in (err.fix or "")
    assert err.exit_code == 2
    assert str(path) in err.message


def test_broken_yaml_says_where(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("profiles:\n  a:\n    zones: [us-central1-a\n")
    monkeypatch.setenv("TPUCTL_CONFIG", str(path))
    with pytest.raises(ConfigError) as info:
        load_settings({})
    assert "not valid YAML" in info.value.message
    assert "line" in info.value.message


def test_missing_explicit_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TPUCTL_CONFIG", str(tmp_path / "missing.yaml"))
    with pytest.raises(ConfigError) as info:
        load_settings({})
    assert "does not exist" in info.value.message


def test_unknown_profile_without_config_file() -> None:
    with pytest.raises(ConfigError) as info:
        load_settings({"profile": "prod"})
    assert info.value.field == "profile"


@pytest.mark.parametrize(
    ("env", "source"),
    [({"TPUCTL_MAX_PRICE": "abc"}, "TPUCTL_MAX_PRICE"), ({"TPUCTL_ZONES": "nowhere"}, "TPUCTL_ZONES")],
)
def test_bad_environment_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], source: str
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(UsageError) as info:
        load_settings({})
    assert info.value.field == source


def test_bad_flag_names_the_flag() -> None:
    with pytest.raises(UsageError) as info:
        load_settings({"max_price": -1.0})
    assert info.value.field == "--max-price"
    assert info.value.value == -1.0


def test_owner_label_is_sanitized(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("USER", "Jane.Doe@Corp")
    assert load_settings({}).resolved_owner == "jane-doe-corp"


@pytest.mark.parametrize(
    ("env", "flags", "profile", "expected"),
    [
        ({"GOOGLE_CLOUD_PROJECT": "g"}, {}, None, "GOOGLE_CLOUD_PROJECT"),
        ({"CLOUDSDK_CORE_PROJECT": "c"}, {}, None, "CLOUDSDK_CORE_PROJECT"),
        ({"GOOGLE_CLOUD_PROJECT": "g", "CLOUDSDK_CORE_PROJECT": "c"}, {}, None, "CLOUDSDK_CORE_PROJECT"),
        ({"GOOGLE_CLOUD_PROJECT": "g"}, {"project": "g"}, None, None),  # --project: explicit
        ({"GOOGLE_CLOUD_PROJECT": "g", "TPUCTL_PROJECT": "t"}, {}, None, None),
        ({"GOOGLE_CLOUD_PROJECT": "g"}, {}, "g", None),  # the profile chose the same project
        ({}, {}, "p", None),
        ({}, {}, None, None),
    ],
)
def test_a_project_from_an_ambient_variable_is_named(
    env: dict[str, str],
    flags: dict[str, str],
    profile: str | None,
    expected: str | None,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    if profile is not None:
        path = tmp_path / "config.yaml"
        path.write_text(f"profiles:\n  default:\n    project: {profile}\n")
        monkeypatch.setenv("TPUCTL_CONFIG", str(path))
    settings = load_settings(flags)
    assert settings.project_from == expected
    if expected:
        assert settings.resolved_backend is Backend.GCP


def test_a_relative_state_dir_is_where_the_user_typed_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A detached supervisor runs in the run's log directory: the state dir it is handed is absolute."""
    monkeypatch.chdir(tmp_path)
    settings = load_settings({"state_dir": Path("st")})
    assert settings.resolved_state_dir == tmp_path / "st"


# -- the ledger's URL, the secret key, the lease timing -------------------------------------------------


def test_the_ledger_defaults_to_the_state_dirs_file(state_dir: Path) -> None:
    settings = load_settings({})
    assert settings.database is None
    assert settings.resolved_database.text == f"sqlite:///{state_dir}/ledger.db"
    assert load_settings({"state_dir": "/srv/st"}).resolved_database.path == Path("/srv/st/ledger.db")
    assert settings.resolved_secret_key_file == state_dir / "secret.key"
    assert (settings.lease_duration, settings.lease_renew_every) == (60.0, 15.0)


@pytest.mark.parametrize(
    ("flags", "env", "profile", "expected"),
    [
        ({}, {}, "sqlite:////from/profile.db", "/from/profile.db"),
        ({}, {"TPUCTL_DATABASE_URL": "sqlite:////from/env.db"}, "sqlite:////from/profile.db", "/from/env.db"),
        (
            {"database": "sqlite:////from/flag.db"},
            {"TPUCTL_DATABASE_URL": "sqlite:////from/env.db"},
            "sqlite:////from/profile.db",
            "/from/flag.db",
        ),
        ({"database": "sqlite:////from/flag.db"}, {}, None, "/from/flag.db"),
    ],
)
def test_database_precedence_flag_env_profile(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    flags: dict[str, Any],
    env: dict[str, str],
    profile: str | None,
    expected: str,
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(f"profiles:\n  default:\n    database: {profile}\n" if profile else "profiles: {}\n")
    monkeypatch.setenv("TPUCTL_CONFIG", str(path))
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings = load_settings(flags)
    assert settings.resolved_database.path == Path(expected)
    assert settings.database is not None and settings.database.text == f"sqlite:///{expected}"


def test_a_postgresql_databases_password_survives_every_source_and_is_never_dumped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = "postgresql://alice:hunter2@team-db/tpuctl"
    path = tmp_path / "config.yaml"
    path.write_text(f"profiles:\n  default:\n    database: {text}\n")
    monkeypatch.setenv("TPUCTL_CONFIG", str(path))
    from_profile = load_settings({}).resolved_database
    monkeypatch.setenv("TPUCTL_DATABASE_URL", text)
    from_env = load_settings({}).resolved_database
    from_flag = load_settings({"database": text}).resolved_database
    for url in (from_profile, from_env, from_flag):
        assert url.password == "hunter2" and url.secret_url.endswith("alice:hunter2@team-db/tpuctl")
    assert "hunter2" not in load_settings({}).model_dump_json()


@pytest.mark.parametrize(
    ("value", "in_message"),
    [
        ("sqlite:///ledger.db", "relative path"),
        ("mysql://db/ledger", "unknown scheme"),
        ("postgresql://team-db", "names no database"),
    ],
)
def test_a_bad_database_names_where_it_came_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str, in_message: str
) -> None:
    with pytest.raises(UsageError) as info:
        load_settings({"database": value})
    assert info.value.field == "--database" and info.value.value == value and info.value.exit_code == 2
    assert in_message in info.value.message and info.value.fix

    monkeypatch.setenv("TPUCTL_DATABASE_URL", value)
    with pytest.raises(UsageError) as info:
        load_settings({})
    assert info.value.field == "TPUCTL_DATABASE_URL" and in_message in info.value.message

    monkeypatch.delenv("TPUCTL_DATABASE_URL")
    path = tmp_path / "config.yaml"
    path.write_text(f"profiles:\n  default:\n    database: {value}\n")
    monkeypatch.setenv("TPUCTL_CONFIG", str(path))
    with pytest.raises(ConfigError) as config_info:
        load_settings({})
    assert config_info.value.field == "profiles.default.database" and config_info.value.path == str(path)


def test_the_secret_key_comes_from_its_variable_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tpuctl.store.secrets import generate_key

    key = generate_key().decode()
    monkeypatch.setenv("TPUCTL_SECRET_KEY", key)
    settings = load_settings({})
    assert settings.secret_key is not None and settings.secret_key.get_secret_value() == key
    assert key not in repr(settings)
    monkeypatch.setenv("TPUCTL_SECRET_KEY", "not-a-key")
    with pytest.raises(UsageError) as info:
        load_settings({})
    assert info.value.field == "TPUCTL_SECRET_KEY" and "not-a-key" not in str(info.value)
    path = tmp_path / "config.yaml"
    path.write_text(f"profiles:\n  default:\n    secret_key: {key}\n")  # never from a config file
    monkeypatch.delenv("TPUCTL_SECRET_KEY")
    monkeypatch.setenv("TPUCTL_CONFIG", str(path))
    with pytest.raises(ConfigError, match="unknown key"):
        load_settings({})


def test_the_key_file_and_lease_timing_from_a_profile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        "profiles:\n  default:\n    secret_key_file: /keys/team.key\n"
        "    lease_duration: 2m\n    lease_renew_every: 20s\n"
    )
    monkeypatch.setenv("TPUCTL_CONFIG", str(path))
    settings = load_settings({})
    assert settings.resolved_secret_key_file == Path("/keys/team.key")
    assert (settings.lease_duration, settings.lease_renew_every) == (120.0, 20.0)
    monkeypatch.setenv("TPUCTL_LEASE_DURATION", "1.5")  # tests use seconds
    monkeypatch.setenv("TPUCTL_LEASE_RENEW_EVERY", "0.5")
    assert (load_settings({}).lease_duration, load_settings({}).lease_renew_every) == (1.5, 0.5)


@pytest.mark.parametrize(
    ("env", "field", "in_message"),
    [
        (
            {"TPUCTL_LEASE_DURATION": "30s", "TPUCTL_LEASE_RENEW_EVERY": "20s"},
            "lease_renew_every",
            "at most half",
        ),
        ({"TPUCTL_LEASE_DURATION": "0"}, "TPUCTL_LEASE_DURATION", "longer than zero"),
        ({"TPUCTL_LEASE_RENEW_EVERY": "soon"}, "TPUCTL_LEASE_RENEW_EVERY", "as a duration"),
    ],
)
def test_bad_lease_timing_is_refused(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], field: str, in_message: str
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(UsageError) as info:
        load_settings({})
    assert info.value.field == field and in_message in info.value.message and info.value.exit_code == 2


NETWORK_PROFILE = """\
profiles:
  default:
    network: projects/host-proj/global/networks/shared
    subnetwork: projects/host-proj/regions/us-central1/subnetworks/tpu
    tags: [tpu-ssh, web]
    service_account: trainer@p.iam.gserviceaccount.com
"""


def test_the_hosts_network_from_a_profile_the_environment_and_flags(
    config_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config_file.write_text(NETWORK_PROFILE)
    profile = load_settings({})
    assert profile.host_network == HostNetwork(
        VpcNetwork("shared", "host-proj"),
        VpcSubnetwork("tpu", "host-proj", "us-central1"),
        ("tpu-ssh", "web"),
    )
    assert profile.service_account == "trainer@p.iam.gserviceaccount.com"
    monkeypatch.setenv("TPUCTL_TAGS", "a,b")  # comma-separated, as --tags takes them
    monkeypatch.setenv("TPUCTL_SERVICE_ACCOUNT", "other@p.iam.gserviceaccount.com")
    env = load_settings({})
    assert env.tags == ["a", "b"] and env.service_account == "other@p.iam.gserviceaccount.com"
    flags = load_settings({"network": "vpc", "subnetwork": "sub", "tags": ["c"]})
    assert flags.host_network == HostNetwork(VpcNetwork("vpc"), VpcSubnetwork("sub"), ("c",))


@pytest.mark.parametrize(
    ("key", "value", "fix_part"),
    [
        ("network", "Not_A_Network", "Shared VPC"),
        ("subnetwork", "regions/x/subnetworks/s", "regions/REGION/subnetworks/NAME"),
        ("tags", "[Bad Tag]", "tpu-ssh"),
        ("service_account", "trainer", "iam.gserviceaccount.com"),
    ],
)
def test_a_bad_network_key_names_the_file_and_the_key(
    config_file: Path, key: str, value: str, fix_part: str
) -> None:
    config_file.write_text(f"profiles:\n  default:\n    {key}: {value}\n")
    with pytest.raises(ConfigError) as info:
        load_settings({})
    assert info.value.field == f"profiles.default.{key}"
    assert fix_part in (info.value.fix or "")


def test_a_bad_network_flag_or_variable_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(UsageError) as flag:
        load_settings({"network": "Bad"})
    assert flag.value.field == "--network"
    monkeypatch.setenv("TPUCTL_SUBNETWORK", "a/b")
    with pytest.raises(UsageError) as env:
        load_settings({})
    assert env.value.field == "TPUCTL_SUBNETWORK"


def test_a_shared_vpc_subnetwork_needs_its_network_of_the_same_project() -> None:
    alone = load_settings({"subnetwork": "projects/host-proj/regions/us-central1/subnetworks/tpu"})
    with pytest.raises(UsageError, match="name its network too") as info:
        _ = alone.host_network
    assert "projects/host-proj/global/networks/" in (info.value.fix or "")
    elsewhere = load_settings(
        {"network": "vpc", "subnetwork": "projects/host-proj/regions/us-central1/subnetworks/tpu"}
    )
    with pytest.raises(UsageError, match="belongs to its network's project"):
        _ = elsewhere.host_network

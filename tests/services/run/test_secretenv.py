"""A run's secret values: ``--secret`` words read (a value given, or the submitting environment's),
checked against the request's names (an error names the variable, never its value), and kept in the
ledger only encrypted, read back only with the same key."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from tpuctl.errors import SecretKeyError, UsageError
from tpuctl.services.run.secretenv import (
    SECRET_NAME,
    check_secrets,
    load_secrets,
    parse_secret_flags,
    resolve_secrets,
    store_secrets,
)
from tpuctl.store.ledger import Ledger
from tpuctl.store.secrets import SecretKey, generate_key

RUN_ID = "run-20261127-131500-5ec7"
VALUE = "hf_s3cr3t=with=equals"


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    with Ledger(tmp_path / "ledger") as ledger:
        ledger.create_run(RUN_ID, script="train.py")
        yield ledger


def test_flags_take_a_value_or_the_submitting_environments() -> None:
    given = parse_secret_flags([f"HF_TOKEN={VALUE}", "WANDB_API_KEY", "EMPTY="])
    assert given == {"HF_TOKEN": VALUE, "WANDB_API_KEY": None, "EMPTY": ""}
    resolved = resolve_secrets(given, {"WANDB_API_KEY": "w4ndb", "HF_TOKEN": "not this one"})
    assert resolved == {"HF_TOKEN": VALUE, "WANDB_API_KEY": "w4ndb", "EMPTY": ""}


def test_a_secret_set_nowhere_is_exit_2_naming_it() -> None:
    with pytest.raises(UsageError) as info:
        resolve_secrets({"HF_TOKEN": None}, {})
    assert info.value.field == "secret" and info.value.value == "HF_TOKEN"
    assert "HF_TOKEN" in info.value.message and "export HF_TOKEN" in str(info.value.fix)


@pytest.mark.parametrize(
    ("word", "says"),
    [("1X=" + VALUE, "bad --secret name '1X'"), ("TPUCTL_RUN_ID=" + VALUE, "set by tpuctl"),
     ("PYTHONPATH=" + VALUE, "set by tpuctl"), ("A-B=" + VALUE, "bad --secret name 'A-B'")],
)  # fmt: skip
def test_a_bad_name_is_refused_without_its_value(word: str, says: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_secret_flags([word])
    assert says in info.value.message
    assert VALUE not in f"{info.value.message} {info.value.fix} {info.value.value}"


def test_values_must_match_the_requests_names_and_never_show_in_the_error() -> None:
    assert check_secrets(("B", "A"), {"A": "1", "B": VALUE}, env_names=()) == {"B": VALUE, "A": "1"}
    cases = [
        (("A",), {}, (), "secret A has no value"),
        ((), {"A": VALUE}, (), "values were given for A"),
        (("A",), {"A": VALUE}, ("A",), "A is both an --env variable and a secret"),
        (("A",), {"A": VALUE + "\x00"}, (), "secret A: its value holds a NUL byte"),
    ]
    for names, values, env_names, says in cases:
        with pytest.raises(UsageError) as info:
            check_secrets(names, values, env_names=env_names)
        assert says in info.value.message
        assert VALUE not in f"{info.value.message} {info.value.fix} {info.value.value}"


def test_stored_only_encrypted_and_read_back_with_the_same_key_only(ledger: Ledger, tmp_path: Path) -> None:
    key = SecretKey(generate_key(), "test")
    assert load_secrets(ledger, RUN_ID, key) == {}  # a run without secrets
    store_secrets(ledger, RUN_ID, {"HF_TOKEN": VALUE}, key)
    assert load_secrets(ledger, RUN_ID, key) == {"HF_TOKEN": VALUE}
    for path in (tmp_path / "ledger").rglob("*"):
        assert VALUE.encode() not in path.read_bytes(), path
    with sqlite3.connect(next((tmp_path / "ledger").glob("*.db"))) as raw:
        names = [row[0] for row in raw.execute("SELECT name FROM run_secrets WHERE run_id = ?", (RUN_ID,))]
    assert names == [SECRET_NAME]
    with pytest.raises(SecretKeyError) as info:
        load_secrets(ledger, RUN_ID, SecretKey(generate_key(), "another key"))
    assert "another key" in info.value.message and VALUE not in info.value.message

"""Small pieces of Google's wire format the simulator reads and writes: timestamps, durations, page
tokens, resource-name and label rules, and the enum numbers the client sends.
"""

from __future__ import annotations

import base64
import binascii
import re
from datetime import UTC, datetime
from typing import Any, TypeVar

from tpuctl.sim.api_errors import invalid_argument

T = TypeVar("T")

#: GCP's rule for node and queued-resource ids (RFC 1035 label, at most 63 characters).
RESOURCE_ID_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
LABEL_KEY_RE = re.compile(r"^[a-z][a-z0-9_-]{0,62}$")
LABEL_VALUE_RE = re.compile(r"^[a-z0-9_-]{0,63}$")
ZONE_RE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-(?:[a-z]|ai[0-9][a-z]?)$")
DURATION_RE = re.compile(r"^(-?[0-9]+(?:\.[0-9]{1,9})?)s$")

#: google.cloud.tpu.v2.AcceleratorConfig.Type numbers. The REST transport sends enums as numbers
#: (``use_integers_for_enums=True`` with ``$alt=json;enum-encoding=int``); we answer with names, which
#: the client's json_format parser accepts as well. Checked against tpu_v2 in tests/sim.
ACCELERATOR_TYPE_ENUM: dict[int, str] = {2: "V2", 4: "V3", 7: "V4", 9: "V5LITE_POD", 10: "V5P", 11: "V6E"}

NODE_OPERATION_METADATA_TYPE = "type.googleapis.com/google.cloud.tpu.v2.OperationMetadata"
NODE_TYPE = "type.googleapis.com/google.cloud.tpu.v2.Node"
QUEUED_RESOURCE_TYPE = "type.googleapis.com/google.cloud.tpu.v2.QueuedResource"
EMPTY_TYPE = "type.googleapis.com/google.protobuf.Empty"


def rfc3339(ts: float) -> str:
    """Epoch seconds as an RFC 3339 UTC timestamp with microseconds, as Google's JSON writes them."""
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_rfc3339(value: str, field: str) -> float:
    text = value.strip()
    if text.endswith("Z"):
        text = text[:-1] + "+00:00"
    # fromisoformat takes at most 6 fractional digits; Google may send 9.
    match = re.match(r"^(.*T[0-9:]+)(\.[0-9]+)?(.*)$", text)
    if match and match.group(2) and len(match.group(2)) > 7:
        text = match.group(1) + match.group(2)[:7] + match.group(3)
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise invalid_argument(
            f"Invalid value for field '{field}': {value!r} is not an RFC 3339 time.", field
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


def parse_duration(value: Any, field: str) -> float:
    """``"3600s"`` / ``"1.5s"`` (google.protobuf.Duration's JSON form) -> seconds."""
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, dict):  # {"seconds": N, "nanos": M}, should a client send the object form
        return float(value.get("seconds", 0)) + float(value.get("nanos", 0)) / 1e9
    match = DURATION_RE.match(str(value))
    if not match:
        raise invalid_argument(
            f"Invalid value for field '{field}': {value!r}. A duration looks like \"3600s\".", field
        )
    return float(match.group(1))


def check_resource_id(value: str, field: str) -> None:
    if not value:
        raise invalid_argument(f"Field '{field}' is required.", field)
    if len(value) > 63 or not RESOURCE_ID_RE.match(value):
        raise invalid_argument(
            f"Invalid value for field '{field}': {value!r}. Must be a match of regex "
            "'^[a-z]([-a-z0-9]*[a-z0-9])?$' and at most 63 characters.",
            field,
        )


def check_labels(labels: Any, field: str) -> dict[str, str]:
    if labels is None:
        return {}
    if not isinstance(labels, dict):
        raise invalid_argument(f"Invalid value for field '{field}': must be a map of strings.", field)
    if len(labels) > 64:
        raise invalid_argument(f"Invalid value for field '{field}': at most 64 labels.", field)
    for key, value in labels.items():
        if not isinstance(key, str) or not LABEL_KEY_RE.match(key):
            raise invalid_argument(
                f"Invalid value for field '{field}': label key {key!r} must start with a lowercase letter "
                "and hold at most 63 lowercase letters, digits, '_' or '-'.",
                f"{field}.{key}",
            )
        if not isinstance(value, str) or not LABEL_VALUE_RE.match(value):
            raise invalid_argument(
                f"Invalid value for field '{field}': label value {value!r} (key {key!r}) must hold at most "
                "63 lowercase letters, digits, '_' or '-'.",
                f"{field}.{key}",
            )
    return dict(labels)


def check_zone(zone: str, *, allow_all: bool = False) -> None:
    if allow_all and zone == "-":
        return
    if not ZONE_RE.match(zone):
        raise invalid_argument(f"Invalid location '{zone}': a location looks like us-central1-a.", "parent")


def _encode_token(offset: int) -> str:
    return base64.urlsafe_b64encode(f"offset:{offset}".encode()).decode().rstrip("=")


def _decode_token(token: str) -> int:
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
        kind, _, number = raw.partition(":")
        if kind != "offset":
            raise ValueError(raw)
        return max(0, int(number))
    except (ValueError, binascii.Error, UnicodeDecodeError):
        raise invalid_argument(f"Invalid page token {token!r}.", "pageToken") from None


def paginate(items: list[T], page_size: int, page_token: str) -> tuple[list[T], str]:
    """One page of ``items`` and the token of the next ("" at the end). page_size 0 = everything."""
    start = _decode_token(page_token) if page_token else 0
    if page_size < 0:
        raise invalid_argument("Field 'pageSize' must not be negative.", "pageSize")
    end = len(items) if page_size == 0 else start + page_size
    next_token = _encode_token(end) if end < len(items) else ""
    return items[start:end], next_token

"""SkyPilot's accelerator names and forms, resolved like tpuctl's own (``Catalog.resolve``).

A name: ``tpu-v6e-8``, SkyPilot's v5e form ``tpu-v5litepod-16``, the ``tpu-v5e-16`` form people also
write, tpuctl's ``v5e-16``, with an optional ``:1`` count. A TPU's count is always 1 (the size is in the
name); more is refused with what to use instead. The forms: one name; a list (the user's order first);
a set ``{a, b}`` or ``any_of`` (the cheapest first); ``ordered`` (a list of entries, in order).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from tpuctl.catalog import Catalog
from tpuctl.errors import UsageError
from tpuctl.jobs.model import AcceleratorChoice, Resources
from tpuctl.jobs.source import KeyPath

TypePreference = Literal["ordered", "cheapest"]

_COUNT_RE = re.compile(r"(?P<name>[^:]+):(?P<count>.*)")


def resolve_name(name: str, catalog: Catalog, *, param: str = "accelerators") -> str:
    """A SkyPilot or tpuctl name -> tpuctl's name for the type (``v5e-16``); a bad one is a UsageError
    that says what is valid (with "did you mean" where one is near)."""
    text = name.strip()
    match = _COUNT_RE.fullmatch(text)
    if match is not None:
        count = match["count"].strip()
        if count != "1":
            raise UsageError(
                f"accelerator count {count!r} in {name!r}: a TPU's size is in its name, its count is 1",
                field=param,
                value=name,
                fix=f"write {match['name']} (or {match['name']}:1); for several slices joined into one "
                "job use `slices: N`",
            )
        text = match["name"].strip()
    if text.lower().startswith("tpu-"):
        text = text[len("tpu-") :]
    try:
        return catalog.resolve(text).friendly_name
    except UsageError as exc:
        raise UsageError(
            exc.message.replace(repr(text), repr(name)),
            field=param,
            value=name,
            fix=(exc.fix or "") + "; SkyPilot's names work too: tpu-v6e-8, tpu-v5litepod-16",
        ) from None


@dataclass(frozen=True)
class AcceleratorSet:
    """The types a job names, each with where it is written, and how they rank."""

    names: tuple[str, ...]
    places: tuple[KeyPath, ...]
    preference: TypePreference


def accelerator_set(resources: Resources) -> AcceleratorSet | None:
    """The types ``resources`` names (not yet resolved), or None where it names none. More than one of
    ``accelerators``, ``any_of`` and ``ordered`` is a UsageError naming the second."""
    given = [key for key in ("accelerators", "any_of", "ordered") if getattr(resources, key) is not None]
    if len(given) > 1:
        raise UsageError(
            f"both resources.{given[0]} and resources.{given[1]} name slice types",
            field=f"resources.{given[1]}",
            value=given[1],
            fix="name the types once: accelerators (one, a list or a set), any_of or ordered",
        )
    base: KeyPath = ("resources",)
    accelerators = resources.accelerators
    if resources.any_of is not None:
        return _entries(resources.any_of, (*base, "any_of"), "cheapest")
    if resources.ordered is not None:
        return _entries(resources.ordered, (*base, "ordered"), "ordered")
    if accelerators is None:
        return None
    where: KeyPath = (*base, "accelerators")
    if isinstance(accelerators, str):
        return AcceleratorSet((accelerators,), (where,), "ordered")
    if isinstance(accelerators, list):
        return AcceleratorSet(
            tuple(accelerators), tuple((*where, i) for i in range(len(accelerators))), "ordered"
        )
    names = tuple(accelerators)
    return AcceleratorSet(names, tuple((*where, n) for n in names), "cheapest")


def _entries(
    entries: Sequence[AcceleratorChoice], where: KeyPath, preference: TypePreference
) -> AcceleratorSet:
    names = tuple(entry.accelerators for entry in entries)
    return AcceleratorSet(names, tuple((*where, i, "accelerators") for i in range(len(names))), preference)

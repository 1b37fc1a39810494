"""How a list is laid out on a screen or in a pipe, so that identifiers are never cut.

In a terminal the table keeps every identifier column whole: when the rows do not fit the width, the
lower-value columns are dropped first (named on stderr), then the box goes; a cell is never ellipsized.
Piped, the table is plain text at full width (columns padded with spaces, no box drawing), so
`tpuctl pod list | grep` and `awk '{print $1}'` see the whole names.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

#: Headers of identifier columns: what a user copies into the next command. Never dropped.
IDENTIFIERS = frozenset({"NAME", "RUN", "POD", "SLICE", "ZONE", "TYPE", "KEY", "ID", "RUN ID", "PROJECT"})

#: The separator of plain (piped) columns.
GAP = "  "


@dataclass(frozen=True)
class Layout:
    """Which columns a terminal table shows (indices into the header), and whether it keeps its box."""

    shown: tuple[int, ...]
    boxed: bool
    dropped: tuple[str, ...]


def cell_width(text: str) -> int:
    """The width of ``text`` on a terminal (wide characters count twice); its longest line."""
    from rich.cells import cell_len

    return max((cell_len(line) for line in text.split("\n")), default=0)


def natural_widths(columns: Sequence[str], cells: Sequence[Sequence[str]]) -> list[int]:
    widths = [cell_width(c) for c in columns]
    for row in cells:
        for i, value in enumerate(row):
            widths[i] = max(widths[i], cell_width(value))
    return widths


def boxed_width(widths: Sequence[int]) -> int:
    """A rich table's width with its default box: one space each side of a cell, a rule between."""
    return sum(widths) + 3 * len(widths) + 1


def fit(
    columns: Sequence[str],
    cells: Sequence[Sequence[str]],
    width: int,
    keep: frozenset[str] | None = None,
    drop: Sequence[str] = (),
) -> Layout:
    """The columns that fit ``width``: drop the columns not kept (``keep``, default the identifiers),
    those named in ``drop`` first and in that order, then the others right to left (a command lists its
    columns most valuable first), until the boxed table fits; if the kept ones alone do not, drop the
    box too (plain lines, ``plain``). Kept columns stay even when that overflows: the terminal wraps the
    line then, which still shows the whole identifier."""
    keep = IDENTIFIERS if keep is None else keep
    widths = natural_widths(columns, cells)
    shown = list(range(len(columns)))
    first = [columns.index(name) for name in drop if name in columns and name not in keep]
    rest = [i for i in reversed(shown) if columns[i] not in keep and i != 0 and i not in first]
    droppable = first + rest
    dropped: list[str] = []
    while boxed_width([widths[i] for i in shown]) > width and droppable:
        index = droppable.pop(0)
        shown.remove(index)
        dropped.append(columns[index])
    boxed = boxed_width([widths[i] for i in shown]) <= width
    return Layout(tuple(shown), boxed, tuple(reversed(dropped)))


def plain(columns: Sequence[str], cells: Sequence[Sequence[str]]) -> str:
    """Columns padded with spaces at their full width, one line per row (newlines in a cell become
    spaces: one row is one line for grep)."""
    flat = [[value.replace("\n", " ") for value in row] for row in cells]
    widths = natural_widths(columns, flat)
    lines = []
    for row in [list(columns), *flat]:
        padded = [value + " " * (widths[i] - cell_width(value)) for i, value in enumerate(row)]
        lines.append(GAP.join(padded).rstrip())
    return "\n".join(lines) + "\n"

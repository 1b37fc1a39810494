"""Rendering for the CLI: tables (rich), JSON, YAML and CSV, the backend marker, and progress.

Machine formats go to stdout and nothing else does; human notes (the sim marker, progress, warnings) go
to stderr, so `tpuctl ... -o json | jq` always sees clean JSON.
"""

from __future__ import annotations

import csv
import io
import json
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console
    from rich.status import Status

    from tpuctl.backends.base import BackendLabel
    from tpuctl.errors import TpuctlError


#: The width of a piped stdout: wide enough that no line is wrapped or cut.
PIPE_WIDTH = 100_000


@dataclass
class Output:
    """Where and how one command writes. ``fmt`` is table | json | yaml | csv."""

    fmt: str = "table"
    backend: str | None = None
    project: str | None = None
    _stdout: Console | None = field(default=None, repr=False)
    _stderr: Console | None = field(default=None, repr=False)

    @property
    def machine(self) -> bool:
        return self.fmt in ("json", "yaml", "csv")

    @property
    def out(self) -> Console:
        if self._stdout is None:
            from rich.console import Console

            console = Console(highlight=False, soft_wrap=True)
            if not console.is_terminal:
                # Piped: nothing is cut or wrapped at an assumed 80 columns; the reader decides.
                console.width = PIPE_WIDTH
            self._stdout = console
        return self._stdout

    @property
    def plain(self) -> bool:
        """stdout is not a terminal: tables are plain text at full width (see ``tpuctl.cli.tables``)."""
        return not self.out.is_terminal

    @property
    def err(self) -> Console:
        if self._stderr is None:
            from rich.console import Console

            self._stderr = Console(stderr=True, highlight=False, soft_wrap=True)
        return self._stderr

    # --- the backend marker -------------------------------------------------------------------------

    def backend_banner(self, label: BackendLabel, project: str, detail: str = "") -> None:
        """Say on every command which backend it talks to, with the marker the backend supplies (a yellow
        `sim` for the simulator); machine formats carry its name in the envelope instead."""
        self.backend = label.name
        self.project = project
        if self.machine:
            return
        headline = label.headline.format(project=project)
        self.err.print(f"[{label.style}] {label.name} [/] {headline}{detail}")

    def envelope(self, **data: Any) -> dict[str, Any]:
        """JSON/YAML documents always carry the backend and project first."""
        head = {"backend": self.backend, "project": self.project} if self.backend else {}
        return {**head, **data}

    # --- documents ----------------------------------------------------------------------------------

    def document(self, data: dict[str, Any]) -> None:
        """Write a machine document (json or yaml) to stdout."""
        if self.fmt == "yaml":
            import yaml

            sys.stdout.write(yaml.safe_dump(_plain(data), sort_keys=False))
        else:
            sys.stdout.write(_json_text(data) + "\n")
        sys.stdout.flush()

    def rows(
        self,
        title: str,
        columns: Sequence[str],
        rows: Iterable[Sequence[Any]],
        *,
        key: str,
        records: list[dict[str, Any]],
        extra: dict[str, Any] | None = None,
        keep: frozenset[str] | None = None,
        drop: Sequence[str] = (),
    ) -> None:
        """Render a list: a table (``tables``: identifiers whole, plain when piped), a CSV, or a JSON/YAML
        document ``{..., key: records}``. ``keep``: the headers never dropped (default: identifiers);
        ``drop``: the headers a narrow terminal loses first, in order (see ``tables.fit``)."""
        if self.fmt in ("json", "yaml"):
            self.document(self.envelope(**{key: records}, **(extra or {})))
            return
        if self.fmt == "csv":
            buf = io.StringIO()
            writer = csv.writer(buf, lineterminator="\n")
            writer.writerow(columns)
            for row in rows:
                writer.writerow(["" if v is None else v for v in row])
            sys.stdout.write(buf.getvalue())
            return
        cells = [["-" if v is None else str(v) for v in row] for row in rows]
        if not cells:
            self.out.print(f"{title}: none")
            return
        from tpuctl.cli import tables

        if self.plain:
            # A title that says more than the list's name ("by slice: the 50 costliest of 53") stays.
            sys.stdout.write(("" if title == key else f"{title}\n") + tables.plain(columns, cells))
            sys.stdout.flush()
            return
        self._table(title, columns, cells, keep, drop)

    def _table(
        self,
        title: str,
        columns: Sequence[str],
        cells: list[list[str]],
        keep: frozenset[str] | None,
        drop: Sequence[str],
    ) -> None:
        """A rich table that fits the terminal without cutting an identifier (``tables.fit``)."""
        from rich import box
        from rich.table import Table

        from tpuctl.cli import tables

        layout = tables.fit(columns, cells, self.out.width, keep, drop)
        shown = [columns[i] for i in layout.shown]
        rows = [[row[i] for i in layout.shown] for row in cells]
        if not layout.boxed:
            # Even the kept columns overflow: plain lines, which the terminal wraps; rich would cut.
            self.out.print(f"[italic]{_escape(title)}[/]")
            self.out.print(
                tables.plain(shown, rows), end="", markup=False, highlight=False, crop=False, soft_wrap=True
            )
        else:
            table = Table(title=title, title_justify="left", header_style="bold", box=box.SQUARE)
            for header in shown:
                whole = header in (tables.IDENTIFIERS if keep is None else keep)
                table.add_column(header, no_wrap=whole, overflow="fold")
            for row in rows:
                table.add_row(*map(_escape, row))
            self.out.print(table)
        if layout.dropped:
            self.err.print(
                f"[dim]({', '.join(layout.dropped)} not shown at {self.out.width} columns: "
                "a wider terminal, or -o csv / -o json, shows every column)[/]"
            )

    def fields(self, title: str, data: dict[str, Any]) -> None:
        """Render one object: key/value lines, or the JSON/YAML document."""
        if self.machine:
            self.document(self.envelope(**data))
            return
        from rich.table import Table

        table = Table(title=title, title_justify="left", show_header=False, box=None)
        table.add_column(style="bold")
        table.add_column()
        for key, value in data.items():
            if isinstance(value, dict):
                value = words(value) or None
            elif isinstance(value, list):
                value = ", ".join(human(v) for v in value) if value else None
            table.add_row(key, _escape(human(value)))
        self.out.print(table)

    def note(self, message: str) -> None:
        if not self.machine:
            self.err.print(message)

    def warn(self, message: str) -> None:
        self.err.print(f"[yellow]warning:[/] {message}")

    def error(self, exc: TpuctlError) -> None:
        """An error: a JSON document on stdout for machine formats, always a one-line message on stderr."""
        if self.fmt in ("json", "yaml"):
            self.document(self.envelope(**exc.to_dict()))
        line = f"[red]error:[/] {_escape(exc.message)}"
        if exc.fix:
            line += f"\n[dim]fix:[/] {_escape(exc.fix)}"
        self.err.print(line)

    @contextmanager
    def progress(self, description: str) -> Iterator[Progress]:
        """A spinner on stderr while something slow runs (not shown for machine formats)."""
        reporter = Progress(self, description)
        try:
            yield reporter
        finally:
            reporter.stop()


class Progress:
    """Implements ``tpuctl.cloud.base.OperationProgress`` with a rich status line on stderr."""

    def __init__(self, output: Output, description: str) -> None:
        self._output = output
        self._description = description
        self._status: Status | None = None
        self._started = time.monotonic()
        if not output.machine and output.err.is_terminal:
            self._status = output.err.status(description)
            self._status.start()

    def update(self, description: str, *, elapsed_s: float) -> None:
        if self._status is not None:
            self._status.update(f"{self._description}: {_escape(description)} ({elapsed_s:.1f} s)")

    def show(self, description: str) -> None:
        """Put ``description`` on the status line, started again if it was stopped (a run's next phase
        after its hosts had the screen); ``update`` then adds to it."""
        self._description = _escape(description)
        if self._status is not None:
            self._status.update(self._description)
        elif not self._output.machine and self._output.err.is_terminal:
            self._status = self._output.err.status(self._description)
            self._status.start()

    def stop(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None

    @property
    def shown(self) -> bool:
        """Whether the status line is on the terminal now."""
        return self._status is not None

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self._started


def human(value: Any) -> str:
    """A value for people: numbers without scientific notation or 16 digits, nothing as "-"."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        text = f"{value:.3f}".rstrip("0").rstrip(".")
        return text if text not in ("", "-0") else "0"
    return str(value)


def words(detail: dict[str, Any], prefix: str = "") -> str:
    """A record's facts as ``key=value`` words (nested ones as ``outer.key=value``), e.g. an event's
    detail in `pod describe`."""
    parts = []
    for key, value in detail.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            parts.append(words(value, f"{name}."))
        elif isinstance(value, (list, tuple)):
            parts.append(f"{name}={','.join(human(v) for v in value)}")
        else:
            text = human(value)
            parts.append(f"{name}={text!r}" if " " in text else f"{name}={text}")
    return " ".join(p for p in parts if p)


_BARS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float]) -> str:
    """``values`` as one line of block characters, lowest to highest."""
    low, high = min(values), max(values)
    span = high - low
    if span <= 0:
        return _BARS[len(_BARS) // 2] * len(values)
    return "".join(_BARS[min(len(_BARS) - 1, int((v - low) / span * len(_BARS)))] for v in values)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


#: A top-level list longer than this is written one compact item per line (see ``_json_text``).
_LONG_LIST = 1000


def _json_text(data: dict[str, Any]) -> str:
    """``data`` as indented JSON, fast for big documents (a cost report lists every slice: 229k groups).

    json's ``indent`` forces its pure-Python encoder, and ``_plain`` walked every value first: 45 s for
    that report. Here what json cannot encode goes through a ``default`` hook instead of a walk, and a
    long top-level list (the report's groups) is written with the C encoder, one item per line; the rest
    keeps its indentation."""
    long: dict[str, list[Any]] = {}
    head: dict[str, Any] = {}
    for key, value in data.items():
        if isinstance(value, list) and len(value) > _LONG_LIST:
            token = f"\x00long-{len(long)}\x00"  # no JSON string of ours holds a NUL
            long[token] = value
            head[key] = token
        else:
            head[key] = value
    try:
        text = json.dumps(head, indent=2, default=_json_default)
        encode = json.JSONEncoder(separators=(", ", ": "), default=_json_default).encode
        for token, items in long.items():
            lines = ",\n    ".join(map(encode, items))
            text = text.replace(json.dumps(token), f"[\n    {lines}\n  ]", 1)
    except TypeError:  # a dict key json will not take (an Enum that is not a str): convert it all
        return json.dumps(_plain(data), indent=2)
    return text


def _json_default(value: Any) -> Any:
    plain = _plain(value)
    if plain is value:
        raise TypeError(f"{type(value).__name__} is not JSON serializable")
    return plain


def _plain(value: Any) -> Any:
    """Make a value JSON/YAML-safe: enums to values, paths and datetimes to strings."""
    from datetime import datetime
    from enum import Enum
    from pathlib import Path

    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    return value

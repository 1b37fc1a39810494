"""The dashboard's charts as SVG, drawn on the server: a run's timeline, a series over steps, bars per day.

Every mark carries ``data-mark`` (segment, preemption, point, bar) and the facts it stands for as
``data-*`` attributes, so what is drawn can be checked without reading pixels. Text is escaped with
markupsafe (Jinja2's own escaping) and the result is ``Markup``: a template inserts it as is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from markupsafe import Markup, escape

WIDTH: Final = 760
#: Colours of a run's segment kinds (the CLI's timeline letters, as colours).
SEGMENT_COLOURS: Final = {
    "provisioning": "#9aa5b1",
    "running": "#2f855a",
    "checkpointing": "#3182ce",
    "preempted": "#c53030",
    "recovering": "#dd6b20",
}
#: Colours the stacked bars cycle through, one per group.
GROUP_COLOURS: Final = ("#2b6cb0", "#38a169", "#d69e2e", "#805ad5", "#e53e3e", "#319795", "#718096")
#: A part of a stacked bar whose group has no colour of its own (the groups a page does not list).
OTHER_COLOUR: Final = "#a0aec0"


@dataclass(frozen=True)
class Span:
    """A segment of a run on the timeline: its kind and its start and end (epoch seconds)."""

    kind: str
    start: float
    end: float


@dataclass(frozen=True)
class Mark:
    """A preemption on the timeline: when it was detected (epoch seconds), its number, its kind and the
    last step the program reported before it (None: not known)."""

    at: float
    number: int
    kind: str
    step: int | None = None
    detection_latency_s: float | None = None  # `runs describe`'s, for this preemption
    recovery_s: float | None = None


def _attrs(values: Mapping[str, object]) -> str:
    return " ".join(f'{name}="{escape(str(value))}"' for name, value in values.items() if value is not None)


def _svg(height: int, label: str, body: list[str]) -> Markup:
    head = f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" '
    head += f'height="{height}" role="img" aria-label="{escape(label)}">'
    return Markup(head + "".join(body) + "</svg>")


def timeline(spans: Sequence[Span], marks: Sequence[Mark]) -> Markup:
    """The run's segments to scale, left to right from its first start to its last end, and a mark at
    each preemption with its kind."""
    if not spans:
        return _svg(24, "no segments recorded", ['<text x="0" y="16">no segments recorded</text>'])
    first = min(s.start for s in spans)
    last = max(max(s.end for s in spans), *(m.at for m in marks)) if marks else max(s.end for s in spans)
    scale = WIDTH / max(last - first, 1e-9)
    body = []
    for span in spans:
        x, w = (span.start - first) * scale, max((span.end - span.start) * scale, 1.0)
        facts: dict[str, object] = {
            "data-mark": "segment",
            "data-kind": span.kind,
            "data-duration-s": f"{span.end - span.start:.3f}",
        }
        body.append(
            f'<rect {_attrs(facts)} x="{x:.2f}" y="8" width="{w:.2f}" height="28" '
            f'fill="{SEGMENT_COLOURS.get(span.kind, "#a0aec0")}">'
            f"<title>{escape(span.kind)}, {span.end - span.start:.1f} s</title></rect>"
        )
    for mark in marks:
        x = (mark.at - first) * scale
        facts = {
            "data-mark": "preemption",
            "data-kind": mark.kind,
            "data-number": mark.number,
            "data-step": mark.step,
            "data-detection-latency-s": mark.detection_latency_s,
            "data-recovery-s": mark.recovery_s,
        }
        body.append(
            f'<g {_attrs(facts)}><line x1="{x:.2f}" y1="2" x2="{x:.2f}" y2="44" stroke="#1a202c" '
            f'stroke-width="2"/><text x="{x + 3:.2f}" y="56" font-size="11">#{mark.number} '
            f"{escape(mark.kind)}</text><title>preemption {mark.number}: {escape(mark.kind)}"
            f"{_seconds(', detected after', mark.detection_latency_s)}"
            f"{_seconds(', recovered in', mark.recovery_s)}</title></g>"
        )
    return _svg(62, "the run's timeline", body)


def series(values: Sequence[float], *, name: str, unit: str) -> Markup:
    """``values`` over steps as a line with a point per value (``data-index`` = the value's place in the
    series)."""
    if not values:
        return _svg(24, f"no {name} reported", [f'<text x="0" y="16">no {escape(name)} reported</text>'])
    height, pad = 120, 6
    low, high = min(values), max(values)
    span = high - low or 1.0
    step = (WIDTH - 2 * pad) / max(len(values) - 1, 1)
    points = [(pad + i * step, pad + (high - v) / span * (height - 2 * pad)) for i, v in enumerate(values)]
    body = [
        f'<polyline fill="none" stroke="#2b6cb0" stroke-width="1.5" '
        f'points="{" ".join(f"{x:.2f},{y:.2f}" for x, y in points)}"/>'
    ]
    for i, ((x, y), v) in enumerate(zip(points, values, strict=True)):
        facts: dict[str, object] = {
            "data-mark": "point",
            "data-series": name,
            "data-index": i,
            "data-value": f"{v:g}",
        }
        body.append(
            f'<circle {_attrs(facts)} cx="{x:.2f}" cy="{y:.2f}" r="2" fill="#2b6cb0">'
            f"<title>{escape(name)} {v:g} {escape(unit)}</title></circle>"
        )
    return _svg(height, f"{name} over steps", body)


@dataclass(frozen=True)
class DayStack:
    """One day's bar: the day (YYYY-MM-DD) and each group's USD that day, in drawing order."""

    day: str
    parts: tuple[tuple[str, float], ...]


def stacked_bars(days: Sequence[DayStack], groups: Sequence[str]) -> Markup:
    """A bar per day, stacked by group (``groups`` fixes each group's colour), heights to one scale."""
    if not days:
        return _svg(24, "nothing billed", ['<text x="0" y="16">nothing billed in this window</text>'])
    height, base = 180, 160
    top = max(sum(usd for _, usd in d.parts) for d in days) or 1.0
    slot = min(WIDTH / len(days), 48.0)  # a few days must not make bars as wide as the chart
    colour = {g: GROUP_COLOURS[i % len(GROUP_COLOURS)] for i, g in enumerate(groups)}
    body = []
    for i, day in enumerate(days):
        y = float(base)
        for group, usd in day.parts:
            h = usd / top * (base - 8)
            y -= h
            facts = {"data-mark": "bar", "data-day": day.day, "data-group": group, "data-usd": f"{usd:.6f}"}
            body.append(
                f'<rect {_attrs(facts)} x="{i * slot + 2:.2f}" y="{y:.2f}" width="{max(slot - 4, 1):.2f}" '
                f'height="{h:.2f}" fill="{colour.get(group, OTHER_COLOUR)}">'
                f"<title>{escape(day.day)} {escape(group)}: {usd:.2f} USD</title></rect>"
            )
        body.append(
            f'<text x="{i * slot + 2:.2f}" y="{base + 14}" font-size="10">{escape(day.day[5:])}</text>'
        )
    return _svg(height, "cost per day", body)


def _seconds(what: str, value: float | None) -> str:
    return "" if value is None else f"{what} {value:g} s"


def cost_split(productive_usd: float | None, wasted_usd: float | None) -> Markup:
    """One bar: a run's productive USD, then its wasted USD, to one scale (``data-part`` says which)."""
    if productive_usd is None or wasted_usd is None:
        return _svg(24, "nothing billed", ['<text x="0" y="16">nothing billed yet</text>'])
    whole = productive_usd + wasted_usd or 1.0
    body, x = [], 0.0
    for part, usd, colour in (("productive", productive_usd, "#2f855a"), ("wasted", wasted_usd, "#c53030")):
        w = max(usd, 0.0) / whole * WIDTH
        facts = {"data-mark": "cost-part", "data-part": part, "data-usd": f"{usd:.6f}"}
        body.append(
            f'<rect {_attrs(facts)} x="{x:.2f}" y="4" width="{w:.2f}" height="22" fill="{colour}">'
            f"<title>{part}: {usd:.2f} USD</title></rect>"
        )
        x += w
    return _svg(30, "cost so far: productive and wasted", body)


def ranked_bars(items: Sequence[tuple[str, float]]) -> Markup:
    """A horizontal bar per item (``data-key``, ``data-usd``), longest first as given, to one scale."""
    if not items:
        return _svg(24, "nothing wasted", ['<text x="0" y="16">no run wasted anything in this window</text>'])
    row, label = 20, 220
    top = max(usd for _, usd in items) or 1.0
    body = []
    for i, (key, usd) in enumerate(items):
        w = max(usd / top * (WIDTH - label - 80), 1.0)
        facts = {"data-mark": "waste-bar", "data-key": key, "data-usd": f"{usd:.6f}"}
        body.append(
            f'<text x="0" y="{i * row + 14}" font-size="11">{escape(key)}</text>'
            f'<rect {_attrs(facts)} x="{label}" y="{i * row + 3}" width="{w:.2f}" height="{row - 6}" '
            f'fill="#c53030"><title>{escape(key)}: {usd:.2f} USD wasted</title></rect>'
            f'<text x="{label + w + 4:.2f}" y="{i * row + 14}" font-size="11">{usd:,.2f}</text>'
        )
    return _svg(len(items) * row + 4, "runs by wasted USD", body)


def burn_down(
    spent_by_day: Sequence[tuple[str, float]], budget_usd: float, projected_usd: float, days_in_month: int
) -> Markup:
    """A month's budget burning down: what is left at the end of each day so far (``data-mark="left"``),
    and a dashed line from today's remainder to the month's end at the month's rate so far
    (``data-mark="projection"``); below zero is drawn below the axis."""
    height, base, pad = 160, 130, 6
    low = min(0.0, budget_usd - projected_usd, *(budget_usd - s for _, s in spent_by_day))
    span = (budget_usd - low) or 1.0
    step = (WIDTH - 2 * pad) / max(days_in_month, 1)

    def y(left: float) -> float:
        return pad + (budget_usd - left) / span * (base - pad)

    zero = y(0.0)
    body = [f'<line x1="0" y1="{zero:.2f}" x2="{WIDTH}" y2="{zero:.2f}" stroke="#a0aec0"/>']
    for i, (day, spent) in enumerate(spent_by_day):
        left = budget_usd - spent
        facts = {
            "data-mark": "left",
            "data-day": day,
            "data-spent-usd": f"{spent:.6f}",
            "data-left-usd": f"{left:.6f}",
        }
        body.append(
            f'<circle {_attrs(facts)} cx="{pad + (i + 1) * step:.2f}" cy="{y(left):.2f}" r="3" '
            f'fill="#2b6cb0">'
            f"<title>{escape(day)}: {left:,.2f} USD left</title></circle>"
        )
    now_x = pad + len(spent_by_day) * step
    now_left = budget_usd - (spent_by_day[-1][1] if spent_by_day else 0.0)
    facts = {"data-mark": "projection", "data-projected-usd": f"{projected_usd:.2f}",
             "data-left-usd": f"{budget_usd - projected_usd:.2f}"}  # fmt: skip
    body.append(
        f'<line {_attrs(facts)} x1="{now_x:.2f}" y1="{y(now_left):.2f}" '
        f'x2="{pad + days_in_month * step:.2f}" '
        f'y2="{y(budget_usd - projected_usd):.2f}" stroke="#dd6b20" stroke-dasharray="4 3" stroke-width="2">'
        f"<title>projected: {projected_usd:,.2f} USD spent by the month's end</title></line>"
    )
    return _svg(height, "the month's budget burning down", body)

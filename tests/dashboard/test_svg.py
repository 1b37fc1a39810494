"""The charts' drawing, without a browser: marks to scale, with the facts they stand for."""

from __future__ import annotations

import re

from tpuctl.dashboard import svg


def _marks(markup: str, mark: str) -> list[dict[str, str]]:
    tags = re.findall(rf'<\w+ [^>]*data-mark="{mark}"[^>]*>', markup)
    return [dict(re.findall(r'([\w-]+)="([^"]*)"', tag)) for tag in tags]


def test_the_timeline_draws_segments_to_scale_and_a_mark_per_preemption_with_its_kind() -> None:
    spans = [
        svg.Span("running", 0.0, 300.0),
        svg.Span("preempted", 300.0, 380.0),
        svg.Span("running", 380.0, 760.0),
    ]
    drawn = str(svg.timeline(spans, [svg.Mark(300.0, 1, "notice"), svg.Mark(380.0, 2, "hard")]))
    segments = _marks(drawn, "segment")
    assert [(s["data-kind"], float(s["x"]), float(s["width"])) for s in segments] == [
        ("running", 0.0, 300.0),  # 760 s over 760 px: one pixel a second
        ("preempted", 300.0, 80.0),
        ("running", 380.0, 380.0),
    ]
    assert [s["data-duration-s"] for s in segments] == ["300.000", "80.000", "380.000"]
    marks = _marks(drawn, "preemption")
    assert [(m["data-number"], m["data-kind"]) for m in marks] == [("1", "notice"), ("2", "hard")]
    assert re.findall(r'<line x1="([\d.]+)"', drawn) == ["300.00", "380.00"]


def test_text_in_a_chart_is_escaped() -> None:
    drawn = str(svg.timeline([svg.Span('<script>"', 0.0, 1.0)], []))
    assert "<script>" not in drawn and "&lt;script&gt;&#34;" in drawn


def test_a_series_has_a_point_per_value_highest_at_the_top() -> None:
    drawn = str(svg.series([3.0, 2.0, 1.0], name="loss", unit=""))
    points = _marks(drawn, "point")
    assert [(p["data-index"], p["data-value"]) for p in points] == [("0", "3"), ("1", "2"), ("2", "1")]
    heights = [float(p["cy"]) for p in points]
    assert heights == sorted(heights)  # y grows downwards: the first (highest) value is on top


def test_bars_stack_each_days_groups_to_one_scale() -> None:
    days = [
        svg.DayStack("2026-11-01", (("v4-8", 3.0), ("v5e-8", 1.0))),
        svg.DayStack("2026-11-02", (("v4-8", 2.0),)),
    ]
    drawn = str(svg.stacked_bars(days, ["v4-8", "v5e-8"]))
    bars = _marks(drawn, "bar")
    assert [(b["data-day"], b["data-group"], float(b["data-usd"])) for b in bars] == [
        ("2026-11-01", "v4-8", 3.0),
        ("2026-11-01", "v5e-8", 1.0),
        ("2026-11-02", "v4-8", 2.0),
    ]
    first, second, third = (float(b["height"]) for b in bars)
    assert first == 3 * second and abs(first + second - 152) < 1e-6  # the tallest day fills the chart
    assert third == 2 * second


def test_empty_charts_say_so() -> None:
    assert "no segments recorded" in svg.timeline([], [])
    assert "no loss reported" in svg.series([], name="loss", unit="")
    assert "nothing billed" in svg.stacked_bars([], [])

"""Plotly figures of the dashboards: delta sparsity heatmap, sync timeline, learning and payload curves.

Pure functions from data to a ``plotly.graph_objects.Figure`` (``gr.Plot`` shows them). Each takes
plain values or small dataclasses, never a service, so the rollout and trainer UIs share them and
tests build them from real headers. An empty input gives a figure that says so, never an error.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .smoothing import SMOOTHING, ema
from .sparsity import SparsityGrid

HEIGHT = 320
#: Characters of a title line (of a `<sup>` subtitle line): what a chart 290 px wide, a phone's (390 px), shows whole.
#: plotly draws each line of a title as it is, never wrapped: a longer one was cut at both ends.
TITLE_CHARS = 34
SUB_CHARS = 50
#: Height of a title line and of a subtitle line, in pixels (measured in chromium, plotly_white's fonts).
_TITLE_LINE_PX = 21
_SUB_LINE_PX = 17
#: Room above a title's first line, in pixels.
_TITLE_TOP_PX = 10
_MARGIN = {"l": 60, "r": 20, "t": 50, "b": 50}
#: Room under the plot for the x ticks, the x axis title and a legend of one or two rows (`_LEGEND_BELOW`).
_MARGIN_LEGEND = {**_MARGIN, "b": 110}
#: A horizontal legend at the very bottom of the figure (container coordinates), below the x axis title: placed
#: in plot coordinates (y = -0.25) it ran into that title, and into the ticks when the panel was narrow.
_LEGEND_BELOW = {"orientation": "h", "yref": "container", "y": 0.01, "yanchor": "bottom", "x": 0, "xanchor": "left"}
#: The toolbar plotly shows on hover, cut to what helps on these small figures (zoom, reset, save as PNG): with
#: every button it covered the right half of a title.
_MODEBAR = {
    "remove": [
        "pan",
        "select",
        "lasso",
        "zoomin",
        "zoomout",
        "autoscale",
        "togglespikelines",
        "hoverclosest",
        "hovercompare",
    ]
}
#: White for "nothing changed", to dark blue for "everything changed", on the heatmap's fixed log axis.
_SCALE = [[0.0, "#f7fbff"], [0.2, "#deebf7"], [0.4, "#9ecae1"], [0.6, "#4292c6"], [0.8, "#2171b5"], [1.0, "#08306b"]]
#: The heatmap's fixed colour range: log10 of the density, 0.001 % (and less, and nothing) to 100 %. Fixed,
#: so a colour means the same density in every version's heatmap.
_DENSITY_DECADES = (-5, 0)
#: Pixels a heatmap column label of one character takes upright (font size 11): the height its labels add.
_LABEL_PX = 6


class SyncLike(Protocol):
    """What the timeline reads from one sync (``rollout_space.service.SyncRecord`` has it)."""

    @property
    def version(self) -> int: ...
    @property
    def via(self) -> str: ...
    @property
    def bytes_fetched(self) -> int: ...
    @property
    def fetch_s(self) -> float: ...
    @property
    def pause_s(self) -> float: ...


@dataclass(frozen=True)
class Series:
    """One named line: ``y[i]`` at ``x[i]``; ``None`` values leave a gap."""

    name: str
    x: Sequence[float]
    y: Sequence[float | None]
    dash: str | None = None
    mode: str = "lines+markers"


def wrap_title(text: str) -> str:
    """`text` (lines split by plotly's `<br>`, a line in `<sup>` a subtitle) in lines of at most `TITLE_CHARS`
    characters (a subtitle's `SUB_CHARS`), cut at spaces."""
    lines = []
    for part in text.split("<br>"):
        sub = part.startswith("<sup>") and part.endswith("</sup>")
        inner = part[len("<sup>") : -len("</sup>")] if sub else part
        for line in textwrap.wrap(inner, SUB_CHARS if sub else TITLE_CHARS, break_on_hyphens=False) or [""]:
            lines.append(f"<sup>{line}</sup>" if sub else line)
    return "<br>".join(lines)


def fit_title(fig: go.Figure) -> go.Figure:
    """Wrap `fig`'s title (`wrap_title`) and make room for its lines above the plot, the figure growing by as much
    as the room above it, so the plot keeps its height. Returns `fig`.

    plotly places a title by its first line alone (by default its baseline in the middle of the top margin; anchored
    at the top or the bottom, the other lines run past the anchor), so the title is pinned a few pixels below the
    figure's top, in pixels worked out from the figure's height, and the lines run down from there."""
    text = fig.layout.title.text
    if not text:
        return fig
    wrapped = wrap_title(text)
    lines = sum(_SUB_LINE_PX if line.startswith("<sup>") else _TITLE_LINE_PX for line in wrapped.split("<br>"))
    if any(a.yanchor == "bottom" and (a.y or 0) >= 0.999 for a in fig.layout.annotations):
        lines += _TITLE_LINE_PX  # the top panel's own title, above it (subplots): the figure's must clear it
    top = fig.layout.margin.t if fig.layout.margin.t is not None else _MARGIN["t"]
    grown = max(0, _TITLE_TOP_PX + lines + 6 - top)
    height = (fig.layout.height or HEIGHT) + grown
    # Measured in chromium: anchored at the top, a title of one line starts 3 px above its anchor, one of several
    # lines 15 px above it (whatever the anchor), so the anchor goes that much lower.
    below = 15 if "<br>" in wrapped else 3
    pinned = {"text": wrapped, "yref": "container", "yanchor": "top", "y": 1 - (_TITLE_TOP_PX + below) / height}
    fig.update_layout(title=pinned, margin={"t": top + grown}, height=height)
    return fig


def _empty(title: str, message: str) -> go.Figure:
    fig = go.Figure()
    fig.add_annotation(
        text="<br>".join(textwrap.wrap(message, SUB_CHARS)),  # an annotation is not wrapped either
        showarrow=False,
        font={"size": 14, "color": "#787c7e"},
        xref="paper",
        yref="paper",
        x=0.5,
        y=0.5,
    )
    fig.update_layout(
        title=title,
        height=HEIGHT,
        margin=_MARGIN,
        xaxis={"visible": False},
        yaxis={"visible": False},
        template="plotly_white",
        modebar=_MODEBAR,
    )
    return fit_title(fig)


def sparsity_heatmap(grid: SparsityGrid | None, title: str | None = None, side: str = "applied here") -> go.Figure:
    """Layers (rows) x tensor kinds (columns), coloured by the fraction of elements that changed.

    The colour scale is fixed and logarithmic (0.001 % or less is white, 100 % dark blue; ``z`` holds the
    densities, the colours their log), so colours compare across versions: a scale that re-ranged to
    each delta's densest cell would paint a 0.5 % delta as dark as a 50 % one. Hover shows
    ``changed / elements`` and the tensor count. A (layer, kind) without tensors is a gap; one whose
    tensors did not change is 0 (white).

    Args:
        grid: ``dashboard.sparsity(header, names)``; None draws an empty "no delta yet" figure.
        title: Defaults to the delta's versions, what it is on this page (`side`), and on a second line its
            overall density.
        side: What the delta is on the page that draws it: "applied here" (a reader: the last delta it
            applied), "published" (the trainer: the last delta it committed to the bucket).
    """
    if grid is None:
        return _empty(title or "Delta sparsity", f"No delta {side} yet")
    if not grid.cells:  # a version in which no element changed (every game of its step was dropped, say)
        return _empty(
            title or f"Delta v{grid.base_version}→v{grid.version} {side}",
            "No element changed: the step's update was zero (each group's games scored alike, so GRPO saw no "
            "advantage, or every game was dropped)",
        )
    if title is None:
        title = (
            f"Delta v{grid.base_version}→v{grid.version} {side}<br><sup>{grid.changed:,} of {grid.total:,} "
            f"elements changed ({100 * grid.density:.3g}%)</sup>"
        )
    z, text = [], []
    for row in grid.rows:
        z_row, text_row = [], []
        for kind in grid.kinds:
            cell = grid.cell(row, kind)
            z_row.append(None if cell is None else cell.density)
            text_row.append(
                ""
                if cell is None
                else f"{row} · {kind}<br>{cell.changed:,} of {cell.numel:,} changed "
                f"({100 * cell.density:.3g}%)<br>{cell.tensors} tensor{'s' * (cell.tensors != 1)}"
            )
        z.append(z_row)
        text.append(text_row)
    low, high = _DENSITY_DECADES
    colour = [[None if d is None else max(low, math.log10(d)) if d > 0 else low for d in row] for row in z]
    decades = list(range(low, high + 1))
    fig = go.Figure(
        go.Heatmap(
            z=colour,
            customdata=z,
            x=list(grid.kinds),
            y=list(grid.rows),
            text=text,
            hoverinfo="text",
            hoverongaps=False,
            colorscale=_SCALE,
            zmin=low,
            zmax=high,
            xgap=1,
            ygap=1,
            colorbar={
                "title": {"text": "density<br>(fixed scale)", "font": {"size": 11}},
                "tickvals": decades,
                "thickness": 12,
                "tickfont": {"size": 10},
                "ticktext": [f"{'≤' if d == low else ''}{10.0 ** (d + 2):g}%" for d in decades],
            },
        )
    )
    # Column labels upright (read bottom to top): a column on a phone (390 px) is ~15 px wide, so any slanted label
    # longer than that runs into its neighbours'. The margin below grows to the longest label (`automargin`), the
    # figure with it, so the grid keeps its height.
    longest = max(len(k) for k in grid.kinds)
    fig.update_layout(
        title=title,
        height=max(HEIGHT, 60 + 18 * len(grid.rows)) + _LABEL_PX * longest,
        margin={**_MARGIN, "t": 60},
        template="plotly_white",
        yaxis={"autorange": "reversed", "type": "category"},
        xaxis={"type": "category", "tickangle": -90, "tickfont": {"size": 11}, "automargin": True},
        modebar=_MODEBAR,
    )
    return fit_title(fig)


def size_text(n: float) -> str:
    """Bytes for a person: "269 MB", "1.1 MB", "880 B" (decimal units, as file sizes are shown)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n:.0f} B"


def sync_timeline(syncs: Sequence[SyncLike], title: str = "Weight syncs") -> go.Figure:
    """Per version applied: bytes fetched (bars, log axis), fetch time and apply pause (lines, ms).

    Anchors (full copies) and deltas are separate series in their own colours, each bar labelled with
    its size: on a linear axis the first full copy (hundreds of MB) would flatten every later delta
    (about 1 MB) to nothing.

    Args:
        syncs: Oldest first (``RolloutService.syncs()``); ``via`` is ``anchor`` or ``delta``.
    """
    if not syncs:
        return _empty(title, "No sync yet")
    versions = [s.version for s in syncs]
    fig = make_subplots(specs=[[{"secondary_y": True}]])
    for via, name, color, angle in (("anchor", "anchor (full copy)", "#08306b", 0), ("delta", "delta", "#6baed6", -90)):
        shown = [s for s in syncs if (s.via == "anchor") == (via == "anchor")]
        if not shown:
            continue
        fig.add_trace(
            go.Bar(
                x=[s.version for s in shown],
                y=[max(1, s.bytes_fetched) for s in shown],
                name=name,
                width=0.7,
                marker_color=color,
                text=[size_text(s.bytes_fetched) for s in shown],
                textposition="outside",
                textangle=angle,
                textfont={"size": 11},
                constraintext="none",
                cliponaxis=False,
                hovertemplate=f"v%{{x}} {name}: %{{text}}<extra></extra>",
            ),
            secondary_y=False,
        )
    for label, values, color in (
        ("fetch (ms)", [1000 * s.fetch_s for s in syncs], "#4292c6"),
        ("apply pause (ms)", [1000 * s.pause_s for s in syncs], "#e6550d"),
    ):
        fig.add_trace(
            go.Scatter(
                x=versions,
                y=values,
                name=label,
                mode="lines+markers",
                line={"color": color},
                hovertemplate=f"v%{{x}}: %{{y:.1f}} ms<extra>{label}</extra>",
            ),
            secondary_y=True,
        )
    fig.update_layout(
        title=title,
        height=HEIGHT + 60,
        margin=_MARGIN_LEGEND,
        template="plotly_white",
        legend=_LEGEND_BELOW,
        bargap=0.3,
        barmode="overlay",
        modebar=_MODEBAR,
    )
    fig.update_xaxes(title_text="version", range=[min(versions) - 0.6, max(versions) + 0.6], **_whole_ticks(versions))
    sizes = [max(1, s.bytes_fetched) for s in syncs]  # a decade below the smallest: bars of like size look alike
    bottom, top = math.floor(math.log10(min(sizes))) - 1, math.log10(max(sizes)) + 1.2  # room for the label above
    fig.update_yaxes(
        title_text="bytes (log)", type="log", secondary_y=False, range=[bottom, top], **_byte_decades(bottom, top)
    )
    fig.update_yaxes(title_text="ms", rangemode="tozero", showgrid=False, tickmode="auto", nticks=5, secondary_y=True)
    return fit_title(fig)


def _byte_decades(bottom: float, top: float) -> dict[str, Any]:
    """Log-axis settings for bytes between 10**bottom and 10**top: one tick per decade, labelled in bytes
    ("1 kB", "10 MB"), instead of plotly's minor "2 5 2 5" labels; ticks at 1, 2 and 5 of each decade where
    the range holds fewer than two decades (one version: a point with no scale otherwise)."""
    ticks = [10**k for k in range(math.ceil(bottom), math.floor(top) + 1)]
    if len(ticks) < 2:
        ticks = [
            m * 10**k
            for k in range(math.floor(bottom), math.ceil(top) + 1)
            for m in (1, 2, 5)
            if bottom <= math.log10(m * 10**k) <= top
        ]
    return {"tickvals": ticks, "ticktext": [size_text(t) for t in ticks]}


def _whole_ticks(x: Sequence[float]) -> dict[str, Any]:
    """x-axis settings for counts (steps, versions): ticks on whole numbers only (no "step 1.5"), ~10 at most."""
    span = max(x) - min(x) if len(x) else 0
    return {"tickformat": "d", "dtick": max(1, math.ceil(span / 10))}


def line_curves(
    series: Sequence[Series],
    title: str,
    x_title: str = "step",
    y_title: str = "",
    log_y: bool = False,
    y_range: tuple[float, float] | None = None,
    whole_x: bool = False,
) -> go.Figure:
    """Named lines on one axis: the building block of the training curves. `whole_x`: x counts steps or
    versions, ticked on whole numbers."""
    if not any(len(s.x) for s in series):
        return _empty(title, "No data yet")
    fig = go.Figure()
    for s in series:
        fig.add_trace(
            go.Scatter(
                x=list(s.x),
                y=list(s.y),
                name=s.name,
                mode=s.mode,
                line={"dash": s.dash} if s.dash else None,
                connectgaps=False,
            )
        )
    fig.update_layout(
        title=title,
        height=HEIGHT + 60,
        margin=_MARGIN_LEGEND,
        template="plotly_white",
        legend=_LEGEND_BELOW,
        showlegend=True,
        modebar=_MODEBAR,
    )
    xs = [v for s in series for v in s.x]
    fig.update_xaxes(title_text=x_title, **(_whole_ticks(xs) if whole_x else {}))
    if whole_x and len(set(xs)) == 1:  # one step or version: centred, not at the edge of a 0-2 axis
        fig.update_xaxes(range=[xs[0] - 0.6, xs[0] + 0.6])
    fig.update_yaxes(title_text=y_title, type="log" if log_y else "linear", range=y_range)
    return fit_title(fig)


@dataclass(frozen=True)
class Metric:
    """One panel of :func:`learning_curves`: a value per point of the x axis (None: no value), and a `reference` line
    drawn beside it as it is (what the values should scatter around), if any."""

    name: str
    values: Sequence[float | None]
    y_range: tuple[float, float] | None = None
    reference: Series | None = None


def learning_curves(
    x: Sequence[float],
    metrics: Sequence[Metric],
    x_title: str = "step",
    title: str = "Is it learning?",
    smoothing: float = SMOOTHING,
    whole_x: bool = True,
) -> go.Figure:
    """One panel per metric, sharing the x axis: each step as a faint point and its exponential
    moving average (``dashboard.smoothing.ema`` with weight ``smoothing``) as a line. `whole_x`: x counts
    steps, ticked on whole numbers (False for time)."""
    if not len(x):
        return _empty(title, "No training step yet")
    fig = make_subplots(
        rows=len(metrics), cols=1, shared_xaxes=True, vertical_spacing=0.08, subplot_titles=[m.name for m in metrics]
    )
    for row, m in enumerate(metrics, start=1):
        fig.add_trace(
            go.Scatter(
                x=list(x),
                y=list(m.values),
                name="each step",
                mode="markers",
                marker={"color": "#9ecae1", "size": 6},
                showlegend=row == 1,
                legendgroup="raw",
                hovertemplate=f"%{{y:.3f}}<extra>{m.name}</extra>",
            ),
            row=row,
            col=1,
        )
        fig.add_trace(
            go.Scatter(
                x=list(x),
                y=ema(m.values, smoothing),
                name=f"smoothed (EMA {smoothing})",
                mode="lines",
                line={"color": "#08306b", "width": 2},
                connectgaps=True,
                showlegend=row == 1,
                legendgroup="ema",
                hovertemplate=f"%{{y:.3f}}<extra>{m.name}, smoothed</extra>",
            ),
            row=row,
            col=1,
        )
        if m.reference is not None:
            fig.add_trace(
                go.Scatter(
                    x=list(m.reference.x),
                    y=list(m.reference.y),
                    name=m.reference.name,
                    mode="lines",
                    line={"color": "#e6550d", "dash": m.reference.dash},
                    connectgaps=True,
                    hovertemplate=f"%{{y:.3f}}<extra>{m.reference.name}</extra>",
                ),
                row=row,
                col=1,
            )
        # 3 significant digits: a constant series gets one tick at its exact value otherwise ("-0.20624999701976776")
        fig.update_yaxes(range=m.y_range, tickformat=".3~g", row=row, col=1)
    fig.update_layout(
        title=title,
        height=HEIGHT + 60 + 140 * (len(metrics) - 1),
        margin=_MARGIN_LEGEND,
        template="plotly_white",
        legend=_LEGEND_BELOW,
        modebar=_MODEBAR,
    )
    fig.update_xaxes(title_text=x_title, row=len(metrics), col=1)
    if whole_x:
        fig.update_xaxes(**_whole_ticks(x))
    return fit_title(fig)


def payload_curves(
    steps: Sequence[float],
    codec_bytes: Sequence[float | None],
    raw_bytes: Sequence[float | None] | None = None,
    dense_bytes: float | None = None,
    codec: str = "default codec",
    title: str = "Bytes published per step",
    x_title: str = "version",
    anchors: Sequence[tuple[int, int]] = (),
    dense: str = "dense model",
) -> go.Figure:
    """Bytes per published version: the codec in use, the ``raw`` (TRL layout) size of the same delta
    and the dense model as a flat line, on a log axis (they differ by orders of magnitude). `anchors`
    ((version, bytes) of full copies, such as version 1, which has no delta) are their own series, so
    the first version shows here as it does in the rollout's sync timeline. `dense` names the flat line (a LoRA
    adapter run's whole state is the adapter, not the model)."""
    series = [Series(codec, steps, codec_bytes)]
    if anchors:
        series.append(Series("anchor (full copy)", [v for v, _ in anchors], [b for _, b in anchors], mode="markers"))
    if raw_bytes is not None:
        series.append(Series("raw (int32 + values)", steps, raw_bytes, dash="dash"))
    if dense_bytes is not None:
        series.append(Series(dense, steps, [dense_bytes] * len(steps), dash="dot"))
    fig = line_curves(series, title, x_title, "bytes", log_y=True, whole_x=True)
    sizes = [y for s in series for y in s.y if y]
    if sizes:
        bottom, top = math.log10(min(sizes)) - 0.3, math.log10(max(sizes)) + 0.3
        fig.update_yaxes(range=[bottom, top], **_byte_decades(bottom, top))
    return fig

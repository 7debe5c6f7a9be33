"""dashboard.figures: the plotly figures hold the numbers they claim, from real delta headers."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from dashboard import NON_LAYER_ROW, sparsity
from dashboard.figures import (
    Metric,
    Series,
    learning_curves,
    line_curves,
    payload_curves,
    sparsity_heatmap,
    sync_timeline,
)

from ._dashboard_states import changed_copy, header_of, qwen3_state


@dataclass(frozen=True)
class Sync:
    """The fields of ``rollout_space.follower.SyncRecord`` the timeline reads."""

    version: int
    via: str
    bytes_fetched: int
    fetch_s: float
    pause_s: float


def _message(fig) -> str:
    return fig.layout.annotations[0].text.replace("<br>", " ")  # wrapped for a phone


def test_heatmap_cells_and_hover_from_a_real_delta() -> None:
    old = qwen3_state()
    new = changed_copy(old, {"model.layers.1.self_attn.v_proj.weight": 8, "model.embed_tokens.weight": 3})
    grid = sparsity(header_of(old, new, version=7), {n: t.shape for n, t in old.items()})
    fig = sparsity_heatmap(grid)

    (heat,) = fig.data
    assert heat.type == "heatmap"
    assert list(heat.y) == list(grid.rows) and list(heat.x) == list(grid.kinds)
    z = {(r, k): heat.customdata[i][j] for i, r in enumerate(heat.y) for j, k in enumerate(heat.x)}
    assert z["layer 1", "v_proj"] == 0.25
    assert z["layer 0", "v_proj"] == 0.0
    assert z[NON_LAYER_ROW, "embed_tokens"] == 3 / 256
    assert z["layer 0", "lm_head"] is None  # no such tensor: a gap, not a zero
    hover = heat.text[list(heat.y).index("layer 1")][list(heat.x).index("v_proj")]
    assert hover == "layer 1 · v_proj<br>8 of 32 changed (25%)<br>1 tensor"
    assert fig.layout.title.text.startswith("Delta v6→v7 applied here<br><sup>11 of ")
    colour = {(r, k): heat.z[i][j] for i, r in enumerate(heat.y) for j, k in enumerate(heat.x)}
    assert colour["layer 1", "v_proj"] == math.log10(0.25) and colour["layer 0", "v_proj"] == -5
    assert (heat.zmin, heat.zmax) == (-5, 0)  # fixed: a colour means the same density in every version
    assert list(heat.colorbar.ticktext) == ["≤0.001%", "0.01%", "0.1%", "1%", "10%", "100%"]
    assert "fixed scale" in heat.colorbar.title.text
    json.loads(fig.to_json())  # what gr.Plot sends to the browser


def test_heatmap_without_a_delta_says_so() -> None:
    assert _message(sparsity_heatmap(None)) == "No delta applied here yet"
    assert _message(sparsity_heatmap(None, side="published")) == "No delta published yet"


def test_heatmap_says_what_the_delta_is_on_its_page_and_when_nothing_changed() -> None:
    old = qwen3_state()
    grid = sparsity(header_of(old, changed_copy(old, {"lm_head.weight": 2}), version=15))
    published = sparsity_heatmap(grid, side="published")
    assert published.layout.title.text.startswith("Delta v14→v15 published<br><sup>2 of ")
    assert sparsity_heatmap(grid).layout.title.text.startswith("Delta v14→v15 applied here<br>")
    unchanged = sparsity_heatmap(sparsity(header_of(old, old, version=16)), side="published")
    assert (unchanged.layout.title.text, _message(unchanged)) == ("Delta v15→v16 published", "No element changed: the step's update was zero (each group's games scored alike, so GRPO saw no advantage, or every game was dropped)")
    # The hover toolbar keeps zoom, reset and save only: with all its buttons it covered the title.
    assert {"pan", "select", "lasso", "zoomin"} <= set(published.layout.modebar.remove)


def test_sync_timeline_marks_anchors_and_keeps_deltas_readable() -> None:
    syncs = [Sync(1, "anchor", 269_000_000, 0.020, 0.004), Sync(2, "delta", 900, 0.002, 0.001),
             Sync(3, "delta", 1_100_000, 0.003, 0.0015), Sync(4, "anchor", 269_000_000, 0.02, 0.004)]
    fig = sync_timeline(syncs)
    anchors, deltas, fetch, pause = fig.data
    assert (anchors.name, deltas.name) == ("anchor (full copy)", "delta")
    assert list(anchors.x) == [1, 4] and list(deltas.x) == [2, 3]
    assert list(deltas.y) == [900, 1_100_000] and list(deltas.text) == ["900 B", "1.1 MB"]
    assert list(anchors.text) == ["269 MB", "269 MB"]
    assert fig.layout.yaxis.type == "log"  # a 1 MB delta stays visible beside a 269 MB anchor
    assert fig.layout.yaxis.range[0] < math.log10(900) < math.log10(269e6) + 1 < fig.layout.yaxis.range[1]
    assert list(fig.layout.yaxis.ticktext) == ["10 B", "100 B", "1 kB", "10 kB", "100 kB", "1 MB", "10 MB",
                                               "100 MB", "1 GB"]  # one per decade, in bytes
    assert [round(v, 6) for v in fetch.y] == [20.0, 2.0, 3.0, 20.0]
    assert [round(v, 6) for v in pause.y] == [4.0, 1.0, 1.5, 4.0]
    assert (fetch.name, pause.name) == ("fetch (ms)", "apply pause (ms)")
    assert pause.yaxis == "y2" and deltas.yaxis == "y"
    assert fig.layout.xaxis.dtick == 1  # whole versions on the axis
    assert _message(sync_timeline([])) == "No sync yet"


def test_learning_and_payload_curves() -> None:
    fig = learning_curves([1, 2, 3], [Metric("mean reward", [0.1, None, 0.4]),
                                      Metric("win rate", [0.0, 0.5, 1.0], (0.0, 1.0))], smoothing=0.5)
    reward, reward_ema, win, win_ema = fig.data
    assert list(reward.y) == [0.1, None, 0.4] and list(win.y) == [0.0, 0.5, 1.0]  # every step, as points
    assert reward.mode == "markers" and reward_ema.mode == "lines"
    assert [round(v, 6) for v in win_ema.y] == [0.0, round(0.25 / 0.75, 6), round(0.625 / 0.875, 6)]
    assert reward_ema.y[1] is None and win.yaxis == "y2" and tuple(fig.layout.yaxis2.range) == (0.0, 1.0)
    assert [a.text for a in fig.layout.annotations] == ["mean reward", "win rate"]
    assert _message(learning_curves([], [Metric("mean reward", [])])) == "No training step yet"
    assert (fig.layout.xaxis2.dtick, fig.layout.xaxis2.tickformat) == (1, "d")  # no "step 1.5"
    constant = learning_curves([1, 2], [Metric("mean reward", [-0.20624999701976776] * 2)]).layout.yaxis
    assert constant.tickformat == ".3~g" and constant.range is None  # one tick "-0.206", not every digit
    assert learning_curves([0.5, 1.7], [Metric("r", [0, 1])], whole_x=False).layout.xaxis.dtick is None  # minutes

    fig = payload_curves([1, 2], [700, 650], [3_000, 2_900], dense_bytes=1e6, codec="ctx")
    assert [t.name for t in fig.data] == ["ctx", "raw (int32 + values)", "dense model"]
    assert list(fig.data[2].y) == [1e6, 1e6]
    assert (fig.layout.xaxis.title.text, fig.layout.xaxis.dtick) == ("version", 1)
    assert fig.layout.yaxis.type == "log"
    assert list(fig.layout.yaxis.ticktext) == ["1 kB", "10 kB", "100 kB", "1 MB"]  # decades, in bytes
    assert [t.name for t in payload_curves([1], [5]).data] == ["default codec"]
    with_anchor = payload_curves([2], [700], anchors=[(1, 269_000_000)])
    assert [(t.name, list(t.x), t.mode) for t in with_anchor.data] == [
        ("default codec", [2], "lines+markers"), ("anchor (full copy)", [1], "markers")]
    assert _message(line_curves([Series("a", [], [])], "t")) == "No data yet"
    assert not math.isnan(fig.data[0].y[0])


def test_the_legend_sits_below_the_x_axis_title_and_one_version_has_a_scale() -> None:
    fig = payload_curves([2, 3], [700, 650], [3_000, 2_900], dense_bytes=1e6, codec="ctx")
    legend = fig.layout.legend
    # In the figure's own coordinates, at its bottom, inside a margin that holds ticks, axis title and legend.
    assert (legend.yref, legend.yanchor, legend.y) == ("container", "bottom", 0.01) and fig.layout.margin.b >= 100
    assert learning_curves([1], [Metric("r", [0.5])]).layout.legend.yref == "container"
    anchor_only = payload_curves([], [], anchors=[(1, 269_000_000)])  # the first version: a full copy
    ticks = list(anchor_only.layout.yaxis.tickvals)
    low, high = anchor_only.layout.yaxis.range
    assert len(ticks) >= 2 and all(low <= math.log10(t) <= high for t in ticks)
    assert list(anchor_only.layout.yaxis.ticktext) == ["200 MB", "500 MB"]
    assert tuple(anchor_only.layout.xaxis.range) == (0.4, 1.6)  # version 1 in the middle, no version 0 or 2


def test_a_long_title_is_wrapped_for_a_phone_and_the_plot_keeps_its_height() -> None:
    """plotly draws a title on one line: at 390 px the trainer's titles were cut at both ends."""
    from dashboard.figures import SUB_CHARS, TITLE_CHARS, fit_title, line_curves, wrap_title

    title = "Off-policy correction: importance weights (current / sampler, truncated)<br><sup>" + "word " * 30 + "</sup>"
    lines = wrap_title(title).split("<br>")
    assert all(len(line) <= TITLE_CHARS for line in lines if not line.startswith("<sup>"))
    assert all(len(line) <= SUB_CHARS + len("<sup></sup>") for line in lines if line.startswith("<sup>"))
    assert " ".join(line.removeprefix("<sup>").removesuffix("</sup>") for line in lines).split() == (
        title.replace("<br>", " ").replace("<sup>", "").replace("</sup>", "").split())  # every word, in order
    short = line_curves([Series("a", [1], [1.0])], "Weight syncs")
    long = line_curves([Series("a", [1], [1.0])], title)
    assert short.layout.title.text == "Weight syncs"
    assert long.layout.height - long.layout.margin.t - long.layout.margin.b == (
        short.layout.height - short.layout.margin.t - short.layout.margin.b)  # the room grew above the plot only
    assert fit_title(long).layout.title.text == long.layout.title.text  # wrapped once: wrapping again changes nothing

"""The exam on the pages: does the policy play Wordle by itself? (`wire.exam`)

Texts for status lines, the landing page and the rollout's match, and the trainer's exam curves: per exam, the
strict valid-guess rate counting the policy's own words only (the headline), the same with any valid word,
letters found and the win rate, with two reference lines: the untrained policy's exam (version 0) and a player
that copies the env's example on every move, examples on (what copying alone finds).

The texts are pure Python (the landing page imports this module without a UI stack); plotly is imported by
`exam_figure` only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from wire.exam import OTHER_KEY, ExamRecord, ExamScores

#: Trace names the trainer's page shows (a browser test reads them).
EXAM_OWN = "exam: own words"
EXAM_ANY = "exam: any valid word"
UNTRAINED = "untrained policy (v0)"
COPYING = "copy-only player (examples on)"


def untrained(records: Sequence[ExamRecord]) -> ExamRecord | None:
    """The exam of version 0 (the weights before any step), if the bucket holds it."""
    return next((r for r in records if r.version == 0), None)


def scores_text(scores: ExamScores) -> str:
    """ "own words on 31% of moves (valid 44%) · 1.20 letters · 0 of 16 won"."""
    wins = f"{scores.wins} of {scores.games} won"
    if scores.win_guesses is not None:
        wins += f" in {scores.win_guesses:.1f} guesses"
    return (
        f"own words on {100 * scores.own_rate:.0f}% of moves (valid {100 * scores.valid_rate:.0f}%) · "
        f"{scores.letters:.2f} letters · {wins}"
    )


def exam_text(record: ExamRecord | None) -> str:
    """One line on the last exam, or that none was taken yet."""
    if record is None:
        return "no exam yet"
    return f"v{record.version}: {scores_text(record.scores)}"


def refused_exams_text(refused: dict[str, int]) -> str | None:
    """What the pages say of exam records in the bucket that were not read (None: none), with what to do:
    "2 exam records signed with another token (not shown): ..."."""
    if not refused:
        return None
    parts = []
    other = refused.get(OTHER_KEY, 0)
    if other:
        parts.append(
            f"{other} exam record{'s' * (other != 1)} signed with another token (not shown): written under "
            "another ROLLOUT_TOKEN, an earlier start's or another machine's. Start again with that token "
            "(ROLLOUT_TOKEN=… python app.py) to see them, or delete exams/ in the bucket to begin the "
            "series anew"
        )
    rest = sum(n for why, n in refused.items() if why != OTHER_KEY)
    if rest:
        whys = ", ".join(sorted(why for why in refused if why != OTHER_KEY))
        parts.append(f"{rest} damaged or invalid exam file{'s' * (rest != 1)} skipped ({whys})")
    return "; ".join(parts)


def exam_trend_text(records: Sequence[ExamRecord]) -> str:
    """How the headline moved since the first exam: "31% (v0: 6%, up 25 pts over 7 exams)"; "—" without one."""
    if not records:
        return "—"
    first, last = records[0], records[-1]
    shown = f"{100 * last.scores.own_rate:.0f}%"
    if len(records) == 1:
        return f"{shown} (one exam, v{last.version})"
    change = round(100 * (last.scores.own_rate - first.scores.own_rate))
    moved = "flat" if change == 0 else f"{'up' if change > 0 else 'down'} {abs(change)} pts"
    return f"{shown} (v{first.version}: {100 * first.scores.own_rate:.0f}%, {moved} over {len(records)} exams)"


def opponent_text(who: str, record: ExamRecord | None, activity: str | None = None) -> str:
    """What the rollout's match says of its opponent: `who` plays (Markdown: "**policy v12**"), the latest exam of its
    version or an earlier one, and what this server's examiner is doing now (`rollout_space.exam.Examiner.activity`),
    if anything."""
    now = f" Now: {activity}." if activity else ""
    if record is None:
        return (
            f"Your opponent: {who}. No exam yet: the trainer's run asks the rollout servers for "
            f"one every few versions (held-out words, no examples).{now}"
        )
    return (
        f"Your opponent: {who}; the latest exam up to its version is of **v{record.version}** "
        f"({record.settings.describe()}): {scores_text(record.scores)}.{now}"
    )


def exam_figure(records: Sequence[ExamRecord], title: str = "The exam: held-out words, no examples") -> Any:
    """Per exam (x: the version examined): the strict valid-guess rate of own words and of any word, letters
    found and the win rate, with the untrained policy's exam and the copy-only player as flat reference lines."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    from .figures import HEIGHT, _empty, fit_title

    if not records:
        return _empty(title, "No exam yet: the first, of the untrained policy (v0), is played once step 1 is published")
    x = [r.version for r in records]
    span = [min(x), max(x)] if len(x) > 1 else [x[0] - 0.5, x[0] + 0.5]
    panels = [
        ("valid-guess rate (strict)", (-0.05, 1.05)),
        ("letters found (of 5)", (-0.1, 5.1)),
        ("win rate", (-0.05, 1.05)),
    ]
    fig = make_subplots(
        rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.1, subplot_titles=[name for name, _ in panels]
    )

    def metrics(s: ExamScores) -> list[float]:
        return [s.own_rate, s.letters, s.wins / s.games]

    own = [metrics(r.scores) for r in records]
    for row in range(3):
        fig.add_trace(
            go.Scatter(
                x=x,
                y=[m[row] for m in own],
                name=EXAM_OWN,
                mode="lines+markers",
                line={"color": "#08306b", "width": 2},
                legendgroup="own",
                showlegend=row == 0,
            ),
            row=row + 1,
            col=1,
        )
    fig.add_trace(
        go.Scatter(
            x=x,
            y=[r.scores.valid_rate for r in records],
            name=EXAM_ANY,
            mode="lines+markers",
            line={"color": "#6baed6", "dash": "dash"},
        ),
        row=1,
        col=1,
    )
    references = [(UNTRAINED, untrained(records), "#e6550d", "dot"), (COPYING, records[-1], "#31a354", "dashdot")]
    for name, record, color, dash in references:
        scores = None if record is None else (record.copying if name == COPYING else record.scores)
        if scores is None:
            continue
        for row, value in enumerate(metrics(scores)):
            fig.add_trace(
                go.Scatter(
                    x=span,
                    y=[value, value],
                    name=name,
                    mode="lines",
                    line={"color": color, "dash": dash},
                    legendgroup=name,
                    showlegend=row == 0,
                    hovertemplate=f"{value:.3g}<extra>{name}</extra>",
                ),
                row=row + 1,
                col=1,
            )
    for row, (_, y_range) in enumerate(panels, start=1):
        fig.update_yaxes(range=y_range, tickformat=".3~g", row=row, col=1)
    settings = records[-1].settings.describe()
    fig.update_layout(
        title=f"{title}<br><sup>{settings}; own words: not shown in any message before the move</sup>",
        height=HEIGHT + 280,
        margin={"l": 60, "r": 20, "t": 80, "b": 50},
        template="plotly_white",
        legend={"orientation": "h", "y": -0.12},
    )
    versions = [r.version for r in records]  # ticks on whole versions, ~10 at most (one exam: not "0 0 0 0")
    fig.update_xaxes(tickformat="d", dtick=max(1, math.ceil((max(versions) - min(versions)) / 10)))
    fig.update_xaxes(title_text="version examined", row=3, col=1)
    return fit_title(fig)

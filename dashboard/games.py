"""HTML of policy games: Wordle boards drawn from rollout trajectories.

Trajectories (`wire.rollout.Trajectory`, what the rollout API sends) carry ``guesses`` ("" for
an invalid move) and ``marks`` (one code per valid guess). The tiles use ``dashboard.render``'s CSS classes, so a
UI that loads ``dashboard.render.CSS`` draws them like the env Space does. ``hide_letters`` draws colours
only: how the policy's board is shown to a person still guessing the same word.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence

from wire.env import GameKind
from wire.rollout import Trajectory
from wire.wordle import MAX_GUESSES

from . import render


def scored_words(trajectory: Trajectory) -> list[str]:
    """The valid guesses of a game, in order (invalid moves are "" in ``guesses``)."""
    return [g for g in trajectory.guesses if g]


def result_text(trajectory: Trajectory, reveal: bool = True) -> str:
    """ "won in 3", "lost (CRANE)" or "unfinished", plus invalid moves: the env's feed wording and counts
    (``dashboard.render.outcome_text``); the secret only when ``reveal``."""
    return render.outcome_text(
        trajectory.won,
        trajectory.finished,
        trajectory.secret,
        len(scored_words(trajectory)),
        trajectory.invalid_moves,
        reveal,
    )


def board_html(
    trajectory: Trajectory | None, rows: int | None = None, hide_letters: bool = False, testid: str = "policy-board"
) -> str:
    """The full 6 x 5 board of one policy game, or of its first ``rows`` scored guesses."""
    if trajectory is None:
        inner = render.rows_html([], [], MAX_GUESSES)
    else:
        words, marks = scored_words(trajectory), trajectory.marks
        n = len(marks) if rows is None else min(rows, len(marks))
        inner = render.rows_html(words[:n], marks[:n], MAX_GUESSES, hide_letters)
    return f'<div class="wordle-board" data-testid="{html.escape(testid)}">{inner}</div>'


def move_track_html(trajectory: Trajectory) -> str:
    """A game's moves so far as a strip, one mark each, scored or invalid, without their text: how the policy's side
    of a match shows progress while its letters are hidden (an invalid move's reason may name a word). Its board
    draws scored guesses only, so a policy making invalid moves looked stuck."""
    items = "".join(
        f'<li class="wordle-track-move{"" if guess else " invalid"}" data-move="{"scored" if guess else "invalid"}">'
        f"{n}. {'scored' if guess else 'invalid'}</li>"
        for n, guess in enumerate(trajectory.guesses, start=1)
    )
    return f'<ol class="wordle-track" data-testid="policy-moves">{items}</ol>'


def feed_html(
    trajectories: Sequence[Trajectory], testid: str = "policy-feed", kinds: Mapping[str, GameKind] | None = None
) -> str:
    """Recent policy games, newest first: a small board, the weight version, the kind of game (`kinds` by episode
    id; an exam game is one whatever it says, any other a training game unless it says more), the result, how many
    messages showed the env's example, and what the model wrote for each move."""
    if not trajectories:
        return f'<div class="wordle-feed wordle-empty" data-testid="{testid}">No policy games yet.</div>'
    games = []
    for i, t in enumerate(trajectories):
        words = scored_words(t)
        kind = GameKind.EXAM if t.exam else (kinds or {}).get(t.episode_id, GameKind.TRAINING)
        shown = render.examples_shown_text(t.examples)
        games.append(
            f'<div class="wordle-game" data-testid="policy-game" data-episode="{html.escape(t.episode_id)}">'
            f'<div class="wordle-mini">{render.rows_html(words, t.marks, len(words))}</div>'
            f"<div><b>policy {version_label(t)}</b> · {render.kind_html(kind)}<br>{result_text(t)}<br>"
            f'<span class="wordle-empty">reward {t.reward:.2f}{" · " + shown if shown else ""}</span>'
            + render.moves_html(
                t.replies, t.guesses, open_=i == 0, errors=t.errors, examples=t.examples, copied=t.copied
            )
            + "</div></div>"
        )
    return f'<div class="wordle-feed" data-testid="{testid}">{"".join(games)}</div>'


def version_label(trajectory: Trajectory) -> str:
    """The weight versions that wrote a game's replies: "v4", "v4–v5" (new weights arrived mid-game), "v?" before its
    first reply."""
    versions = sorted(set(trajectory.versions))
    if not versions:
        return "v?"
    return f"v{versions[0]}" if len(versions) == 1 else f"v{versions[0]}–v{versions[-1]}"

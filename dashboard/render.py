"""HTML for the UIs: the Wordle board, the keyboard, the games feed, the stats rows and their CSS. Pure
functions of game data, so they are testable without Gradio; each app's ``ui.py`` only wires them to
components (the env's for people's games, the rollout's for a person against the policy)."""

from __future__ import annotations

import html
import time
from collections.abc import Sequence

from wire.env import HUMAN, GameKind, GameRecord, GuessRow, PlayerStats, WordleObservation
from wire.wordle import MAX_GUESSES, WORD_LENGTH, Mark, decode, letter_states, reply_excerpt

_KEY_ROWS = ("qwertyuiop", "asdfghjkl", "zxcvbnm")
_CLASS: dict[str, str] = {Mark.GREEN: "green", Mark.YELLOW: "yellow", Mark.GRAY: "gray"}

CSS = """
.wordle-board { display: grid; gap: 5px; justify-content: center; margin: 8px 0; }
.wordle-row { display: grid; grid-template-columns: repeat(5, 52px); gap: 5px; }
.wordle-tile { width: 52px; height: 52px; display: flex; align-items: center; justify-content: center;
  font: 700 26px/1 system-ui, sans-serif; text-transform: uppercase; border: 2px solid #d3d6da;
  box-sizing: border-box; color: #1a1a1b; background: #fff; }
.wordle-tile.green, .wordle-key.green { background: #6aaa64; border-color: #6aaa64; color: #fff; }
.wordle-tile.yellow, .wordle-key.yellow { background: #c9b458; border-color: #c9b458; color: #fff; }
.wordle-tile.gray, .wordle-key.gray { background: #787c7e; border-color: #787c7e; color: #fff; }
.wordle-keyboard { display: grid; gap: 6px; margin: 8px auto 0; width: 100%; max-width: 480px; }
.wordle-keyrow { display: flex; gap: 4px; justify-content: center; }
.wordle-key { flex: 1 1 0; min-width: 0; max-width: 44px; padding: 10px 0; border-radius: 4px; background: #d3d6da;
  color: #1a1a1b; font: 600 14px/1 system-ui, sans-serif; text-transform: uppercase; text-align: center;
  cursor: pointer; user-select: none; overflow: hidden; }
.wordle-key.wide { flex-grow: 1.6; max-width: 70px; font-size: 11px; }
.wordle-feed { display: grid; grid-template-columns: minmax(0, 1fr); gap: 10px; }
.wordle-game { display: flex; gap: 12px; align-items: flex-start; }
.wordle-mini { display: grid; gap: 2px; min-width: 88px; }
.wordle-mini .wordle-row { grid-template-columns: repeat(5, 16px); gap: 2px; }
.wordle-mini .wordle-tile { width: 16px; height: 16px; font-size: 10px; border-width: 1px; }
.wordle-empty { color: #787c7e; }
.wordle-moves-box summary { cursor: pointer; font-size: 12px; color: #555; }
.wordle-moves { margin: 4px 0 0; padding: 0; list-style: none; font: 12px/1.4 ui-monospace, monospace; }
.wordle-game > div:last-child { min-width: 0; flex: 1; overflow: hidden; }
.wordle-move { overflow-wrap: anywhere; }
.wordle-move.invalid { color: #a33; }
.wordle-copied { color: #9a6700; font-size: 11px; }
.wordle-why { white-space: normal; padding-left: 1.5em; font-size: 11px; }
.wordle-track { display: flex; flex-wrap: wrap; gap: 4px; list-style: none; padding: 0; margin: 4px 0;
  font: 12px/1.4 system-ui, sans-serif; justify-content: center; }
.wordle-track-move { padding: 1px 6px; border-radius: 3px; background: #e3f1e1; color: #2d5a27; }
.wordle-track-move.invalid { background: #f6dede; color: #a33; }
.wordle-kind { color: #555; }
"""


def _tile(letter: str, mark: Mark | str | None) -> str:
    cls = f"wordle-tile {_CLASS[mark]}" if mark else "wordle-tile"
    data = f' data-mark="{Mark(mark).value}"' if mark else ""
    return f'<div class="{cls}"{data}>{html.escape(letter)}</div>'


def rows_html(words: Sequence[str], marks: Sequence[str], total_rows: int = 0, hide_letters: bool = False) -> str:
    """Scored rows (marks as G/Y/X codes; letters hidden if asked: colours only), padded with empty rows
    up to `total_rows`. The one drawing of Wordle rows: the env's boards and feed, the policy's games."""
    rows = []
    for word, code in zip(words, marks, strict=True):
        letters = [""] * WORD_LENGTH if hide_letters else list(word)
        tiles = "".join(_tile(c, m) for c, m in zip(letters, decode(code), strict=True))
        rows.append(f'<div class="wordle-row">{tiles}</div>')
    empty = '<div class="wordle-row">' + _tile("", None) * WORD_LENGTH + "</div>"
    return "".join(rows) + empty * max(0, total_rows - len(rows))


def board_html(rows: Sequence[GuessRow]) -> str:
    """The 6 x 5 grid of a game, scored tiles coloured, unused rows empty."""
    inner = rows_html([r.word for r in rows], [r.marks for r in rows], MAX_GUESSES)
    return f'<div class="wordle-board" data-testid="board">{inner}</div>'


def keyboard_html(rows: Sequence[GuessRow]) -> str:
    """A QWERTY keyboard coloured with the best mark known for each letter, with enter and back keys
    (:func:`keyboard_js` makes them type)."""
    states = letter_states((r.word, decode(r.marks)) for r in rows)
    keys = []
    for n, row in enumerate(_KEY_ROWS):
        cells = "".join(
            f'<div class="wordle-key {_CLASS[states[c]] if c in states else ""}" data-key="{c}">{c}</div>' for c in row
        )
        if n == len(_KEY_ROWS) - 1:
            cells = (
                f'<div class="wordle-key wide" data-key="enter">enter</div>{cells}'
                '<div class="wordle-key wide" data-key="back">back</div>'
            )
        keys.append(f'<div class="wordle-keyrow">{cells}</div>')
    return f'<div class="wordle-keyboard" data-testid="keyboard">{"".join(keys)}</div>'


def keyboard_js(input_id: str, guess_id: str) -> str:
    """``js_on_load`` of the keyboard's ``gr.HTML``: a key types its letter into the textbox with
    ``elem_id`` ``input_id`` (five letters at most), back deletes one, enter presses ``guess_id``.
    One listener on the component, so it keeps working when the keyboard is redrawn."""
    return f"""
element.addEventListener('click', (event) => {{
  const key = event.target.closest('[data-key]');
  const box = document.querySelector('#{input_id} textarea, #{input_id} input');
  if (!key || !box) return;
  const k = key.dataset.key;
  if (k === 'enter') {{ document.querySelector('#{guess_id}').click(); return; }}
  box.value = k === 'back' ? box.value.slice(0, -1) : (box.value + k).slice(0, {WORD_LENGTH});
  box.dispatchEvent(new Event('input', {{ bubbles: true }}));
}});
"""


def status_text(observation: WordleObservation | None) -> str:
    """One line for a person playing: what happened and what next."""
    if observation is None:
        return "Press **New game** to start."
    if observation.done:
        secret = (observation.secret or "").upper()
        if observation.won:
            return f"You won in {len(observation.rows)}! The word was **{secret}**."
        return f"Game over. The word was **{secret}**."
    left = f"{observation.guesses_left} guess{'es' if observation.guesses_left != 1 else ''} left."
    if observation.error:
        return f"Not accepted: {html.escape(observation.error)}. {left}"
    return left


def outcome_text(won: bool, finished: bool, secret: str, guesses: int, invalid_moves: int, reveal: bool = True) -> str:
    """The one wording of a game's result ("won in 3", "lost (CRANE), 2 invalid moves", "unfinished"),
    used by the env's feed and the rollout's alike, from the env's own counts."""
    if won:
        text = f"won in {guesses}"
    elif not finished:
        text = "unfinished"
    else:
        text = f"lost ({html.escape(secret.upper())})" if reveal and secret else "lost"
    if invalid_moves:
        text += f", {invalid_moves} invalid move{'s' if invalid_moves != 1 else ''}"
    return text


def moves_html(
    replies: Sequence[str],
    guesses: Sequence[str],
    chars: int = 160,
    open_: bool = False,
    errors: Sequence[str] = (),
    examples: Sequence[str] = (),
    copied: Sequence[bool] = (),
) -> str:
    """What the player wrote for each move, one item each inside a ``<details>`` (shown if ``open_``): the word
    it scored or "invalid", then its text with whitespace collapsed, unprintable characters as "?", escaped,
    wrapped over lines, and cut to ``chars`` around its guess where it is longer (`wire.wordle.reply_excerpt`:
    the word the env scored always shows; the whole kept text on hover). An invalid move shows the env's reason
    (``errors``, one per move, "" for a scored one; older records have none) on a line below. A scored word
    that is the example the env's message showed before that move (``examples``) says so, and one that another
    message of the game had shown (``copied``, the env's verdict per move: a word of the instructions such as
    GREEN, or of the feedback) says it was copied: a small policy copies, and a watcher should see which words
    were the policy's own."""
    if not replies:
        return ""
    lines = []
    reasons = list(errors) + [""] * (len(replies) - len(errors))
    offered = list(examples) + [""] * (len(replies) - len(examples))
    shown_before = list(copied) + [False] * (len(replies) - len(copied))
    for n, (reply, guess, why, example, seen) in enumerate(
        zip(replies, guesses, reasons, offered, shown_before, strict=False), start=1
    ):
        flat = "".join(c if c.isprintable() else "?" for c in " ".join(reply.split()))
        shown = reply_excerpt(flat, chars)
        verdict = f"<b>{html.escape(guess.upper())}</b>" if guess else "invalid"
        if guess and guess == example:
            verdict += (
                ' <span class="wordle-copied" title="copied from the env&#x27;s message">(env&#x27;s example)</span>'
            )
        elif guess and seen:
            verdict += (
                ' <span class="wordle-copied" title="a word the env&#x27;s instructions or feedback had shown '
                'before this move: not the policy&#x27;s own">(copied from the env&#x27;s text)</span>'
            )
        reason = f'<div class="wordle-why">{html.escape(why)}</div>' if why and not guess else ""
        lines.append(
            f'<li class="wordle-move{"" if guess else " invalid"}" title="{html.escape(flat)}">'
            f"{n}. {verdict}: {html.escape(shown) or '(empty reply)'}{reason}</li>"
        )
    count = f"{len(replies)} move{'s' if len(replies) != 1 else ''}"
    return (
        f'<details class="wordle-moves-box"{" open" if open_ else ""}><summary>what it wrote ({count})'
        f'</summary><ol class="wordle-moves" data-testid="moves">{"".join(lines)}</ol></details>'
    )


#: How every feed names a game's kind (`wire.env.GameKind`): the env's, the rollout's and the trainer's alike.
KIND_LABELS: dict[GameKind, str] = {
    GameKind.TRAINING: "training game",
    GameKind.EXAM: "exam game: held-out word, no examples, not trained on",
    GameKind.SHOWCASE: "showcase game: played whole, not trained on",
    GameKind.MATCH: "match against a person: not trained on",
    GameKind.PLAY: "a game its client named no kind for",
}


def kind_html(kind: GameKind) -> str:
    """A game's kind as the feeds show it beside its player (`KIND_LABELS`)."""
    return f'<span class="wordle-kind" data-testid="kind" data-kind="{kind.value}">{KIND_LABELS[kind]}</span>'


def examples_shown_text(examples: Sequence[str]) -> str:
    """How many of a game's messages before a move showed the env's example: "example in 2 of 3 messages", "no
    example shown"; "" for a record that does not say (an env older than the examples)."""
    if not examples:
        return ""
    shown = sum(1 for e in examples if e)
    if not shown:
        return "no example shown"
    return f"example in {shown} of {len(examples)} message{'s' * (len(examples) != 1)}"


def feed_html(records: Sequence[GameRecord]) -> str:
    """Recent policy games: small boards, who played, the result, when it ended (each game's own UTC
    clock time: a relative age would freeze between redraws, and games of one batch end together) and
    each move's text with the reason of every invalid move (open for the newest game). The whole list
    shows, so no entry is cut by a scroll box."""
    if not records:
        return '<div class="wordle-feed wordle-empty" data-testid="feed">No policy games yet.</div>'
    games = []
    for i, r in enumerate(records):
        result = outcome_text(r.won, r.finished, r.secret, len(r.words), r.invalid_moves)
        ended = time.strftime("%H:%M:%S", time.gmtime(r.finished_at))
        shown = examples_shown_text(r.examples)
        games.append(
            f'<div class="wordle-game" data-testid="game" data-episode="{html.escape(r.episode_id)}">'
            f'<div class="wordle-mini">{rows_html(r.words, r.marks, len(r.words))}</div>'
            f"<div><b>{html.escape(r.player)}</b> · {kind_html(r.kind)}<br>{result}<br>"
            f'<span class="wordle-empty">{shown + " · " if shown else ""}</span>'
            f'<span class="wordle-empty" data-testid="ended">ended {ended} UTC</span>'
            + moves_html(r.replies, r.guesses, open_=i == 0, errors=r.errors, examples=r.examples, copied=r.copied)
            + "</div></div>"
        )
    return f'<div class="wordle-feed" data-testid="feed">{"".join(games)}</div>'


#: Under the policy feed: what each kind of game is, why training games read "unfinished", and what the marks mean.
FEED_NOTE = (
    "*Each game says why it was played. A **training game** is played for the trainer and cut after a few moves "
    '(`--max-turns`, 3 by default, for more steps per minute on small machines): it reads "unfinished". Its '
    "messages show the env's example guess (never the secret) with the probability the run's schedule gives the "
    "version that starts it, fading to none as training goes on. An **exam game** plays a held-out word with no "
    "example; a **showcase game** is a rollout server's whole game (up to 6 guesses) for its page, when idle or "
    "asked by a visitor; a **match** is the policy's side of a game against a person. None of those three is "
    "trained on, and each game says how many of its messages showed an example. Each invalid move shows the reason "
    'it was refused; a word marked "env\'s example" was copied from the message before it, one marked "copied '
    "from the env's text\" from the instructions or feedback (GREEN, GUESS): not the policy's own words.*"
)


def win_rate_note(stats: Sequence[PlayerStats]) -> str:
    """Under the win-rate curve: games and wins of each kind (never one count of all), and what a flat line on the
    axis means, so it is not read as a broken chart."""
    by_kind: dict[GameKind, list[int]] = {}
    for s in stats:
        if s.weight_version is not None:
            games_wins = by_kind.setdefault(s.kind, [0, 0])
            games_wins[0] += s.games
            games_wins[1] += s.wins
    if not by_kind:
        return "*No policy game yet.*"
    counts = " · ".join(
        f"{kind} games: {by_kind[kind][1]:,} of {by_kind[kind][0]:,} won" for kind in GameKind if kind in by_kind
    )
    training = by_kind.get(GameKind.TRAINING)
    if training and not training[1]:
        counts += (
            ". The training line lies on 0: cut at a few moves, a small model's training games rarely find the word; "
            "the trainer's valid-guess rate and letters found show what it learns first"
        )
    return f"*{counts}.*"


STATS_HEADERS = ["player", "kind of game", "games", "wins", "win rate"]
CURVE_HEADERS = ["weight version", "win rate", "kind of game"]


def stats_rows(stats: Sequence[PlayerStats]) -> list[list[object]]:
    """Rows for the win-rate table, in the order of :data:`STATS_HEADERS`, one per player and kind of game: people
    first, then policies newest version first (a long run has hundreds of versions: the top of the table is the one
    a visitor reads)."""
    ordered = sorted(
        stats, key=lambda s: (s.player != HUMAN, -(s.weight_version if s.weight_version is not None else -1))
    )
    return [[s.player, s.kind.value, s.games, s.wins, f"{100 * s.win_rate:.0f}%"] for s in ordered]


def win_rate_curve(stats: Sequence[PlayerStats]) -> list[list[object]]:
    """("vN", win rate, kind) of every versioned policy and kind of game, by version: one learning curve per kind.
    Versions are labels, so the chart's axis shows whole versions only (a numeric axis would tick at 4.5)."""
    points = sorted(
        (s.weight_version, s.kind.value, round(s.win_rate, 3)) for s in stats if s.weight_version is not None
    )
    return [[f"v{version}", rate, kind] for version, kind, rate in points]

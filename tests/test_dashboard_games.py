"""dashboard.games: policy trajectories drawn as Wordle boards."""

from __future__ import annotations

import re

from dashboard import games
from dashboard.render import KIND_LABELS
from wire.env import GameKind
from wire.rollout import Trajectory

GAME = Trajectory(prompt_ids=[1], episode_id="e1", guesses=["slate", "", "crane"], marks=["XXGXG", "GGGGG"], won=True,
                  secret="crane", reward=1.25, versions=[3, 4, 4], invalid_moves=1, finished=True,
                  replies=["<guess>slate</guess>", "hmm <b>no</b>", "<guess>crane</guess>"])
LOST = Trajectory(prompt_ids=[1], episode_id="e2", guesses=["slate"], marks=["XXGXG"], secret="crane", reward=0.1,
                  versions=[5], replies=["<guess>slate</guess>"], finished=True)


def test_board_shows_rows_and_pads_to_six() -> None:
    board = games.board_html(GAME)
    assert board.count('class="wordle-row"') == 6
    assert re.findall(r'data-mark="(\w)">(\w)<', board) == list(zip("XXGXGGGGGG", "slatecrane", strict=True))


def test_hidden_letters_and_partial_rows_keep_the_secret_out() -> None:
    board = games.board_html(GAME, rows=1, hide_letters=True)
    assert re.findall(r'data-mark="(\w)">', board) == list("XXGXG")
    assert "crane" not in board.lower() and "slate" not in board.lower()
    assert board.count('class="wordle-row"') == 6


def test_result_text() -> None:
    assert games.result_text(GAME) == "won in 2, 1 invalid move"
    assert games.result_text(LOST) == "lost (CRANE)"
    assert games.result_text(LOST, reveal=False) == "lost"
    cut = LOST.model_copy(update={"guesses": ["", ""], "finished": False, "invalid_moves": 2})
    assert games.result_text(cut) == "unfinished, 2 invalid moves"


def test_feed() -> None:
    feed = games.feed_html([GAME, LOST])
    assert feed.count('data-testid="policy-game"') == 2
    assert 'data-episode="e1"' in feed and "policy v3–v4" in feed and "policy v5" in feed and "reward 1.25" in feed
    assert "No policy games yet." in games.feed_html([])
    assert re.findall(r'data-kind="(\w+)"', feed) == ["training", "training"]  # a game that says no more: training
    marked = games.feed_html([GAME, LOST], kinds={LOST.episode_id: GameKind.SHOWCASE})
    assert re.findall(r'data-kind="(\w+)"', marked) == ["training", "showcase"]
    assert marked.index(KIND_LABELS[GameKind.SHOWCASE]) > marked.index("policy v5")
    assert "2. invalid: hmm &lt;b&gt;no&lt;/b&gt;</li>" in feed  # what the model wrote, escaped
    assert games.board_html(None).count("data-mark") == 0


def test_an_exam_game_says_so_in_the_feed_whatever_its_kinds_say() -> None:
    feed = games.feed_html([LOST.model_copy(update={"exam": True}), GAME], kinds={LOST.episode_id: GameKind.TRAINING})
    assert re.findall(r'data-kind="(\w+)"', feed) == ["exam", "training"]
    assert feed.count(KIND_LABELS[GameKind.EXAM]) == 1


def test_version_label_names_every_version_that_wrote_a_reply() -> None:
    assert [games.version_label(t) for t in (GAME, LOST, LOST.model_copy(update={"versions": []}))] == [
        "v3–v4", "v5", "v?"]

"""The counts `bench.trainer run` reports about what the policy wrote, on games played against the real env."""

from __future__ import annotations

import statistics

from bench.trainer import copying_baseline, examples_played, not_first_words
from env_space.game import WordleGame
from env_space.words import load_word_lists
from wire.wordle import encode, letters_found, score


def test_later_moves_are_counted_as_copies_only_when_they_play_the_example_shown() -> None:
    games = []
    for secret, own_word in (("mound", None), ("pious", "slate")):
        game = WordleGame(secret, load_word_lists(), episode_id=secret, player="policy v1")
        game.step("<guess>crane</guess> and more")
        shown = game.step("<guess>crane</guess>").example  # a repeat: invalid, not counted
        shown = game.step(f"<guess>{shown}</guess>").example
        game.step(f"<guess>{own_word or shown}")
        games.append(game.record())
    assert examples_played(games) == {"later_moves_scored": 4, "later_moves_playing_the_example": 3}
    assert not_first_words(games) == 0


def test_the_copying_baseline_plays_the_envs_examples() -> None:
    words = load_word_lists()
    crane_only = [letters_found([encode(score("crane", words.pick_secret(seed)))]) for seed in range(20)]
    assert copying_baseline(1, games=20) == statistics.fmean(crane_only)  # one move: the instructions' example
    assert copying_baseline(3, games=20) > copying_baseline(2, games=20) > copying_baseline(1, games=20)

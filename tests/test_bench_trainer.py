"""The counts `bench.trainer run` reports about what the policy wrote, on games played against the real env."""

from __future__ import annotations

import argparse
import statistics

from bench.trainer import copying_baseline, examples_played, not_first_words, run_summary
from env_space.game import WordleGame
from env_space.words import load_word_lists
from trainer_space import TrainerConfig
from wire.trainer import StepRecord
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


def test_the_runs_summary_reads_the_trainers_default_moves_when_max_turns_is_not_given() -> None:
    """`run` builds its summary at its very end, after minutes of training: without `--max-turns` it must
    take the trainer's default (it once called `TrainerConfig()` without its required arguments there)."""
    steps = [StepRecord(step=i, version=i, reward=0.1 * i, win_rate=0.0, valid_rate=0.5, letters=1.0, step_s=40.0,
                        cpu_s=70.0, publish_s=0.1, at=1.7e9 + 40 * i) for i in range(1, 9)]
    game = WordleGame("mound", load_word_lists(), episode_id="g", player="policy v8")
    game.step("<guess>crane</guess>")
    default = run_summary(steps, [], [game.record()], argparse.Namespace(max_turns=None, window=5))
    given = run_summary(steps, [], [game.record()], argparse.Namespace(max_turns=1, window=5))
    assert default["letters_found_by_copying_only"] == copying_baseline(TrainerConfig.max_turns)
    assert given["letters_found_by_copying_only"] == copying_baseline(1)
    assert default["steps"] == 8 and default["reward_last"] == statistics.fmean(0.1 * i for i in range(4, 9))
    assert default["distinct_words_last_games"] == 1


def test_the_exam_summary_and_the_collapse_check() -> None:
    from bench.trainer import collapse, exam_summary
    from tests.test_dashboard_exam import exam
    from wire.trainer import StepRecord

    exams = [exam(0, 0.0, 0.5), exam(5, 0.125, 1.0), exam(10, 0.25, 1.5), exam(15, 0.5, 2.0)]
    s = exam_summary(exams)
    assert s["exam_versions"] == [0, 5, 10, 15] and s["exam_own_rate"] == [0.0, 0.125, 0.25, 0.5]
    assert s["exam_own_rise_points"] == 37.5 and s["exam_letters_last_two"] == 1.75
    assert s["exam_letters_copying_only"] == exams[-1].copying.letters and exam_summary([]) == {"exams": 0}

    def steps(rates: list[float]) -> list[StepRecord]:
        return [StepRecord(step=n, version=n, reward=0.0, win_rate=0.0, valid_rate=r, step_s=1.0, cpu_s=1.0,
                           publish_s=0.0, at=float(n)) for n, r in enumerate(rates, start=1)]

    rising = steps([0.2] * 9 + [0.5] + [0.6, 0.4, 0.45, 0.7, 0.3, 0.3, 0.3, 0.8])
    assert collapse(rising) == {"valid_rate_at_step_10": 0.5, "longest_run_below_it": 3}
    broken = steps([0.5] * 10 + [0.3] * 6)
    assert collapse(broken)["longest_run_below_it"] == 6 and collapse(steps([0.5] * 9))["longest_run_below_it"] is None

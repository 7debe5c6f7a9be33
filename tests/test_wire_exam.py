"""The exam's settings, scores and record: what counts as the policy's own, and the ranges a stranger's record
must keep."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from wire.exam import ExamRecord, ExamScores, ExamSettings, exam_path, path_version
from wire.trajectory import Trajectory


def game(guesses: list[str], copied: list[bool], marks: list[str], won: bool = False) -> Trajectory:
    return Trajectory(prompt_ids=[1], episode_id="e", guesses=guesses, copied=copied, marks=marks, won=won)


def test_scores_count_valid_moves_own_words_letters_and_wins() -> None:
    games = [game(["crane", "", "pious"], [True, False, False], ["XYXXG", "XXXXX"]),
             game(["", "", ""], [False, False, False], []),
             game(["slate", "tiger"], [False, False], ["XXXXX", "GGGGG"], won=True)]
    s = ExamScores.of(games)
    assert (s.games, s.moves, s.scored, s.own, s.wins) == (3, 8, 4, 3, 1)
    assert s.valid_rate == pytest.approx((2 / 3 + 0 + 1) / 3) and s.own_rate == pytest.approx((1 / 3 + 0 + 1) / 3)
    assert s.valid_by_move == pytest.approx([2 / 3, 1 / 3, 1 / 2])
    assert s.letters == pytest.approx((1.5 + 0 + 5) / 3) and s.win_guesses == 2
    assert s.words == ["crane", "pious", "slate", "tiger"]
    with pytest.raises(ValueError, match="no games"):
        ExamScores.of([])


def test_a_game_without_copied_marks_counts_its_words_as_its_own() -> None:
    s = ExamScores.of([game(["crane", "pious"], [], ["XXXXX", "XXXXX"])])
    assert s.own == 2 and s.own_rate == 1.0


def test_an_exam_is_due_at_version_0_and_in_each_new_block_of_versions() -> None:
    every5 = ExamSettings(every=5)
    assert every5.due(0, None) and every5.due(7, None)
    assert not every5.due(0, 0) and not every5.due(4, 0) and every5.due(5, 0) and every5.due(7, 0)
    assert not every5.due(9, 7) and every5.due(10, 7)
    assert ExamSettings(temperature=0).describe() == "16 held-out words, 3 moves a game, greedy, no examples"


def scores(**changes: object) -> dict:
    base = {"games": 2, "moves": 6, "valid_rate": 0.5, "own_rate": 0.25, "valid_by_move": [0.5, 0.5, 0.5],
            "letters": 1.0, "wins": 0, "win_guesses": None, "scored": 3, "own": 2, "words": ["crane", "pious", "slate"]}
    return {**base, **changes}


def record(**changes: object) -> dict:
    base = {"version": 5, "server_id": "s0", "settings": {"games": 2}, "scores": scores(), "played_s": 3.0,
            "at": 1.7e9}
    return {**base, **changes}


def test_a_valid_record_reads_back_and_names_its_path() -> None:
    exam = ExamRecord.model_validate(record())
    assert exam.path == exam_path(5) == "exams/v0000000005.json" and path_version(exam.path) == 5
    assert path_version("exams/v5.json") is None and path_version("exams/v0000000005.json.tmp") is None


@pytest.mark.parametrize("bad", [
    {"version": -1}, {"server_id": "../x"}, {"played_s": float("nan")}, {"extra": 1},
    {"settings": {"games": 65}}, {"settings": {"games": 3}},
    {"scores": scores(valid_rate=1.5)}, {"scores": scores(letters=5.5)}, {"scores": scores(own=4)},
    {"scores": scores(own_rate=0.75)}, {"scores": scores(wins=1)}, {"scores": scores(win_guesses=2.0)},
    {"scores": scores(valid_by_move=[2.0])}, {"scores": scores(words=["crane"])},
    {"scores": scores(words=["CRANE", "pious", "slate"])}, {"scores": scores(wins=3, win_guesses=2.0)},
])
def test_a_record_out_of_range_is_refused(bad: dict) -> None:
    with pytest.raises(ValidationError):
        ExamRecord.model_validate(record(**bad))

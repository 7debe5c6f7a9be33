"""The exam on the pages: its curves with their reference lines, and the texts of the landing page and the
match, from real records."""

from __future__ import annotations

import pytest

from dashboard.exam import (COPYING, EXAM_ANY, EXAM_OWN, UNTRAINED, exam_figure, exam_text, exam_trend_text,
                            opponent_text, refused_exams_text)
from env_space.exam import copying_reference
from tests.test_wire_exam import record, scores
from wire.exam import OTHER_KEY, ExamRecord

COPY = copying_reference(2, 3).copying


def exam(version: int, own_rate: float, letters: float = 1.0, wins: int = 0) -> ExamRecord:
    return ExamRecord.model_validate(record(
        version=version, copying=COPY.model_dump(),
        scores=scores(own_rate=own_rate, valid_rate=max(own_rate, 0.5), letters=letters, wins=wins,
                      win_guesses=3.0 if wins else None)))


def test_the_curves_show_each_exam_against_the_untrained_policy_and_the_copy_only_player() -> None:
    figure = exam_figure([exam(0, 0.0, 0.5), exam(5, 0.25, 1.0), exam(10, 0.5, 2.0, wins=1)])
    by_name: dict[str, list] = {}
    for trace in figure.data:
        by_name.setdefault(trace.name, []).append(trace)
    own, untrained, copying = by_name[EXAM_OWN], by_name[UNTRAINED], by_name[COPYING]
    assert [list(t.y) for t in own] == [[0.0, 0.25, 0.5], [0.5, 1.0, 2.0], [0.0, 0.0, 0.5]]
    assert list(own[0].x) == [0, 5, 10] and list(by_name[EXAM_ANY][0].y) == [0.5, 0.5, 0.5]
    assert [list(t.y) for t in untrained] == [[0.0, 0.0], [0.5, 0.5], [0.0, 0.0]]  # flat: version 0's exam
    assert [t.y[0] for t in copying] == [0.0, pytest.approx(COPY.letters), 0.0]  # copying finds letters, no own word
    assert [list(t.x) for t in untrained][0] == [0, 10]
    assert sum(t.showlegend for t in own + untrained + copying) == 3  # one legend entry each
    assert "no examples" in figure.layout.title.text


def test_without_version_0_there_is_no_untrained_line_and_without_exams_the_figure_says_so() -> None:
    names = {t.name for t in exam_figure([exam(5, 0.25)]).data}
    assert UNTRAINED not in names and {EXAM_OWN, COPYING} <= names
    empty = exam_figure([])
    assert not empty.data and "No exam yet" in empty.layout.annotations[0].text


def test_texts_for_the_landing_page_the_status_line_and_the_match() -> None:
    exams = [exam(0, 0.0), exam(5, 0.25, wins=1)]
    assert exam_text(None) == "no exam yet"
    assert exam_text(exams[-1]) == "v5: own words on 25% of moves (valid 50%) · 1.00 letters · 1 of 2 won in 3.0 guesses"
    assert exam_trend_text([]) == "—" and exam_trend_text(exams[:1]) == "0% (one exam, v0)"
    assert exam_trend_text(exams) == "25% (v0: 0%, up 25 pts over 2 exams)"
    assert exam_trend_text([exams[1], exam(9, 0.25)]) == "25% (v5: 25%, flat over 2 exams)"
    assert opponent_text("**policy v7**", exams[-1]).startswith(
        "Your opponent: **policy v7**; the latest exam up to its version is of **v5** (2 held-out words")
    assert "No exam yet" in opponent_text("**policy v3**", None)
    assert opponent_text("**policy v0**", None, "playing the exam of v0").endswith("Now: playing the exam of v0.")


def test_records_not_read_are_said_with_what_to_do() -> None:
    assert refused_exams_text({}) is None
    text = refused_exams_text({OTHER_KEY: 1, "torn or corrupt": 2, "invalid fields": 1})
    assert text.startswith("1 exam record signed with another token (not shown)")
    assert "ROLLOUT_TOKEN=… python app.py" in text and "delete exams/" in text
    assert text.endswith("3 damaged or invalid exam files skipped (invalid fields, torn or corrupt)")

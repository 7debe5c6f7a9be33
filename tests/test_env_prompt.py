import pytest

from env_space.prompt import (
    INSTRUCTIONS,
    feedback_line,
    invalid_line,
    next_move_text,
    parse_guess,
    result_text,
)
from env_space.rules import decode


@pytest.mark.parametrize(
    ("text", "word", "tagged"),
    [
        ("<guess>crane</guess>", "crane", True),
        ("<GUESS> CRANE </GUESS>", "crane", True),
        ("I think the answer is <guess>Crane.</guess> Good luck!", "crane", True),
        ("<guess>my guess is slate</guess>", "slate", True),
        ("<guess>**crane**</guess>", "crane", True),
        ("First <guess>slate</guess>, no wait: <guess>crane</guess>", "crane", True),
        ("Let me think.\n<guess>crane", "crane", True),  # stopped on the closing tag
        ("<think>maybe <guess>slate</guess>?</think>\n<guess>crane</guess>", "crane", True),
        ("<guess>cat</guess>", "cat", True),  # found; the word check rejects it later
        ("<guess>a b c</guess>", "c", True),
        ("CRANE", "crane", False),
        ("  crane.\n", "crane", False),
    ],
)
def test_parse_finds_the_guess(text: str, word: str, tagged: bool) -> None:
    parsed = parse_guess(text)
    assert (parsed.word, parsed.tagged, parsed.error) == (word, tagged, None)


@pytest.mark.parametrize(
    ("text", "tagged", "error"),
    [
        ("", False, "no guess found"),
        ("I would guess crane or slate", False, "no guess found"),
        ("<think>crane</think>", False, "no guess found"),
        ("<think>I am still thinking about <guess>crane</guess>", False, "no guess found"),
        ("<guess>  </guess>", True, "the <guess></guess> tags are empty"),
    ],
)
def test_parse_reports_missing_guesses(text: str, tagged: bool, error: str) -> None:
    parsed = parse_guess(text)
    assert parsed.word is None and parsed.tagged is tagged
    assert parsed.error is not None and parsed.error.startswith(error)


def test_parse_survives_huge_and_odd_input() -> None:
    assert parse_guess("<guess>" * 10_000).error is not None
    assert parse_guess("x" * 100_000).word == "x" * 100_000  # one word: found, rejected by the word check
    assert parse_guess("\x00<guess>crane</guess>\ud800").word == "crane"


def test_texts_for_the_model() -> None:
    assert "<guess>crane</guess>" in INSTRUCTIONS and "6 guesses" in INSTRUCTIONS
    assert feedback_line("crane", decode("GYXXG")) == (
        "CRANE 🟩🟨⬛⬛🟩 (C green, R yellow, A gray, N gray, E green)."
    )
    assert invalid_line("'xyzzy' is not in the word list") == (
        "Invalid move: 'xyzzy' is not in the word list. It did not use up a guess."
    )
    assert next_move_text(1) == "You have 1 guess left. Reply with your next guess inside <guess></guess>."
    assert result_text(True, "crane", 1) == "You won: the word was CRANE, found in 1 guess."
    assert result_text(False, "crane", 6) == "Game over (no guesses left): the word was CRANE."
    assert result_text(False, "crane", 2, too_many_invalid=True) == (
        "Game over (too many invalid moves): the word was CRANE."
    )

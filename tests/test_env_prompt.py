import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from env_space.prompt import INSTRUCTIONS, feedback_line, invalid_line, next_move_text, parse_guess, result_text
from wire.wordle import decode


@pytest.mark.parametrize(
    ("text", "word", "tagged"),
    [
        ("<guess>crane</guess>", "crane", True),
        ("<GUESS> CRANE </GUESS>", "crane", True),
        ("I think the answer is <guess>Crane.</guess> Good luck!", "crane", True),
        ("<guess>my guess is slate</guess>", "my", True),  # the first word, never one mined from the rest
        ("<guess>slate</guess> and more", "slate", True),
        ("<guess>crane (no particular rules", "crane", True),
        ("<guess> The next guess is Hercubunk", "the", True),  # the word check refuses THE
        ("<guess>**crane**</guess>", "crane", True),
        ("First <guess>slate</guess>, no wait: <guess>crane</guess>", "crane", True),
        ("Let me think.\n<guess>crane", "crane", True),  # stopped on the closing tag
        ("<think>maybe <guess>slate</guess>?</think>\n<guess>crane</guess>", "crane", True),
        ("<guess>cat</guess>", "cat", True),  # found; the word check rejects it later
        ("<guess>a b c</guess>", "a", True),
        ('<guess>\n"Slate",</guess>', "slate", True),
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
        ("<guess></guess> crane", True, "the <guess></guess> tags are empty"),
        ("<guess>crane</guess> <guess>", True, "nothing follows the <guess> tag"),
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
    assert next_move_text(1, "pious") == (
        "You have 1 guess left. Reply with your next guess inside <guess></guess>, for example <guess>pious</guess>."
    )
    assert result_text(True, "crane", 1) == "You won: the word was CRANE, found in 1 guess."
    assert result_text(False, "crane", 6) == "Game over (no guesses left): the word was CRANE."
    assert result_text(False, "crane", 2, too_many_invalid=True) == (
        "Game over (too many invalid moves): the word was CRANE."
    )


def test_the_tag_left_open_is_reported() -> None:
    assert parse_guess("<guess>crane (no particular rules").left_open
    assert not parse_guess("<guess>crane</guess> and more").left_open


_PIECES = st.sampled_from(["<guess>", "<GUESS>", "</guess>", "<think>", "</think>", " ", "\n", "crane", "Slate",
                           "the", "(", ".", "**", "<", ">", "x"])
_REPLIES = st.lists(st.one_of(_PIECES, st.text(max_size=6)), max_size=12).map("".join)


def _first_word_after_last_tag(reply: str) -> str | None:
    """The rule read off the reply by hand: the first run of non-space, non-'<' characters after the last
    <guess> outside <think> blocks, edge punctuation stripped; else the single bare word; else none."""
    visible = re.sub(r"<think>.*?(?:</think>|$)", " ", reply, flags=re.IGNORECASE | re.DOTALL)
    at = visible.lower().rfind("<guess>")
    if at >= 0:
        words = visible[at + len("<guess>"):].split("<")[0].split()
        word = words[0].strip("\"'`*_.,;:!?()[]{}<>").lower() if words else ""
        return word or None
    words = [w for w in (w.strip("\"'`*_.,;:!?()[]{}<>").lower() for w in visible.split()) if w]
    return words[0] if len(words) == 1 else None


@given(_REPLIES)
def test_the_scored_word_is_the_first_word_after_the_last_tag_or_the_single_bare_word(reply: str) -> None:
    parsed = parse_guess(reply)
    assert parsed.word == _first_word_after_last_tag(reply)
    assert (parsed.word is None) == (parsed.error is not None)


@given(st.text(), st.from_regex(r"[a-z]{5}", fullmatch=True), st.sampled_from(["</guess>", " ", "\n", ", "]),
       st.text())
def test_a_word_after_the_last_tag_is_the_guess_whatever_surrounds_it(before: str, word: str, end: str,
                                                                         after: str) -> None:
    after = after.replace("<", " ")  # no later tag: the one written here is the last
    reply = f"{before}</think><guess>{word}{end}{after}"
    assert parse_guess(reply).word == word

import pytest

from wire.wordle import CUT, Mark, decode, encode, is_win, letter_states, letters_found, progress, reply_excerpt, score


def code(guess: str, secret: str) -> str:
    return encode(score(guess, secret))


@pytest.mark.parametrize(
    ("guess", "secret", "expected"),
    [
        ("crane", "crane", "GGGGG"),
        ("fjord", "crane", "XXXYX"),
        ("react", "crane", "YYGYX"),
        # Repeated letter in the guess, once in the secret: only one copy is marked.
        ("speed", "abide", "XXYXY"),
        ("eerie", "sweet", "YYXXX"),
        # A later green claims the only copy, so the earlier copy goes gray, not yellow.
        ("eerie", "crane", "XXYXG"),
        ("lolly", "hello", "XYGGX"),
        ("geese", "eerie", "XGYXG"),
        # Two copies in the secret, none placed: both yellow.
        ("llama", "hello", "YYXXX"),
        ("hello", "llama", "XXYYX"),
        # Repeated in both: as many marks as the secret holds.
        ("sassy", "mossy", "XXGGG"),
        ("otter", "totem", "YYGGX"),
        ("abbey", "babes", "YYGGX"),
    ],
)
def test_score_duplicate_letters(guess: str, secret: str, expected: str) -> None:
    assert code(guess, secret) == expected


def test_score_rejects_different_lengths() -> None:
    with pytest.raises(ValueError, match="differ in length"):
        score("cat", "crane")


def test_encode_decode_round_trip_and_win() -> None:
    marks = decode("GYXXG")
    assert marks == (Mark.GREEN, Mark.YELLOW, Mark.GRAY, Mark.GRAY, Mark.GREEN)
    assert encode(marks) == "GYXXG"
    assert is_win(decode("GGGGG")) and not is_win(marks)
    with pytest.raises(ValueError):
        decode("GQ")


def test_letter_states_keeps_the_best_mark() -> None:
    rows = [("slate", decode("YXXXG")), ("spine", decode("GXXXG")), ("sissy", decode("GXXXX"))]
    states = letter_states(rows)
    assert states["s"] is Mark.GREEN  # yellow, then green: stays green after a later gray copy
    assert states["e"] is Mark.GREEN
    assert states["l"] is Mark.GRAY
    assert "z" not in states


def test_progress_counts_greens_and_half_yellows() -> None:
    assert progress(decode("XXXXX")) == 0.0
    assert progress(decode("GYXXX")) == pytest.approx(0.3)
    assert progress(decode("GGGGG")) == 1.0


def test_letters_found_is_the_best_guess_in_letters() -> None:
    assert letters_found([]) == 0.0  # no valid guess
    assert letters_found(["GYXXX", "XXXXX", "YYYYX"]) == 2.0  # the best guess, not the last or the sum
    assert letters_found(["GGGGG"]) == 5.0


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        ("<guess>crane</guess>", "<guess>crane</guess>"),  # fits: whole
        ("x" * 50 + "<guess>crane</guess>", CUT + "x" * 9 + "<guess>crane</guess>"),  # the end, with the guess
        ("a" * 20 + "<GUESS>crane " + "b" * 40, CUT + "a" * 9 + "<GUESS>crane " + "b" * 6 + CUT),  # around the tag
        ("<guess>old</guess> " + "y" * 10 + " <guess>crane", CUT + "uess> " + "y" * 10 + " <guess>crane"),  # the last
        ("no tag at all in this reply, only prose", "no tag at all in this reply, " + CUT),  # no guess: its start
    ],
)
def test_an_excerpt_keeps_the_text_around_the_guess(reply: str, expected: str) -> None:
    excerpt = reply_excerpt(reply, 30)
    assert excerpt == expected and len(excerpt) <= 30

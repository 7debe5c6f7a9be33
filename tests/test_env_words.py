import re

import pytest

from env_space.words import WordLists, load_word_lists


def test_shipped_lists_have_the_documented_sizes_and_shape() -> None:
    words = load_word_lists()
    assert len(words.answers) == 2000
    assert len(words.allowed) == 6748
    assert list(words.answers) == sorted(set(words.answers))
    assert all(re.fullmatch("[a-z]{5}", w) for w in words.allowed)
    assert set(words.answers) <= words.allowed


def test_pick_secret_is_reproducible_by_seed() -> None:
    words = load_word_lists()
    assert words.pick_secret(7) == words.pick_secret(7)
    assert len({words.pick_secret(seed) for seed in range(50)}) > 40
    assert words.pick_secret() in words.answers


@pytest.mark.parametrize(
    ("word", "error"),
    [
        ("crane", None),
        ("aalii", None),  # allowed though not an answer
        ("cran", "'cran' has 4 letters; a guess must have exactly 5"),
        ("cranes", "'cranes' has 6 letters; a guess must have exactly 5"),
        ("cr4ne", "'cr4ne' must contain only the letters a-z"),
        ("crâne", "'crâne' must contain only the letters a-z"),
        ("", "'' must contain only the letters a-z"),
        ("xyzzy", "'xyzzy' is not in the word list"),
        ("x" * 1000, "'xxxxxxxxxxxxxxxxxxxx...' has 1,000 letters; a guess must have exactly 5"),
    ],
)
def test_check_explains_illegal_guesses(word: str, error: str | None) -> None:
    assert load_word_lists().check(word) == error


def test_inconsistent_lists_are_refused() -> None:
    with pytest.raises(ValueError, match="answers missing from the allowed list"):
        WordLists(answers=("crane",), allowed=frozenset({"slate"}))
    with pytest.raises(ValueError, match="answer list is empty"):
        WordLists(answers=(), allowed=frozenset())

"""Wordle rules: how a guess is scored against the secret, and what the keyboard shows."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from enum import Enum

WORD_LENGTH = 5
MAX_GUESSES = 6
DEFAULT_MAX_INVALID_MOVES = 6
"""Invalid moves (which use up no guess) a game tolerates before it is lost; the UI sets no limit."""


class Mark(str, Enum):
    """Feedback for one letter of a guess; the value is its one-letter code on the wire."""

    GREEN = "G"  # right letter, right spot
    YELLOW = "Y"  # in the secret, at another spot
    GRAY = "X"  # not in the secret, or no copy of it left unaccounted for


_RANK = {Mark.GRAY: 0, Mark.YELLOW: 1, Mark.GREEN: 2}


def score(guess: str, secret: str) -> tuple[Mark, ...]:
    """Mark each letter of ``guess`` against ``secret`` with the official duplicate-letter rule.

    Greens are assigned first; then, left to right, a letter is yellow only while the secret still
    holds a copy of it not already claimed by a green or an earlier yellow. So ``score("llama",
    "hello")`` gives one yellow ``l`` and one gray ``l``.

    Raises:
        ValueError: if the two words differ in length.
    """
    if len(guess) != len(secret):
        raise ValueError(f"guess {guess!r} and secret {secret!r} differ in length")
    marks = [Mark.GRAY] * len(guess)
    unclaimed: Counter[str] = Counter()
    for i, (g, s) in enumerate(zip(guess, secret, strict=True)):
        if g == s:
            marks[i] = Mark.GREEN
        else:
            unclaimed[s] += 1
    for i, g in enumerate(guess):
        if marks[i] is not Mark.GREEN and unclaimed[g] > 0:
            marks[i] = Mark.YELLOW
            unclaimed[g] -= 1
    return tuple(marks)


def is_win(marks: Sequence[Mark]) -> bool:
    """True when every letter is green."""
    return all(m is Mark.GREEN for m in marks)


def encode(marks: Sequence[Mark]) -> str:
    """Marks as their wire code, e.g. ``"GYXXG"``."""
    return "".join(m.value for m in marks)


def decode(code: str) -> tuple[Mark, ...]:
    """Inverse of :func:`encode`; raises ``ValueError`` on an unknown letter."""
    return tuple(Mark(c) for c in code)


def letter_states(rows: Iterable[tuple[str, Sequence[Mark]]]) -> dict[str, Mark]:
    """The best mark seen for each letter over all scored guesses (what a Wordle keyboard shows).

    A letter once green stays green, even if a later guess placed it elsewhere.
    """
    best: dict[str, Mark] = {}
    for word, marks in rows:
        for letter, mark in zip(word, marks, strict=True):
            if letter not in best or _RANK[mark] > _RANK[best[letter]]:
                best[letter] = mark
    return best

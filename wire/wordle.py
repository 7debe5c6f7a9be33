"""Wordle as every player knows it: the board's size, how a guess is scored against the secret, the marks
as they travel (G/Y/X codes), the tags a reply writes its guess in, and how much of the secret a guess found.
The env scores with it; the rollout plays by it; the trainer and the UIs read its marks."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from enum import Enum

WORD_LENGTH = 5
MAX_GUESSES = 6
DEFAULT_MAX_INVALID_MOVES = 6
"""Invalid moves (which use up no guess) a game tolerates before it is lost; the UI sets no limit."""

#: The tag a guess opens with. A player may write it for a model (see `rollout_space.games.PlayParams`).
OPEN_TAG = "<guess>"
#: The tag that ends a guess; generation stops on it (`rollout_space.games.PlayParams.stop`).
CLOSE_TAG = "</guess>"


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


def progress(marks: Sequence[Mark]) -> float:
    """How close a scored guess is, in [0, 1]: (greens + yellows / 2) / length."""
    greens = sum(m is Mark.GREEN for m in marks)
    yellows = sum(m is Mark.YELLOW for m in marks)
    return (greens + 0.5 * yellows) / len(marks)


def letters_found(marks: Sequence[str]) -> float:
    """Letters a game found, in [0, 5]: the best (greens + yellows / 2) over its scored guesses (marks as
    G/Y/X codes), 0 with none. The progress term's potential in letters: what the trainer plots per step."""
    return max((progress(decode(code)) * len(code) for code in marks), default=0.0)


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


#: What marks the text an excerpt left out.
CUT = "…"


def reply_excerpt(text: str, chars: int) -> str:
    """At most `chars` characters of a reply, holding the guess: a reply that fits is whole; a longer one keeps the
    text around its last `<guess>` tag (where the env reads the guess, `env_space.parse_guess`), a third of the room
    before it, with `CUT` where text was left out; a reply without a tag keeps its start. A cut that kept the head of a
    reply dropped the scored word, and a reader could not see where it came from."""
    if chars < 3 * len(OPEN_TAG):
        raise ValueError(f"an excerpt needs room for a tag and its word: chars >= {3 * len(OPEN_TAG)}, got {chars}")
    if len(text) <= chars:
        return text
    tag = text.lower().rfind(OPEN_TAG)
    if tag < 0:
        return text[: chars - len(CUT)] + CUT
    start = max(0, min(tag - chars // 3, len(text) - chars))
    end = start + chars
    head = CUT if start > 0 else ""
    tail = CUT if end < len(text) else ""
    return head + text[start + len(head) : end - len(tail)] + tail

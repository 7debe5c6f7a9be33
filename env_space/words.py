"""The word lists shipped in ``env_space/data`` (built by ``data/build_words.py``), the answers held out for
exams, and word checks."""

from __future__ import annotations

import functools
import random
from collections.abc import Collection
from dataclasses import dataclass
from importlib import resources

from dashboard.labels import counted
from wire.exam import HELD_OUT_SECRETS
from wire.wordle import WORD_LENGTH


@dataclass(frozen=True)
class WordLists:
    """Answers the secret is drawn from, and the larger set of words a guess may be.

    A fixed set of answers is held out for exams (`exam_secrets`): no seeded or random game ever plays
    one, and no message ever shows one as its example, so a policy can meet them only in an exam.
    """

    answers: tuple[str, ...]
    allowed: frozenset[str]

    def __post_init__(self) -> None:
        if not self.answers:
            raise ValueError("the answer list is empty; rebuild env_space/data with build_words.py")
        missing = [w for w in self.answers if w not in self.allowed]
        if missing:
            raise ValueError(f"answers missing from the allowed list, e.g. {missing[:3]}")

    @functools.cached_property
    def exam_secrets(self) -> tuple[str, ...]:
        """The answers held out for exams, in the order exams play them: `HELD_OUT_SECRETS` answers (half the
        list when it is shorter) drawn once by a fixed seed, so every env holds out the same words."""
        return tuple(random.Random("exam secrets").sample(self.answers, min(HELD_OUT_SECRETS, len(self.answers) // 2)))

    @functools.cached_property
    def training_answers(self) -> tuple[str, ...]:
        """The answers a game may draw as its secret, and a message may show as its example: all but the
        exam's."""
        held_out = set(self.exam_secrets)
        return tuple(w for w in self.answers if w not in held_out)

    def pick_secret(self, seed: int | None = None) -> str:
        """A random answer, never an exam's; the same seed always gives the same word (for reproducible
        episodes)."""
        return random.Random(seed).choice(self.training_answers)

    def example(self, secret: str, moves_made: int, board: Collection[str]) -> str:
        """The example word of the request that follows `moves_made` moves of a game against `secret`: an
        answer that is neither the secret, nor on `board`, nor an exam's, the same for the same arguments (so
        games of one GRPO group that played alike read the same text), drawn afresh for each move."""
        pool = self.training_answers
        candidates = [w for w in pool if w != secret and w not in board] or list(pool)
        return random.Random(f"{secret}:{moves_made}").choice(candidates)

    def right_shape(self, word: str) -> bool:
        """Whether ``word`` has a guess's shape (five letters a-z) without being in the list: what the
        ``five_letters`` reward term pays back part of the penalty for."""
        return len(word) == WORD_LENGTH and word.isascii() and word.isalpha() and word not in self.allowed

    def check(self, word: str) -> str | None:
        """Why ``word`` is not a legal guess, or None when it is. ``word`` is expected lowercase."""
        shown = repr(word if len(word) <= 20 else word[:20] + "...")
        if not word.isascii() or not word.isalpha():
            return f"{shown} must contain only the letters a-z"
        if len(word) != WORD_LENGTH:
            return f"{shown} has {counted(len(word), 'letter')}; a guess must have exactly {WORD_LENGTH}"
        if word not in self.allowed:
            return f"{shown} is not in the word list"
        return None


def _read(name: str) -> list[str]:
    text = (resources.files(__package__) / "data" / name).read_text(encoding="utf-8")
    return [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]


@functools.cache
def load_word_lists() -> WordLists:
    """The shipped lists, read once per process."""
    return WordLists(answers=tuple(_read("answers.txt")), allowed=frozenset(_read("allowed.txt")))

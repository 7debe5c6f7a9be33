"""Which of a game's messages show their example word, for a session's probability (`wire.curriculum`).

The draw is a pure function of the secret, the move's number and the probability: the games of one GRPO
group (one secret) read the same messages when they played alike, and as the probability falls, the
messages that still show an example are a subset of those that showed one before (a message shows its
example when its fixed number in [0, 1) is below the probability).
"""

from __future__ import annotations

import hashlib


def draw(secret: str, moves_made: int) -> float:
    """The fixed number in [0, 1) of the message that follows `moves_made` moves of a game against `secret`."""
    digest = hashlib.sha256(f"example:{secret}:{moves_made}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def shows_example(secret: str, moves_made: int, probability: float) -> bool:
    """Whether the message after `moves_made` moves (0: the instructions) shows an example word."""
    return probability >= 1.0 or draw(secret, moves_made) < probability

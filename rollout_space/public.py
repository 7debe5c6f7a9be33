"""Caps on the policy games visitors start from the rollout's UI ("let the policy play", matches):
per client address and in all, queued games included, so the UI's queue stays bounded."""

from __future__ import annotations

import threading
from collections import Counter


class PublicLimitError(RuntimeError):
    """A visitor asked for a policy game past a cap; the message says what to do."""


class PublicPlay:
    """Slots for visitors' policy games. Thread-safe.

    Args:
        per_client: Games (queued or playing) of one address at most.
        total: Games (queued or playing) of all visitors at most.
    """

    def __init__(self, per_client: int = 1, total: int = 8) -> None:
        if per_client < 1 or total < per_client:
            raise ValueError(f"need 1 <= per_client <= total, got {per_client} and {total}")
        self.per_client = per_client
        self.total = total
        self._lock = threading.Lock()
        self._held: Counter[str] = Counter()

    def acquire(self, client: str) -> None:
        """Take a slot for ``client``; give it back with :meth:`release` once the game ends or is dropped.

        Raises:
            PublicLimitError: the client's or everyone's cap is reached.
        """
        with self._lock:
            if self._held[client] >= self.per_client:
                raise PublicLimitError(
                    f"you already have {self._held[client]} policy game(s) queued or playing "
                    "(the cap per visitor): wait for it to end, or close its match"
                )
            if sum(self._held.values()) >= self.total:
                raise PublicLimitError(
                    f"{self.total} visitors' policy games are queued or playing (the cap): try again in a minute"
                )
            self._held[client] += 1

    def release(self, client: str) -> None:
        """Give back a slot taken by :meth:`acquire`."""
        with self._lock:
            self._held[client] -= 1
            if self._held[client] <= 0:
                del self._held[client]

"""One retry policy for every network call of the project: waits that double from a first delay up to
a longest one, each shortened by a random factor in [0.5, 1] so that many clients do not come back at
the same instant.

It is used at two levels, never more: a storage call retries within `attempts` (seconds), and the
loops that must not give up (the publisher's version, the subscriber's poll, the trainer's rollout
request) retry on the same schedule without a limit (`attempts=None`) until they succeed or are stopped.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from .errors import RateLimitedError


@dataclass(frozen=True)
class RetryPolicy:
    """How a call is retried while the other side cannot be reached.

    With the defaults a call gives up after about 8 s of waiting plus the time of its 5 attempts.

    Attributes:
        attempts: How many times a call is tried in all; 1 disables retries; None retries until the
            caller stops (its loop decides).
        first_delay: Seconds to wait before the second attempt.
        max_delay: Longest wait between two attempts, in seconds.
    """

    attempts: int | None = 5
    first_delay: float = 0.5
    max_delay: float = 4.0

    def __post_init__(self) -> None:
        if self.attempts is not None and self.attempts < 1:
            raise ValueError(f"RetryPolicy.attempts must be at least 1 (1 = no retry), got {self.attempts}")
        if self.first_delay < 0 or self.max_delay < 0:
            raise ValueError(
                "RetryPolicy delays must be >= 0 seconds, "
                f"got first_delay={self.first_delay}, max_delay={self.max_delay}"
            )

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based)."""
        return min(self.max_delay, self.first_delay * 2 ** min(attempt - 1, 62)) * random.uniform(0.5, 1.0)

    def retries_after(self, attempt: int) -> bool:
        """Whether failed attempt number `attempt` is tried again."""
        return self.attempts is None or attempt < self.attempts

    def delay_after(self, error: BaseException | None, attempt: int) -> float:
        """Seconds to wait after failed attempt number `attempt` failed with `error`: `delay(attempt)`, or longer
        where the server said when to come back (`RateLimitedError.retry_at`)."""
        wait = self.delay(attempt)
        if isinstance(error, RateLimitedError):
            wait = max(wait, error.retry_at - time.time())
        return wait

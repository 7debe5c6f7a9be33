"""What a bucket costs in requests: counts by the server's classes, and the rate limit the server reported.

A Hugging Face account is allowed so many requests per class in fixed 5-minute windows (API calls, `/resolve/`
requests), shared by every process of the account; S3 bills requests by kind (PUT/COPY/POST/LIST against GET/HEAD).
Every backend counts what it sends inside its own calls (`Storage.traffic`), so the apps can show requests per 5
minutes beside the account's limit, and a benchmark can price a run. A `delta.Bucket` owns one and passes it to its
storage; whatever shares the bucket object shares it, so a 429 seen by one reader holds them all back until the time
the server named, instead of each spending requests to learn the same thing.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass

#: The window the Hub counts requests in (seconds).
WINDOW_S = 300.0
#: Waited after a 429 that names no time (neither `RateLimit` nor `Retry-After`).
DEFAULT_RATE_LIMIT_WAIT_S = 60.0
#: Added to a server's wait, at random up to this share of it, so that the clients held back together do not all
#: come back in the same second.
_JITTER = 0.1


@dataclass(frozen=True)
class RateLimit:
    """The limit a server reported in its last `RateLimit` / `RateLimit-Policy` headers.

    Attributes:
        resource: The class the limit is for ("api", "resolver", ...).
        remaining: Requests left in the window.
        reset_at: Unix time the window ends.
        limit: Requests allowed per window, where the policy header says.
        window_s: The window's length in seconds, where the policy header says.
        seen_at: Unix time of the reply that carried it.
    """

    resource: str
    remaining: int
    reset_at: float
    limit: int | None = None
    window_s: int | None = None
    seen_at: float = 0.0


@dataclass(frozen=True)
class TrafficSnapshot:
    """A `Traffic` at one moment, for status pages and benchmarks.

    Attributes:
        total: Requests sent since the process started, by class.
        last_window: Requests sent in the last `WINDOW_S` seconds, by class.
        limits: The latest rate limit each class reported, by class.
        throttled_until: Unix time before which nothing is sent (a 429 was answered), or None.
        throttled_by: What the server said when it throttled, or None.
        rate_limited: 429 answers received since the process started.
    """

    total: dict[str, int]
    last_window: dict[str, int]
    limits: dict[str, RateLimit]
    throttled_until: float | None
    throttled_by: str | None
    rate_limited: int

    def to_json(self) -> dict:
        """Plain JSON for `/status` routes."""
        return {
            "total": self.total,
            "last_5min": self.last_window,
            "rate_limited": self.rate_limited,
            "throttled_until": self.throttled_until,
            "throttled_by": self.throttled_by,
            "limits": {
                k: {"remaining": v.remaining, "limit": v.limit, "window_s": v.window_s, "reset_at": v.reset_at}
                for k, v in self.limits.items()
            },
        }


class Traffic:
    """Requests sent to one server, by class, and whether it asked to slow down. Thread-safe.

    Attributes:
        classes: The classes this server counts in, in display order ("api", "resolver", "transfer" for the Hub).
    """

    def __init__(self, classes: tuple[str, ...]) -> None:
        self.classes = classes
        self._lock = threading.Lock()
        self._total: Counter[str] = Counter()
        self._recent: deque[tuple[float, str]] = deque()
        self._limits: dict[str, RateLimit] = {}
        self._until: float | None = None
        self._by: str | None = None
        self._rate_limited = 0

    def count(self, kind: str, n: int = 1) -> None:
        """Count `n` requests of class `kind` sent now."""
        now = time.monotonic()
        with self._lock:
            self._total[kind] += n
            self._recent.extend([(now, kind)] * n)
            self._trim(now)

    def saw_limit(self, limit: RateLimit) -> None:
        """Keep the rate limit a reply reported (its class's latest)."""
        with self._lock:
            self._limits[limit.resource] = limit

    def throttle(self, seconds: float | None, reason: str) -> float:
        """A 429: hold every caller back for `seconds` (None: the default wait), plus a random tenth. Returns the
        unix time until which nothing is sent; a later time already set stands."""
        wait = DEFAULT_RATE_LIMIT_WAIT_S if seconds is None else max(0.0, seconds)
        until = time.time() + wait * (1 + random.uniform(0, _JITTER))
        with self._lock:
            self._rate_limited += 1
            if self._until is None or until > self._until:
                self._until, self._by = until, reason
            return self._until

    def held_until(self) -> float | None:
        """Unix time before which nothing is to be sent, or None when the server has not asked to wait."""
        with self._lock:
            if self._until is not None and self._until <= time.time():
                self._until = self._by = None
            return self._until

    def snapshot(self) -> TrafficSnapshot:
        now = time.monotonic()
        held = self.held_until()
        with self._lock:
            self._trim(now)
            recent = Counter(kind for _, kind in self._recent)
            return TrafficSnapshot(
                {c: self._total[c] for c in self._names()},
                {c: recent[c] for c in self._names()},
                dict(self._limits),
                held,
                self._by if held is not None else None,
                self._rate_limited,
            )

    def _names(self) -> list[str]:
        return [*self.classes, *sorted(set(self._total) - set(self.classes))]

    def _trim(self, now: float) -> None:
        while self._recent and self._recent[0][0] < now - WINDOW_S:
            self._recent.popleft()

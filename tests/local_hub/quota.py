"""An optional real rate limit, the Hub's way: a number of requests per account and class in fixed windows.

The Hub counts per account (anonymous callers per address) over fixed 5-minute windows and answers 429 with
`RateLimit` / `RateLimit-Policy` headers once a class's quota is spent (huggingface.co/docs/hub/rate-limits). It
also sends those headers on answers that were allowed; so does this (with the remaining count). Classes without a
quota (the CAS here) are never limited. Window boundaries are multiples of the window since the epoch (inferred:
the Hub does not document where its windows start).
"""

from __future__ import annotations

import math
from collections import Counter

from .faults import ratelimit_headers


class Quota:
    """Fixed-window counters; `config` is `Settings.quota` (`{"window_s": 300, "api": 1000, ...}`) or None."""

    def __init__(self) -> None:
        self._used: Counter[tuple[str, str, int]] = Counter()

    def check(self, config: dict[str, int] | None, who: str, cls: str, now: float) -> tuple[bool, dict[str, str]]:
        """Count one request of `who` in `cls`.

        Returns:
            Whether it is allowed, and the headers to send either way (none when `cls` has no quota).
        """
        if not config or cls not in config:
            return True, {}
        window = int(config.get("window_s", 300))
        limit = int(config[cls])
        start = int(now // window) * window
        key = (who, cls, start)
        if self._used[key] >= limit:
            allowed = False
        else:
            self._used[key] += 1
            allowed = True
        remaining = limit - self._used[key]
        reset = max(1, math.ceil(start + window - now))
        return allowed, ratelimit_headers(cls, remaining=remaining, reset_s=reset, limit=limit, window_s=window)

    def reset(self) -> None:
        self._used.clear()

"""How long a loop that polls a bucket waits before its next look: one rule for the subscriber, the follow loops and
the apps' monitors.

Every look is a request against the bucket's server, and on the Hub against an account's quota that every Space of
the account shares: a loop that found nothing new looks again less and less often (up to `idle_max`) and comes back to
its interval at the first change; a loop that failed backs off (doubling, with jitter, so that many clients do not
come back in the same second); a loop the server asked to slow down (`RateLimitedError`) waits until the time the
server named.

    backoff = Backoff(interval=1.0, max_delay=30.0, idle_max=8.0)
    while not stop.is_set():
        try:
            backoff.succeeded(changed=look())
        except OSError as error:
            backoff.failed(error)
        backoff.wait(stop)
"""

from __future__ import annotations

import threading
import time

from .retry import RetryPolicy

__all__ = ["Backoff"]


class Backoff:
    """The wait before a polling loop's next look (see the module docstring). Used by one loop (one thread).

    Args:
        interval: Seconds between looks while things change.
        max_delay: Longest wait after failures (they double from `2 * interval`, with jitter).
        idle_max: Longest wait while nothing changes (looks that found nothing new double the wait from `interval`);
            None or `interval`: never stretched.
        after_change: The wait after a look that found something new, for a source that cannot change again sooner
            (a publisher on the Hub commits at most one version per `PublisherConfig.min_interval`); the waits then
            go on from `interval`. Once two changes were seen, the time between them where longer (up to
            `idle_max`): a source that changes at a steady pace slower than that (a trainer's steps) is looked at
            when its next change is due, not every `interval` from `after_change` on. None: `interval`.

    Attributes:
        failures: Failed looks in a row (0 after a look that succeeded).
    """

    def __init__(
        self, interval: float, max_delay: float, idle_max: float | None = None, after_change: float | None = None
    ) -> None:
        if interval <= 0 or max_delay < interval:
            raise ValueError(f"need 0 < interval <= max_delay, got {interval} and {max_delay}")
        if idle_max is not None and idle_max < interval:
            raise ValueError(f"idle_max must be >= interval ({interval}), got {idle_max}")
        if after_change is not None and after_change < interval:
            raise ValueError(f"after_change must be >= interval ({interval}), got {after_change}")
        self.interval = interval
        self.idle_max = idle_max if idle_max is not None else interval
        self.after_change = after_change
        self.failures = 0
        self._quiet = 0
        self._changed_at: float | None = None  # monotonic time of the last look that found something new
        self._pace: float | None = None  # seconds between the last two such looks
        self._error: BaseException | None = None
        self._policy = RetryPolicy(None, min(2 * interval, max_delay), max_delay)

    def succeeded(self, changed: bool = True) -> None:
        """The look worked; `changed`: it found something new (the wait goes back to `interval`)."""
        self.failures, self._error = 0, None
        self._quiet = 0 if changed else min(self._quiet + 1, 62)
        if changed:
            now = time.monotonic()
            if self._changed_at is not None:
                self._pace = now - self._changed_at
            self._changed_at = now

    def failed(self, error: BaseException | None = None) -> None:
        """The look failed, with `error` where one was raised (a `RateLimitedError` sets the earliest time of the
        next look)."""
        self.failures += 1
        self._error = error

    def delay(self) -> float:
        """Seconds to wait now."""
        if self.failures:
            return self._policy.delay_after(self._error, self.failures)
        if self.after_change is None:
            return min(self.idle_max, self.interval * 2**self._quiet)
        if self._quiet == 0:
            return self.after_change if self._pace is None else max(self.after_change, min(self.idle_max, self._pace))
        return min(self.idle_max, self.interval * 2 ** (self._quiet - 1))

    def wait(self, stop: threading.Event) -> bool:
        """Wait `delay()` seconds, or until `stop` is set; True if it was."""
        return stop.wait(self.delay())

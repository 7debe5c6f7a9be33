"""A call repeated every few seconds in a daemon thread: how the apps keep what they read from the bucket fresh
without making a page wait for the bucket (the trainer's exams and fleet table, a rollout server's view of the run's
settings, the trainer's measure of each delta).

The waits are `delta.poll.Backoff`'s, the subscriber's own: `interval` while something changes, stretched up to
`idle_max` while nothing does, backing off after failures, and never before the time a bucket that asked to slow
down named (`delta.RateLimitedError`): every read of the bucket counts against an account's quota on the Hub.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from delta.poll import Backoff


class Periodic:
    """Calls `fn` at once, then again and again in a daemon thread until `close` (see the module docstring).

    Args:
        fn: The call. It returns whether it found something new (None: unknown, taken as new). What it raises is
            the owner's to log (it runs in the thread, never in the caller's): the thread goes on after a wait.
        interval: Seconds between two calls while they find something new.
        name: The thread's name.
        idle_max: Longest wait while they find nothing new (None: `interval`).
        max_delay: Longest wait after failures.
    """

    def __init__(
        self,
        fn: Callable[[], bool | None],
        interval: float,
        name: str,
        idle_max: float | None = None,
        max_delay: float = 60.0,
    ) -> None:
        self.fn = fn
        self.backoff = Backoff(interval, max(max_delay, interval, idle_max or 0.0), idle_max)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> Periodic:
        self._thread.start()
        return self

    def close(self, timeout: float = 10.0) -> bool:
        """Stop after the call in flight, waiting at most `timeout` seconds for it; whether the thread ended."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)
        return not self._thread.is_alive()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                changed = self.fn()
            except Exception as error:  # noqa: BLE001 - the owner logged it; the thread goes on, waiting longer
                self.backoff.failed(error)
            else:
                self.backoff.succeeded(changed is not False)
            self.backoff.wait(self._stop)

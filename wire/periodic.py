"""A call repeated every few seconds in a daemon thread: how the apps keep what they read from the bucket fresh
without making a page wait for the bucket (the trainer's exams, a rollout server's view of the run's settings)."""

from __future__ import annotations

import threading
from collections.abc import Callable


class Periodic:
    """Calls `fn` at once, then every `interval` seconds, in a daemon thread, until `close`.

    `fn` must not raise (a failure ends the thread); it runs in the thread, never in the caller's.
    """

    def __init__(self, fn: Callable[[], None], interval: float, name: str) -> None:
        self.fn = fn
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def start(self) -> Periodic:
        self._thread.start()
        return self

    def close(self, timeout: float = 10.0) -> None:
        """Stop after the call in flight, waiting at most `timeout` seconds for it."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.fn()
            self._stop.wait(self.interval)

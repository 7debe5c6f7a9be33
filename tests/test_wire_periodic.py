"""The apps' periodic reader: called at once, then on its interval, in its own thread, until closed."""

from __future__ import annotations

import threading
import time

from wire.periodic import Periodic


def test_it_calls_at_once_then_on_its_interval_in_its_own_thread_until_closed() -> None:
    calls: list[str] = []
    first = threading.Event()

    def call() -> None:
        calls.append(threading.current_thread().name)
        first.set()

    periodic = Periodic(call, 0.05, "reader").start()
    assert first.wait(10)
    time.sleep(0.5)
    periodic.close()
    done = len(calls)
    time.sleep(0.2)
    assert len(calls) == done >= 3 and set(calls) == {"reader"}
    Periodic(call, 1.0, "never-started").close()  # closing one that never started is fine

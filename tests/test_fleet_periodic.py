"""The apps' periodic reader: called at once, then on its interval, in its own thread, until closed."""

from __future__ import annotations

import threading
import time

from fleet.periodic import Periodic


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


def test_it_waits_longer_while_nothing_changes_and_after_failures_and_never_before_a_rate_limit_ends() -> None:
    from delta.errors import RateLimitedError

    times: list[float] = []
    outcomes = iter([True, False, False, False, "fail", True, "limit", True] + [True] * 100)

    def call() -> bool:
        times.append(time.monotonic())
        outcome = next(outcomes)
        if outcome == "fail":
            raise OSError("the bucket did not answer")
        if outcome == "limit":
            raise RateLimitedError("429", url="b", retry_at=time.time() + 0.6)
        return bool(outcome)

    periodic = Periodic(call, 0.05, "reader", idle_max=0.2).start()
    deadline = time.monotonic() + 10
    while len(times) < 9 and time.monotonic() < deadline:
        time.sleep(0.01)
    periodic.close()
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert 0.04 <= gaps[0] < 0.09  # after a change: the interval
    assert gaps[1] > gaps[0] * 1.5 and 0.18 <= gaps[3] < 0.3  # nothing new: doubling, up to idle_max
    assert 0.04 <= gaps[4] < 0.15  # a failure: backing off from twice the interval (with jitter)
    assert gaps[6] >= 0.55  # a rate limit: not before the time the bucket named
    assert 0.04 <= gaps[7] < 0.09  # and back to the interval once things change

"""delta.poll.Backoff: the wait of every loop that polls a bucket."""

from __future__ import annotations

import time

import pytest

from delta.errors import RateLimitedError
from delta.poll import Backoff


def test_the_wait_stretches_while_nothing_changes_and_comes_back_at_the_first_change() -> None:
    backoff = Backoff(1.0, 30.0, idle_max=8.0)
    assert backoff.delay() == 1.0
    waits = []
    for _ in range(6):
        backoff.succeeded(changed=False)
        waits.append(backoff.delay())
    assert waits == [2.0, 4.0, 8.0, 8.0, 8.0, 8.0]
    backoff.succeeded(changed=True)
    assert backoff.delay() == 1.0
    assert Backoff(1.0, 30.0).delay() == 1.0 and not Backoff(1.0, 30.0).failures  # idle_max None: never stretched


def test_after_a_change_a_source_that_cannot_change_sooner_is_looked_at_once_it_may_have() -> None:
    backoff = Backoff(2.0, 30.0, idle_max=16.0, after_change=15.0)  # a Hub publisher: a version every 15 s at most
    waits = []
    for changed in [True, False, False, False, False, False, True, False]:
        backoff.succeeded(changed=changed)
        waits.append(backoff.delay())
    assert waits == [15.0, 2.0, 4.0, 8.0, 16.0, 16.0, 15.0, 2.0]
    backoff.failed(OSError("down"))
    assert 2.0 <= backoff.delay() <= 4.0  # failures back off as without it


def test_after_a_change_a_source_with_a_steady_pace_is_looked_at_when_its_next_change_is_due(monkeypatch) -> None:
    """Versions every 20 s (a trainer's steps, slower than the publisher's 15 s): after the second, the first look
    waits the 20 s seen between them, not 15 s and then 2 s more and 4 s more; never past `idle_max`, and never below
    `after_change` for a source that changed sooner."""
    clock = [1000.0]
    monkeypatch.setattr("delta.poll.time.monotonic", lambda: clock[0])
    backoff = Backoff(2.0, 30.0, idle_max=24.0, after_change=15.0)
    waits = []
    for at, changed in [(0, True), (15, False), (17, False), (21, True), (41, True), (71, True), (76, True)]:
        clock[0] = 1000.0 + at
        backoff.succeeded(changed=changed)
        waits.append(backoff.delay())
    assert waits == [15.0, 2.0, 4.0, 21.0, 20.0, 24.0, 15.0]
    assert Backoff(2.0, 30.0, idle_max=24.0).delay() == 2.0  # without `after_change`: no pace is kept to


def test_failures_back_off_with_jitter_and_a_rate_limit_sets_the_earliest_next_look() -> None:
    backoff = Backoff(1.0, 30.0, idle_max=8.0)
    for n, longest in [(1, 2.0), (2, 4.0), (3, 8.0), (4, 16.0), (5, 30.0), (6, 30.0)]:
        backoff.failed(OSError("down"))
        assert backoff.failures == n and longest / 2 <= backoff.delay() <= longest
    backoff.failed(RateLimitedError("429", url="b", retry_at=time.time() + 100))
    assert 99 <= backoff.delay() <= 100
    backoff.succeeded(changed=False)
    assert backoff.failures == 0 and backoff.delay() == 2.0


def test_its_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="need 0 < interval <= max_delay"):
        Backoff(0.0, 1.0)
    with pytest.raises(ValueError, match="idle_max must be >= interval"):
        Backoff(2.0, 30.0, idle_max=1.0)
    with pytest.raises(ValueError, match="after_change must be >= interval"):
        Backoff(2.0, 30.0, after_change=1.0)

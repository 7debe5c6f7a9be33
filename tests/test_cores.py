"""`delta._cores`: how work is cut for the threads, and the typed lists each thread gets for itself."""

from __future__ import annotations

import re
import threading

import numpy as np
import pytest

from delta._cores import PerThread, Started, cut, default_workers, in_threads, resolve_workers, slices


def test_cut_makes_contiguous_nonempty_ranges_of_about_equal_cost() -> None:
    costs = np.array([5, 1, 1, 1, 8, 1, 1, 1, 1, 1], np.int64)
    spans = cut(costs, 3)
    assert len(spans) == 3 and spans[0][0] == 0 and spans[-1][1] == costs.size
    assert all(lo < hi for lo, hi in spans) and all(a[1] == b[0] for a, b in zip(spans, spans[1:]))
    assert cut(costs, 50) == [(i, i + 1) for i in range(costs.size)]  # never more ranges than rows
    assert len(slices(np.ones(1000), 2)) == 8  # a few ranges per worker


def test_each_thread_gets_lists_of_its_own_over_the_same_arrays() -> None:
    """Two threads never share a typed list (a shared list's reference counts made a 2-thread scan ~2x the
    work), and a thread asking again gets the lists it made."""
    arrays = [np.arange(5, dtype=np.uint16), np.arange(7, dtype=np.uint16)]
    per_thread = PerThread(arrays, arrays)
    mine = per_thread.lists()
    assert per_thread.lists() is mine and mine[0] is not mine[1]
    theirs = []
    worker = threading.Thread(target=lambda: theirs.append(per_thread.lists()))
    worker.start()
    worker.join()
    assert theirs[0][0] is not mine[0]
    for lists in (mine, theirs[0]):
        assert [a.tolist() for a in lists[0]] == [a.tolist() for a in arrays]


def test_in_threads_runs_every_span_on_the_workers_and_keeps_the_order() -> None:
    """Two spans that each wait for the other can only finish on two threads at once (the caller and a kept
    thread); results come back in span order."""
    meet = threading.Barrier(2, timeout=10)
    ran = []

    def span(lo: int, hi: int) -> tuple[int, int]:
        if lo < 2:
            meet.wait()
        ran.append(threading.get_ident())
        return lo, hi

    spans = [(i, i + 1) for i in range(6)]
    assert in_threads(span, spans, 2) == spans
    assert len(ran) == 6 and len(set(ran)) <= 2
    assert in_threads(span, [(5, 6)], 2) == [(5, 6)]  # one span: on the caller's thread


def test_in_threads_runs_every_span_before_raising_the_first_failure() -> None:
    ran = []

    def span(lo: int, hi: int) -> int:
        ran.append(lo)
        if lo in (1, 3):
            raise ValueError(f"span {lo}")
        return lo

    with pytest.raises(ValueError, match="span 1"):
        in_threads(span, [(i, i + 1) for i in range(8)], 2)
    assert sorted(ran) == list(range(8))


def test_started_as_a_block_joins_on_leaving_it_and_raises_a_failed_span() -> None:
    ran = []

    def span(lo: int, hi: int) -> int:
        ran.append(lo)
        if lo == 2:
            raise ValueError("span 2")
        return lo

    with pytest.raises(ValueError, match="span 2"):
        with Started(span, [(i, i + 1) for i in range(6)], 2):
            pass  # no join: leaving the block joins
    assert sorted(ran) == list(range(6))


def test_started_notes_a_failed_span_on_the_blocks_own_error() -> None:
    def span(lo: int, hi: int) -> None:
        raise ValueError(f"span {lo}")

    with pytest.raises(KeyError) as caught:
        with Started(span, [(0, 1), (1, 2)], 2):
            raise KeyError("the block's")
    assert caught.value.__notes__ == ["a started span failed too: ValueError('span 0')"]


@pytest.mark.parametrize("workers", [0, -2])
def test_workers_are_checked_in_one_place(workers: int) -> None:
    with pytest.raises(ValueError, match=re.escape(f"workers must be >= 1 (or None: one per core), got {workers}")):
        resolve_workers(workers)
    assert resolve_workers(None) == default_workers() and resolve_workers(3) == 3

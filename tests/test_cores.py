"""`delta._cores`: how work is cut for the threads, and the typed lists each thread gets for itself."""

from __future__ import annotations

import threading

import numpy as np

from delta._cores import PerThread, cut, slices


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

"""How the compiled host code is spread over the cores: how many threads by default, how a table of work is cut
into a few ranges per thread, and the threads that run one compiled call per range. Shared by every layer."""

from __future__ import annotations

import functools
import itertools
import os
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Generic, TypeVar

import numba
import numpy as np
from numba import types
from numba.typed import List

R = TypeVar("R")

#: Ranges of work per thread (`slices`): enough for the threads to even out, few enough to cost nothing.
SLICES_PER_WORKER = 4


def default_workers() -> int:
    """Threads for coding and hashing: the cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def resolve_workers(workers: int | None) -> int:
    """The threads a call given `workers` runs on: one per core for None. The one check of every `workers` the
    library takes (configs, diff, apply, hashes, codecs), so that each says the same.

    Raises:
        ValueError: `workers` is below 1.
    """
    if workers is None:
        return default_workers()
    if workers < 1:
        raise ValueError(f"workers must be >= 1 (or None: one per core), got {workers}")
    return workers


def typed(arrays: Sequence[np.ndarray]) -> List:
    """A numba typed list of contiguous arrays of one dtype and dimension (what the compiled calls take for "many
    tensors"); its item type is made once per kind (inferring it from the first item costs milliseconds)."""
    out = List.empty_list(_array_type(arrays[0].dtype, arrays[0].ndim))
    for a in arrays:
        out.append(a)
    return out


@functools.cache
def _array_type(dtype: np.dtype, ndim: int) -> types.Array:
    return types.Array(numba.from_dtype(dtype), ndim, "C")


class PerThread:
    """Typed lists (`typed`) of the same arrays, made once by each thread that asks for them.

    An array taken from a typed list inside compiled code shares the list's reference count, which the code
    bumps whenever it passes the array on (in a scan, at every changed element): two threads on one tensor
    through one list fight over that count's cache line, which can cost more than the scan itself
    (docs/benchmarks.md). A list of its own per thread gives each its own counts.
    """

    def __init__(self, *groups: Sequence[np.ndarray]) -> None:
        self._groups = groups
        self._local = threading.local()

    def lists(self) -> tuple[List, ...]:
        """This thread's lists, one per group of arrays given."""
        made = getattr(self._local, "lists", None)
        if made is None:
            made = self._local.lists = self._made()
        return made

    def _made(self) -> tuple[List, ...]:
        return tuple(typed(g) for g in self._groups)


def cut(costs: np.ndarray, parts: int) -> list[tuple[int, int]]:
    """Contiguous [lo, hi) ranges of the rows, exactly min(`parts`, rows) of them and none empty, of about equal
    total cost (each row costs at least 1)."""
    n = int(costs.size)
    if n == 0:
        return []
    parts = max(1, min(int(parts), n))
    total = np.cumsum(np.asarray(costs, np.float64) + 1.0)
    k = np.arange(1, parts)
    bounds = np.clip(np.searchsorted(total, total[-1] * k / parts, side="right"), k, n - parts + k)
    bounds = np.maximum.accumulate(bounds - k) + k  # strictly increasing: no empty range
    edges = np.concatenate([[0], bounds, [n]]).tolist()
    return list(itertools.pairwise(edges))


def slices(costs: np.ndarray, workers: int) -> list[tuple[int, int]]:
    """The rows cut for `workers` threads: `SLICES_PER_WORKER` ranges of about equal cost per thread, so that a
    thread whose ranges turn out slower (a cost guessed from sizes, a core busy elsewhere) is helped by the
    others, while the number of calls stays bounded whatever the number of rows."""
    return cut(costs, max(1, workers) * SLICES_PER_WORKER)


def in_threads(fn: Callable[[int, int], R], spans: list[tuple[int, int]], workers: int) -> list[R]:
    """`fn(lo, hi)` for every span on `workers` threads, results in order (`Started`, joined at once)."""
    return Started(fn, spans, workers).join()


class Started(Generic[R]):
    """`fn(lo, hi)` for every span on `workers` threads, started: the caller may do other work, then `join`; or
    use it as a context manager, which joins on leaving the block, so that no failure and no running span is left
    behind (a span writing into memory the caller reuses, say):

        with Started(fill, spans, workers):
            other_work()      # beside the helpers' spans
        # every span has run here; a failed one raised (or, when the block raised, is noted on its error)

    The calling thread is one of the workers, from `join` on, and `workers - 1` kept threads help it (threads
    started per call would cost more than a small call's work); each takes the next span from a shared count as it
    finishes one, so a thread whose spans turn out slower is helped, and a span costs one call of `fn` and nothing
    else (a future per span costs as much dispatch and waking as a small span's work). Work the caller does before
    joining runs beside the helpers' spans. Every span runs even when one fails; `join` raises the first failure in
    span order once all have finished. Started from a kept thread, every span runs in `join`.
    """

    def __init__(self, fn: Callable[[int, int], R], spans: list[tuple[int, int]], workers: int) -> None:
        self._fn, self._spans = fn, spans
        self._results: list = [None] * len(spans)
        self._errors: list[BaseException | None] = [None] * len(spans)
        self._taken = itertools.count()  # taking its next number is atomic under the GIL: no lock
        helpers = min(workers, len(spans)) - 1 if not getattr(_LOCAL, "pooled", False) else 0
        self._helpers = [_pool(workers - 1).submit(self._drain) for _ in range(max(0, helpers))]

    def __enter__(self) -> Started[R]:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: object) -> None:
        if error is None:
            self.join()
            return
        self._drain()  # the block's error goes on once every span has run; a failed span is noted on it
        wait(self._helpers)
        for e in self._errors:
            if e is not None:
                if sys.version_info >= (3, 11):  # notes are 3.11's; on 3.10 the block's error goes on alone
                    error.add_note(f"a started span failed too: {e!r}")
                return

    def _drain(self) -> None:
        n = len(self._spans)
        for i in self._taken:  # no call per span but `fn`'s
            if i >= n:
                return
            try:
                self._results[i] = self._fn(*self._spans[i])
            except BaseException as e:  # noqa: BLE001 - kept and raised by `join`, after every span
                self._errors[i] = e

    def join(self) -> list[R]:
        """Take spans until none is left, wait for the helpers; the results in span order."""
        self._drain()
        wait(self._helpers)
        for e in self._errors:
            if e is not None:
                raise e
        return self._results


_LOCAL = threading.local()
_POOLS: dict[int, ThreadPoolExecutor] = {}
_POOLS_LOCK = threading.Lock()


def _pool(workers: int) -> ThreadPoolExecutor:
    with _POOLS_LOCK:
        if workers not in _POOLS:
            _POOLS[workers] = ThreadPoolExecutor(workers, thread_name_prefix="delta-code", initializer=_pooled)
        return _POOLS[workers]


def stop_threads() -> None:
    """End the kept threads once they are idle; the next call starts new ones (a profiler set with
    `threading.setprofile` sees only threads started after it)."""
    with _POOLS_LOCK:
        pools = list(_POOLS.values())
        _POOLS.clear()
    for pool in pools:
        pool.shutdown(wait=True)


def _pooled() -> None:
    _LOCAL.pooled = True


def _forget_pools() -> None:
    """In a forked child the pools' threads are gone: start afresh."""
    global _POOLS_LOCK
    _POOLS.clear()
    _POOLS_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pools)

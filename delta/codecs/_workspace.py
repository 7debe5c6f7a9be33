"""The memory a diff or an apply keeps for the next one, held by the caller: a `Workspace`."""

from __future__ import annotations

import threading

import numpy as np

from . import _rans


class Workspace:
    """Memory the chunked codecs keep from one call to the next: the writer's model tables and its chunks' words,
    the reader's model tables and lookup.

    Why: fresh memory costs a page fault for each 4 KB first filled, more than filling a delta's model tables
    takes, and faults do not run side by side on two threads. What a call keeps lives only while it runs — a
    delta's bytes and a decode's changes are copied out or made afresh, never views of a workspace — so the next
    call can take the same memory. Hold one per sequence of calls and pass it in (`delta.diff`, `delta.apply`,
    `delta.decode`): each `Publisher` and each `Subscriber`'s reader holds one; a call given none makes one for
    itself. Needs above the caps are met with fresh memory, not kept.

    Threads: one call at a time. A call holds the workspace from its start to its return (`with workspace:`), and
    a call given a workspace that another call holds raises RuntimeError: give each thread its own. Inside a call
    the codec's worker threads fill rows of its tables, and are joined before the call lets go of it.

    Args:
        kept_models: The most models whose tables are kept, at the full alphabet (writer: 2 x 15 KB each; reader:
            2 x 7.5 KB + 4 KB).
        kept_words: The most coded words (uint16) kept.
    """

    def __init__(self, kept_models: int = 512, kept_words: int = 1 << 23) -> None:
        self.kept_models = kept_models
        self.kept_words = kept_words
        self._kept: dict[str, np.ndarray] = {}
        self._lock = threading.Lock()

    def __enter__(self) -> Workspace:
        if not self._lock.acquire(blocking=False):
            raise RuntimeError("this Workspace is held by another call; give each thread its own")
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.release()

    def writer_tables(self, models: int, symbols: int) -> tuple[np.ndarray, np.ndarray]:
        """The writer's frequency (`symbols` columns) and cumulative (one more) int64 tables for `models` models;
        contents undefined."""
        cap = self.kept_models * (_rans.ALPHABET + 1)
        return (
            self._take("writer freq", models * symbols, np.int64, cap).reshape(models, symbols),
            self._take("writer cum", models * (symbols + 1), np.int64, cap).reshape(models, symbols + 1),
        )

    def words(self, n: int) -> np.ndarray:
        """Room for `n` coded words; contents undefined."""
        return self._take("words", n, np.uint16, self.kept_words)

    def reader_tables(self, models: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The reader's frequency (`_rans.ALPHABET` columns), cumulative (one more) and lookup (`_rans.LUT_BITS`
        wide) int32 tables for `models` models; contents undefined."""
        symbols, lut = _rans.ALPHABET, 1 << _rans.LUT_BITS
        cap = self.kept_models * (symbols + 1)
        return (
            self._take("reader freq", models * symbols, np.int32, cap).reshape(models, symbols),
            self._take("reader cum", models * (symbols + 1), np.int32, cap).reshape(models, symbols + 1),
            self._take("reader lut", models * lut, np.int32, self.kept_models * lut).reshape(models, lut),
        )

    def _take(self, role: str, n: int, dtype: type, cap: int) -> np.ndarray:
        """`n` items of the buffer kept for `role`, grown (doubling) up to `cap` items; fresh memory beyond."""
        if n > cap:
            return np.empty(n, dtype)
        kept = self._kept.get(role)
        if kept is None or kept.size < n:
            kept = self._kept[role] = np.empty(min(cap, max(n, 0 if kept is None else 2 * kept.size)), dtype)
        return kept[:n]

"""Compiled scans over whole tensors: the only code that touches every element.

Both directions run one parallel pass per chunk of the flat bit view. The writer finds changed
elements together with their *rank inside their context class* (how many elements of the same
exponent come before them); the reader, who holds the same old tensor, turns ranks back into
positions. Everything else in the codec works on the changed elements only.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

CHUNK = 1 << 18


@njit(parallel=True, nogil=True, cache=True)
def _collect(a, b, shift, mask, chunk, offsets, cap, pos, cls, rank, hist, counts):  # pragma: no cover - compiled
    n = a.size
    for k in prange(counts.size):
        lo = k * chunk
        hi = min(n, lo + chunk)
        h = hist[k]
        base = offsets[k]
        m = 0
        for i in range(lo, hi):
            c = (a[i] >> shift) & mask
            if a[i] != b[i]:
                if m < cap:
                    pos[base + m] = i
                    cls[base + m] = c
                    rank[base + m] = h[c]
                m += 1
            h[c] += 1
        counts[k] = m


@njit(parallel=True, nogil=True, cache=True)
def _globalise(cls, rank, hist_before, offsets, counts):  # pragma: no cover - compiled
    for k in prange(counts.size):
        for j in range(offsets[k], offsets[k] + counts[k]):
            rank[j] += hist_before[k, cls[j]]


def find_changes(a: np.ndarray, b: np.ndarray, shift: int, mask: int):
    """Positions, classes and in-class ranks of the elements whose bits differ.

    Args:
        a, b: Flat unsigned views of the old and new tensor (same dtype and size).
        shift, mask: The context field of the old value (mask 0: one class, rank == position).

    Returns:
        (pos int64, cls uint16, rank int64, class_sizes int64[mask+1]), all in position order.
    """
    n = a.size
    nchunks = max(1, -(-n // CHUNK))
    classes = mask + 1
    cap = CHUNK // 16
    for attempt in range(2):
        if attempt == 0:
            offsets = np.arange(nchunks, dtype=np.int64) * cap
            total = nchunks * cap
        else:  # some chunk was denser than the optimistic guess: size exactly from the counts
            offsets = np.zeros(nchunks, dtype=np.int64)
            np.cumsum(counts[:-1], out=offsets[1:])
            total = int(counts.sum())
            cap = CHUNK
        pos = np.empty(total, np.int64)
        cls = np.empty(total, np.uint16)
        rank = np.empty(total, np.int64)
        hist = np.zeros((nchunks, classes), np.int64)
        counts = np.zeros(nchunks, np.int64)
        _collect(a, b, a.dtype.type(shift), a.dtype.type(mask), CHUNK, offsets, cap, pos, cls, rank, hist, counts)
        if counts.max(initial=0) <= cap:
            break
    hist_before = np.cumsum(hist, axis=0) - hist
    _globalise(cls, rank, hist_before, offsets, counts)
    if attempt == 0:
        keep = np.concatenate([np.arange(o, o + c) for o, c in zip(offsets, counts)])
        pos, cls, rank = pos[keep], cls[keep], rank[keep]
    return pos, cls, rank, hist.sum(axis=0)


@njit(parallel=True, nogil=True, cache=True)
def _class_hist(a, shift, mask, chunk, hist):  # pragma: no cover - compiled
    n = a.size
    for k in prange(hist.shape[0]):
        h = hist[k]
        for i in range(k * chunk, min(n, (k + 1) * chunk)):
            h[(a[i] >> shift) & mask] += 1


@njit(parallel=True, nogil=True, cache=True)
def _locate(a, shift, mask, chunk, start_count, start_ptr, ranks, rank_off, complement, out_off, out):  # pragma: no cover
    n = a.size
    for k in prange(start_count.shape[0]):
        cnt = start_count[k].copy()
        ptr = start_ptr[k].copy()
        for i in range(k * chunk, min(n, (k + 1) * chunk)):
            c = (a[i] >> shift) & mask
            r = cnt[c]
            cnt[c] = r + 1
            p = ptr[c]
            hit = rank_off[c] + p < rank_off[c + 1] and ranks[rank_off[c] + p] == r
            if hit:
                ptr[c] = p + 1
            if hit != complement[c]:
                out[out_off[c] + (r - p if complement[c] else p)] = i


def class_sizes(a: np.ndarray, shift: int, mask: int) -> np.ndarray:
    """Per-chunk histogram of context classes, shape (chunks, classes)."""
    nchunks = max(1, -(-a.size // CHUNK))
    hist = np.zeros((nchunks, mask + 1), np.int64)
    _class_hist(a, a.dtype.type(shift), a.dtype.type(mask), CHUNK, hist)
    return hist


def locate(a: np.ndarray, shift: int, mask: int, hist: np.ndarray, ranks: np.ndarray, rank_off: np.ndarray,
           complement: np.ndarray, out_off: np.ndarray, total: int) -> np.ndarray:
    """Positions of changed elements, grouped by class in rank order, from per-class rank lists.

    Args:
        a: Flat unsigned view of the old tensor the reader holds.
        hist: `class_sizes(a, ...)`.
        ranks: Stored ranks, concatenated by class, each class strictly increasing (checked by caller).
        rank_off: Start of each class in `ranks` (classes + 1 entries).
        complement: Per class, whether the stored ranks are of the *unchanged* elements.
        out_off: Start of each class in the output (classes + 1 entries); `total` elements in all.
    """
    start_count = np.cumsum(hist, axis=0) - hist
    start_ptr = np.zeros_like(start_count)
    for c in np.flatnonzero(rank_off[1:] > rank_off[:-1]):
        start_ptr[:, c] = np.searchsorted(ranks[rank_off[c]:rank_off[c + 1]], start_count[:, c])
    out = np.empty(total, np.int64)
    _locate(a, a.dtype.type(shift), a.dtype.type(mask), CHUNK, start_count, start_ptr, ranks, rank_off,
            complement, out_off, out)
    return out

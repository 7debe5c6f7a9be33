"""Compiled scans over whole tensors: the only code that touches every element.

Both directions run one parallel pass per chunk of the flat bit view. The writer finds changed
elements together with their *rank inside their context class* (how many elements of the same
old exponent come before them) and their ULP step; the reader, who holds the same old tensor, turns
ranks back into positions and steps back into values. Everything else works on changed elements.

A ULP step is the difference of the two bit patterns in float order (see `_bits.order_key`),
zigzag folded so small steps of either sign are small numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit, prange

CHUNK = 1 << 18
LANES = 4


@njit(inline="always")
def _key(x, sign, full):  # pragma: no cover - compiled
    return (~x) & full if x & sign else x | sign


@njit(inline="always")
def _step(x, y, sign, full):  # pragma: no cover - compiled
    d = (_key(y, sign, full) - _key(x, sign, full)) & full
    if d < sign:
        return d << np.uint64(1)
    return ((full - d) << np.uint64(1)) + np.uint64(1)  # 2 * (2**W - d) - 1 without overflow


@njit(inline="always")
def _unstep(x, z, sign, full):  # pragma: no cover - compiled
    half = z >> np.uint64(1)
    d = (full - half) if z & np.uint64(1) else half  # -(half + 1) mod 2**W, or half
    k = (_key(x, sign, full) + d) & full
    return k & ~sign & full if k & sign else (~k) & full


@njit(parallel=True, nogil=True, cache=True)
def _collect(a, b, shift, mask, chunk, offsets, cap, pos, cls, rank, step, hist, counts):  # pragma: no cover
    n = a.size
    sign = np.uint64(1) << np.uint64(a.itemsize * 8 - 1)
    full = (sign - np.uint64(1)) | sign
    for k in prange(counts.size):
        lo = k * chunk
        hi = min(n, lo + chunk)
        h = hist[k]
        base = offsets[k]
        m = 0
        if mask == 0:  # one class: rank is the position, no histogram (whose increments chain)
            for i in range(lo, hi):
                if a[i] != b[i]:
                    if m < cap:
                        pos[base + m] = i
                        cls[base + m] = 0
                        rank[base + m] = i
                        step[base + m] = _step(np.uint64(a[i]), np.uint64(b[i]), sign, full)
                    m += 1
            h[0] = hi - lo
        else:
            # Four histogram lanes: runs of equal exponents would otherwise chain every increment
            # on the previous one through memory.
            lanes = np.zeros((LANES, h.size), np.int64)
            for i in range(lo, hi):
                x = a[i]
                c = (x >> shift) & mask
                if x != b[i]:
                    if m < cap:
                        pos[base + m] = i
                        cls[base + m] = c
                        rank[base + m] = lanes[0, c] + lanes[1, c] + lanes[2, c] + lanes[3, c]
                        step[base + m] = _step(np.uint64(x), np.uint64(b[i]), sign, full)
                    m += 1
                lanes[i & 3, c] += 1
            for c in range(h.size):
                h[c] = lanes[0, c] + lanes[1, c] + lanes[2, c] + lanes[3, c]
        counts[k] = m


@njit(nogil=True, cache=True)
def _group(cls, rank, pos, step, hist_before, offsets, counts, class_start, out_pos, out_rank, out_step):  # pragma: no cover
    fill = class_start.copy()
    for k in range(counts.size):
        for j in range(offsets[k], offsets[k] + counts[k]):
            c = cls[j]
            dest = fill[c]
            fill[c] = dest + 1
            out_pos[dest] = pos[j]
            out_rank[dest] = rank[j] + hist_before[k, c]
            out_step[dest] = step[j]


@dataclass
class Changes:
    """The changed elements of one tensor, grouped by context class, in rank order within a class.

    Attributes:
        positions: Flat positions (int64).
        ranks: Rank of each element among the elements of its class (int64).
        steps: Zigzag ULP step from old to new value (unsigned, the tensor's width).
        class_changed: Changed elements per class.
        class_sizes: Elements per class in the old tensor.
    """

    positions: np.ndarray
    ranks: np.ndarray
    steps: np.ndarray
    class_changed: np.ndarray
    class_sizes: np.ndarray


def find_changes(a: np.ndarray, b: np.ndarray, shift: int, mask: int) -> Changes:
    """The elements whose bits differ between `a` (old) and `b` (new), flat unsigned views.

    `shift`/`mask` select the old value's context field; mask 0 puts everything in one class, where
    rank equals position.
    """
    n = a.size
    nchunks = max(1, -(-n // CHUNK))
    cap = CHUNK // 16
    offsets = np.arange(nchunks, dtype=np.int64) * cap
    total = nchunks * cap
    for _ in range(2):
        pos = np.empty(total, np.int64)
        cls = np.empty(total, np.uint16)
        rank = np.empty(total, np.int64)
        step = np.empty(total, a.dtype)
        hist = np.zeros((nchunks, mask + 1), np.int64)
        counts = np.zeros(nchunks, np.int64)
        _collect(a, b, a.dtype.type(shift), a.dtype.type(mask), CHUNK, offsets, cap, pos, cls, rank, step, hist, counts)
        if counts.max(initial=0) <= cap:
            break
        # Some chunk was denser than the optimistic guess: size every chunk exactly and scan again.
        offsets = np.concatenate([[0], np.cumsum(counts[:-1])]).astype(np.int64)
        cap, total = CHUNK, int(counts.sum())
    hist_before = np.cumsum(hist, axis=0) - hist if mask else np.zeros_like(hist)  # mask 0: ranks are positions
    # Group by class (a counting sort over the changed elements only), ranks made global.
    valid = np.concatenate([cls[o:o + c] for o, c in zip(offsets, counts)])
    class_changed = np.bincount(valid, minlength=mask + 1).astype(np.int64)
    class_start = np.concatenate([[0], np.cumsum(class_changed[:-1])]).astype(np.int64)
    size = int(counts.sum())
    out_pos, out_rank, out_step = np.empty(size, np.int64), np.empty(size, np.int64), np.empty(size, a.dtype)
    _group(cls, rank, pos, step, hist_before, offsets, counts, class_start, out_pos, out_rank, out_step)
    return Changes(out_pos, out_rank, out_step, class_changed, hist.sum(axis=0))


@njit(parallel=True, nogil=True, cache=True)
def _class_hist(a, shift, mask, chunk, hist):  # pragma: no cover - compiled
    n = a.size
    for k in prange(hist.shape[0]):
        lanes = np.zeros((LANES, hist.shape[1]), np.int64)
        for i in range(k * chunk, min(n, (k + 1) * chunk)):
            lanes[i & 3, (a[i] >> shift) & mask] += 1
        for c in range(hist.shape[1]):
            hist[k, c] = lanes[0, c] + lanes[1, c] + lanes[2, c] + lanes[3, c]


@njit(parallel=True, nogil=True, cache=True)
def _locate(a, shift, mask, chunk, start_count, start_ptr, ranks, rank_off, complement, out_off, chunk_off,
            steps, out_pos, out_val):  # pragma: no cover - compiled
    n = a.size
    nclass = rank_off.size - 1
    sign = np.uint64(1) << np.uint64(a.itemsize * 8 - 1)
    full = (sign - np.uint64(1)) | sign
    for k in prange(start_count.shape[0]):
        cnt = start_count[k].copy()
        ptr = start_ptr[k].copy()
        # Next stored rank per class (-1 when none is left): one comparison per element.
        nxt = np.full(nclass, -1, np.int64)
        for c in range(nclass):
            if rank_off[c] + ptr[c] < rank_off[c + 1]:
                nxt[c] = ranks[rank_off[c] + ptr[c]]
        m = chunk_off[k]
        for i in range(k * chunk, min(n, (k + 1) * chunk)):
            c = (a[i] >> shift) & mask
            r = cnt[c]
            cnt[c] = r + 1
            hit = r == nxt[c]
            if hit or complement[c]:
                p = ptr[c]
                if hit:
                    ptr[c] = p + 1
                    q = rank_off[c] + p + 1
                    nxt[c] = ranks[q] if q < rank_off[c + 1] else -1
                if hit != complement[c]:
                    j = out_off[c] + (r - p if complement[c] else p)
                    out_pos[m] = i
                    out_val[m] = _unstep(np.uint64(a[i]), np.uint64(steps[j]), sign, full)
                    m += 1


@njit(parallel=True, nogil=True, cache=True)
def _apply_steps(a, positions, steps, out_val):  # pragma: no cover - compiled
    sign = np.uint64(1) << np.uint64(a.itemsize * 8 - 1)
    full = (sign - np.uint64(1)) | sign
    for j in prange(positions.size):
        out_val[j] = _unstep(np.uint64(a[positions[j]]), np.uint64(steps[j]), sign, full)


def class_sizes(a: np.ndarray, shift: int, mask: int) -> np.ndarray:
    """Per-chunk histogram of context classes, shape (chunks, classes)."""
    nchunks = max(1, -(-a.size // CHUNK))
    hist = np.zeros((nchunks, mask + 1), np.int64)
    _class_hist(a, a.dtype.type(shift), a.dtype.type(mask), CHUNK, hist)
    return hist


def new_values(a: np.ndarray, positions: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """New bit patterns at `positions` of old tensor `a`, given zigzag ULP steps."""
    out = np.empty(positions.size, a.dtype)
    _apply_steps(a, positions, steps, out)
    return out


def locate(a: np.ndarray, shift: int, mask: int, hist: np.ndarray, ranks: np.ndarray, rank_off: np.ndarray,
           complement: np.ndarray, out_off: np.ndarray, steps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Positions (ascending) and new values of the changed elements of one tensor.

    Args:
        a: Flat unsigned view of the old tensor the reader holds.
        hist: `class_sizes(a, ...)`.
        ranks: Stored ranks, concatenated by class, each class strictly increasing (checked by caller).
        rank_off: Start of each class in `ranks` (classes + 1 entries).
        complement: Per class, whether the stored ranks are of the *unchanged* elements.
        out_off: Start of each class among the changed elements in `steps` (classes + 1 entries).
        steps: Zigzag ULP steps of the changed elements, grouped by class in rank order.
    """
    start_count = np.cumsum(hist, axis=0) - hist
    start_ptr = np.zeros_like(start_count)
    for c in np.flatnonzero(rank_off[1:] > rank_off[:-1]):
        start_ptr[:, c] = np.searchsorted(ranks[rank_off[c]:rank_off[c + 1]], start_count[:, c])
    # Changed elements per chunk, so every chunk writes its own slice in position order.
    stored_in_chunk = np.diff(np.vstack([start_ptr, (rank_off[1:] - rank_off[:-1])[None, :]]), axis=0)
    changed_in_chunk = np.where(complement[None, :], hist - stored_in_chunk, stored_in_chunk).sum(axis=1)
    chunk_off = np.concatenate([[0], np.cumsum(changed_in_chunk)[:-1]]).astype(np.int64)
    out_pos = np.empty(steps.size, np.int64)
    out_val = np.empty(steps.size, a.dtype)
    _locate(a, a.dtype.type(shift), a.dtype.type(mask), CHUNK, start_count, start_ptr, ranks, rank_off,
            complement, out_off, chunk_off, steps, out_pos, out_val)
    return out_pos, out_val


@njit(parallel=True, nogil=True, cache=True)
def _scatter(flat, positions, values, saved):  # pragma: no cover - compiled
    for j in prange(positions.size):
        saved[j] = flat[positions[j]]
        flat[positions[j]] = values[j]


def scatter(flat: np.ndarray, positions: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Write `values` at `positions` of `flat` in place; returns the values that were there (for undo).

    Positions must be unique and in range (the codecs check this before anything is written).
    """
    saved = np.empty(positions.size, flat.dtype)
    _scatter(flat, positions, values, saved)
    return saved

"""Compiled scans over chunks of tensors: the only code that touches every element.

Each function works on one chunk [lo, hi) of a flat bit view and releases the GIL, so a thread pool
runs one chunk per core. The writer's scan finds the changed elements with their class (the old
value's exponent field), the gap to the previous changed element of the same class in *class rank*
(how many elements of that class lie between them) and their ULP step; the reader, who holds the
same old tensor, turns ranks back into positions and steps back into values. `raw`'s writer only lists
the changed elements' positions and new values (`changes_chunk`).

A ULP step is the difference of the two bit patterns in float order (see `bits.order_key`),
zigzag folded so small steps of either sign are small numbers.

Both scans also move the tensor's state-hash sums (`delta.tensors._sumhash`) by each change they meet:
`key` is (base, block, skip, seed 0, seed 1) of the tensor (`TensorKey`), and they return the two lanes'
sum(h(new)) - sum(h(old)) over the chunk's changes.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..tensors._sumhash import element_hash
from ._rans import RANK_PAST_CLASS

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


@njit(inline="always")
def _signs(a):  # pragma: no cover - compiled
    sign = np.uint64(1) << np.uint64(a.itemsize * 8 - 1)
    return sign, (sign - np.uint64(1)) | sign


@njit(inline="always")
def _moved(i, x, y, key):  # pragma: no cover - compiled
    """How element i going from bits x to y moves the two hash lanes (uint64 each, wrapping)."""
    base, block, skip, s0, s1 = key
    j = np.int64(i)
    g = np.uint64(base + j + (j // block) * skip)
    x, y = np.uint64(x), np.uint64(y)
    return element_hash(g, y, s0) - element_hash(g, x, s0), element_hash(g, y, s1) - element_hash(g, x, s1)


@njit(inline="always")
def _record(a, b, lo, i, c, mask, lanes, nc, per, last, cls, gaps, steps, m, sign, full):  # pragma: no cover
    """Write the change at i (class c): its rank is the sum of its class's lanes so far (the
    position in the chunk for mask 0, whose lanes are not kept)."""
    rank = np.int64(i - lo)
    if mask:
        rank = 0  # type: ignore[assignment]  # numba types both int64
        for t in range(per):
            rank += lanes[t * nc + c]
    cls[m] = c
    gaps[m] = rank - last[c] - 1
    last[c] = rank
    steps[m] = _step(np.uint64(a[i]), np.uint64(b[i]), sign, full)


@njit(inline="always")
def _visit(
    a, b, lo, i, lane, shift, mask, lanes, nc, per, last, cls, gaps, steps, m, cmin, cmax, sign, full, key, t0, t1
):  # pragma: no cover
    """One element on the slow path: record it if it changed, count it in `lane`; returns (m, cmin, cmax,
    t0, t1)."""
    c = (a[i] >> shift) & mask
    if a[i] != b[i]:
        _record(a, b, lo, i, c, mask, lanes, nc, per, last, cls, gaps, steps, m, sign, full)
        d0, d1 = _moved(i, a[i], b[i], key)
        t0 += d0
        t1 += d1
        cmin = min(cmin, np.int64(c))
        cmax = max(cmax, np.int64(c))
        m += 1
    if mask:
        lanes[lane * nc + c] += 1
    return m, cmin, cmax, t0, t1


@njit(nogil=True, cache=True)
def scan_chunk(a, b, lo, hi, shift, mask, cls, gaps, steps, key):  # pragma: no cover - compiled
    """Changed elements of a[lo:hi] vs b[lo:hi], in position order; returns (count, lowest class, highest class,
    hash lane 0 moved, hash lane 1 moved).

    `cls`, `gaps`, `steps` need room for hi - lo elements. mask 0 puts every element in class 0,
    where a rank is the position in the chunk.

    Elements are compared a 64-bit word at a time (8 / itemsize of them); each position in a word
    counts classes in a histogram lane of its own, since runs of equal exponents would otherwise
    chain every increment on the previous one through memory. A rank is the sum of the lanes,
    needed only at a change.
    """
    sign, full = _signs(a)
    m = 0
    t0, t1 = np.uint64(0), np.uint64(0)
    cmin, cmax = np.int64(mask) + 1, np.int64(-1)
    nc = np.int64(mask) + 1
    per = 8 // a.itemsize
    width = a.itemsize * 8
    lanes = np.zeros(per * nc, np.int64)
    last = np.full(nc, -1, np.int64)
    words = (hi - lo) // per
    wa = a[lo : lo + per * words].view(np.uint64)
    wb = b[lo : lo + per * words].view(np.uint64)
    mk = np.uint64(mask)
    s0, s1, s2, s3 = np.uint64(shift), np.uint64(16 + shift), np.uint64(32 + shift), np.uint64(48 + shift)
    for k in range(words):
        x = wa[k]
        if x == wb[k]:
            if mask and per == 4:  # 16-bit dtypes, the common case, unrolled
                lanes[(x >> s0) & mk] += 1
                lanes[nc + ((x >> s1) & mk)] += 1
                lanes[2 * nc + ((x >> s2) & mk)] += 1
                lanes[3 * nc + ((x >> s3) & mk)] += 1
            elif mask:
                for t in range(per):
                    lanes[t * nc + ((x >> np.uint64(t * width + shift)) & mk)] += 1
            continue
        for t in range(per):
            m, cmin, cmax, t0, t1 = _visit(
                a,
                b,
                lo,
                lo + per * k + t,
                t,
                shift,
                mask,
                lanes,
                nc,
                per,
                last,
                cls,
                gaps,
                steps,
                m,
                cmin,
                cmax,
                sign,
                full,
                key,
                t0,
                t1,
            )
    for i in range(lo + per * words, hi):
        m, cmin, cmax, t0, t1 = _visit(
            a, b, lo, i, 0, shift, mask, lanes, nc, per, last, cls, gaps, steps, m, cmin, cmax, sign, full, key, t0, t1
        )
    return m, cmin, cmax, t0, t1


@njit(inline="always")
def _change(a, b, i, positions, values, m, key, t0, t1):  # pragma: no cover - compiled
    """Record element i if it changed; returns (m, t0, t1)."""
    if a[i] != b[i]:
        positions[m] = i
        values[m] = b[i]
        d0, d1 = _moved(i, a[i], b[i], key)
        t0 += d0
        t1 += d1
        m += 1
    return m, t0, t1


@njit(nogil=True, cache=True)
def changes_chunk(a, b, lo, hi, positions, values, key):  # pragma: no cover - compiled
    """Positions (ascending) and new values of the changed elements of a[lo:hi] vs b[lo:hi]; returns (count, hash
    lane 0 moved, hash lane 1 moved). `positions`, `values` need room for hi - lo elements. Compared a 64-bit word
    at a time, as `scan_chunk` does."""
    m = 0
    t0, t1 = np.uint64(0), np.uint64(0)
    per = 8 // a.itemsize
    words = (hi - lo) // per
    wa = a[lo : lo + per * words].view(np.uint64)
    wb = b[lo : lo + per * words].view(np.uint64)
    for k in range(words):
        if wa[k] != wb[k]:
            for i in range(lo + per * k, lo + per * k + per):
                m, t0, t1 = _change(a, b, i, positions, values, m, key, t0, t1)
    for i in range(lo + per * words, hi):
        m, t0, t1 = _change(a, b, i, positions, values, m, key, t0, t1)
    return m, t0, t1


@njit(nogil=True, cache=True)
def locate_chunk(a, lo, hi, shift, mask, cls, ranks, steps, out_pos, out_val, key):  # pragma: no cover - compiled
    """Positions (ascending) and new values of a chunk's changes; returns (error code (0: fine, RANK_PAST_CLASS: a
    rank is beyond its class in `a`), hash lane 0 moved, hash lane 1 moved).

    `cls`, `ranks`, `steps` are class-major with ranks ascending within a class (`_rans.decode_chunk`).
    """
    sign, full = _signs(a)
    n = cls.size
    t0, t1 = np.uint64(0), np.uint64(0)
    if mask == 0:
        for j in range(n):
            p = lo + ranks[j]
            if p >= hi:
                return RANK_PAST_CLASS, t0, t1
            out_pos[j] = p
            out_val[j] = _unstep(np.uint64(a[p]), np.uint64(steps[j]), sign, full)
            d0, d1 = _moved(p, a[p], out_val[j], key)
            t0 += d0
            t1 += d1
        return 0, t0, t1
    nclass = mask + 1
    ptr = np.zeros(nclass, np.int64)
    end = np.zeros(nclass, np.int64)
    nxt = np.full(nclass, -1, np.int64)
    for j in range(n - 1, -1, -1):  # class runs: ptr = first index of each class, end = one past its last
        c = cls[j]
        if end[c] == 0:
            end[c] = j + 1
        ptr[c] = j
    for c in range(nclass):
        if end[c]:
            nxt[c] = ranks[ptr[c]]
    cnt = np.zeros(nclass, np.int64)
    m = 0
    for i in range(lo, hi):
        x = a[i]
        c = (x >> shift) & mask
        r = cnt[c]
        cnt[c] = r + 1
        if r == nxt[c]:
            j = ptr[c]
            out_pos[m] = i
            out_val[m] = _unstep(np.uint64(x), np.uint64(steps[j]), sign, full)
            d0, d1 = _moved(i, x, out_val[m], key)
            t0 += d0
            t1 += d1
            m += 1
            ptr[c] = j + 1
            nxt[c] = ranks[j + 1] if j + 1 < end[c] else -1
    return (0 if m == n else RANK_PAST_CLASS), t0, t1

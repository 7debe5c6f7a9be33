"""A small rANS entropy coder, compiled with numba, that codes one chunk per call without the GIL (every core at
once; its bytes are part of the file format, so the arithmetic is fixed here rather than in a dependency).

The arithmetic (ryg's `rans_word`): a 32-bit state in [2**16, 2**32), 16-bit words out, probabilities quantised
to 2**15; symbols pushed in reverse so the decoder reads words front to back; raw bits go through the same state
as uniform symbols. A decoder checks it ends on the encoder's start state with every word consumed.

Values below `DIRECT` are symbols themselves; a larger value of bit length L is symbol DIRECT + 2**SUB_BITS *
(L - bitlen(DIRECT)) + (its SUB_BITS bits below the leading one), then its remaining L - 1 - SUB_BITS bits raw.
Symbol `END` closes a class's list of gaps."""

from __future__ import annotations

import numpy as np
from numba import njit
from numba.extending import register_jitable

PROB_BITS = 15
PROB_SCALE = 1 << PROB_BITS
DIRECT = 64
SUB_BITS = 5
_DIRECT_BITS = DIRECT.bit_length()  # bit length of the smallest bucketed value
END = DIRECT + ((64 - _DIRECT_BITS + 1) << SUB_BITS)  # after every bucket a 64-bit value can need
ALPHABET = END + 1
LUT_BITS = 10

_L = 1 << 16

# Error codes of the decoders (0 is success), returned by the compiled code, which cannot raise usefully; the
# caller raises with `DECODE_ERRORS`' words for the first bad chunk in file order.
ENDS_EARLY = 1
CLASS_OVERFULL = 2
NO_MODEL = 3
RANK_PAST_CHUNK = 4
STEP_TOO_WIDE = 5
NOT_FINISHED = 6
TOO_FEW = 7
RANK_PAST_CLASS = 8  # found by the reader's scan (`_kernels.locate_chunk`), not by the rANS decoder

DECODE_ERRORS = {
    ENDS_EARLY: "the stream ends early",
    CLASS_OVERFULL: "a class holds more changed elements than the chunk table says",
    NO_MODEL: "a symbol has no model",
    RANK_PAST_CHUNK: "a position is beyond the end of its chunk",
    STEP_TOO_WIDE: "a step is out of range for the tensor's bit width",
    NOT_FINISHED: "the stream has words left over or does not end on its initial state",
    TOO_FEW: "the chunk holds fewer changed elements than the chunk table says",
    RANK_PAST_CLASS: "a position is beyond its class in the reader's tensor",
}


@register_jitable
def end_column(table: np.ndarray) -> int:
    """The column of END in a model table or a histogram: the last, in the writer's layout and the reader's (`ALPHABET`
    columns) alike; below it, a column is its symbol in both."""
    return table.shape[1] - 1


@njit(nogil=True, cache=True)
def _quantize_in_place(rows):  # pragma: no cover - compiled
    """Each row of counts turned into frequencies summing to PROB_SCALE, at least 1 for every symbol with a count (the
    writer's alone: the file stores the frequencies)."""
    for m in range(rows.shape[0]):
        freq = rows[m]
        total = freq.sum()
        for s in range(freq.size):
            if freq[s] > 0:
                freq[s] = max(1, freq[s] * PROB_SCALE // total)
        excess = freq.sum() - PROB_SCALE
        # A stable sort of -freq: the symbols with a count by falling frequency (ties in symbol order), then the
        # others in symbol order; only the former need sorting (a model uses few of the alphabet's symbols).
        present = np.flatnonzero(freq)
        order = np.concatenate((present[np.argsort(-freq[present], kind="mergesort")], np.flatnonzero(freq == 0)))
        if excess < 0:
            freq[order[0]] -= excess
        while excess > 0:  # take from the largest frequencies, never below 1
            for s in order:
                if excess == 0:
                    break
                take = min(excess, freq[s] - 1, max(1, freq[s] // 8))
                freq[s] -= take
                excess -= take
    return rows


@njit(nogil=True, cache=True)
def fill_models(hists, classes, freq, cum):  # pragma: no cover - compiled
    """The models of `classes` from histograms `hists` added up: frequencies into `freq` and cumulative starts into
    `cum`, one row per class of the caller's tables (threads fill them side by side), in the writer's layout: END moves
    to the tables' last column."""
    end, table_end = end_column(hists[0]), end_column(freq)
    for i in range(classes.size):
        row = freq[i]
        row[:] = 0
        for k in range(hists.shape[0]):
            src = hists[k, classes[i]]
            for s in range(end):
                row[s] += src[s]
            row[table_end] += src[end]
    _quantize_in_place(freq)
    for i in range(classes.size):
        cum[i, 0] = 0
        for s in range(table_end + 1):
            cum[i, s + 1] = cum[i, s] + freq[i, s]


def symbol_of(value: int) -> int:
    """The symbol a value is coded as (symbols grow with values: the largest symbol values up to V need)."""
    if value < DIRECT:
        return value
    n = value.bit_length()
    return DIRECT + ((n - _DIRECT_BITS) << SUB_BITS) + ((value >> (n - 1 - SUB_BITS)) & ((1 << SUB_BITS) - 1))


def writer_symbols(width: int, chunk: int) -> int:
    """Columns of the writer's histograms and tables for `width`-bit tensors in chunks of `chunk` elements: the symbols
    a gap or a step can take, then END (bf16 at the default chunk: 513 of `ALPHABET`'s 1,921)."""
    return max(symbol_of(chunk - 1), symbol_of((1 << width) - 2)) + 2


def cumulative(freqs: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Cumulative starts of each model's symbols into `out` (models x ALPHABET + 1, of `freqs`' dtype): what coding
    and decoding need."""
    out[:, 0] = 0
    np.cumsum(freqs, axis=1, out=out[:, 1:])
    return out


def lookup(cum: np.ndarray, out: np.ndarray) -> np.ndarray:
    """The decoder's coarse lookup (models x 2**LUT_BITS, int32) from `cumulative`'s starts, into `out`."""
    slots = np.arange(1 << LUT_BITS, dtype=np.int64) << (PROB_BITS - LUT_BITS)
    for m in range(cum.shape[0]):
        out[m] = np.searchsorted(cum[m], slots, side="right") - 1
    return out


_BITLEN8 = np.array([int(v).bit_length() for v in range(256)], np.int64)


@njit(inline="always")
def _bitlen(v):  # pragma: no cover - compiled
    n = 0
    if v >> np.uint64(32):
        v >>= np.uint64(32)
        n += 32
    if v >> np.uint64(16):
        v >>= np.uint64(16)
        n += 16
    if v >> np.uint64(8):
        v >>= np.uint64(8)
        n += 8
    return n + _BITLEN8[v]


@njit(inline="always")
def _symbol(v):  # pragma: no cover - compiled
    """(symbol, number of raw bits) of a value."""
    if v < np.uint64(DIRECT):
        return np.int64(v), 0
    n = _bitlen(v)
    nraw = n - 1 - SUB_BITS
    sub = np.int64((v >> np.uint64(nraw)) & np.uint64((1 << SUB_BITS) - 1))
    return DIRECT + ((n - _DIRECT_BITS) << SUB_BITS) + sub, nraw


@njit(nogil=True, cache=True)
def count_symbols(cls, gaps, steps, lo, hi, gap_hist, step_hist, tally):  # pragma: no cover - compiled
    """Add one chunk's symbols to per-class histograms (writer's layout) with an END per class in lo..hi, and to `tally`
    (ENDs, changes per class), so that the classes with models are known without reading every histogram."""
    end = end_column(gap_hist)
    for j in range(cls.size):
        c = cls[j]
        g = _symbol(np.uint64(gaps[j]))[0]
        s = _symbol(np.uint64(steps[j] - np.uint64(1)))[0]
        if g >= end or s >= end:
            raise ValueError("a change's symbol lies beyond the writer's histograms")
        gap_hist[c, g] += 1
        step_hist[c, s] += 1
        tally[c, 1] += 1
    for c in range(lo, hi + 1):
        gap_hist[c, end] += 1
        tally[c, 0] += 1


@njit(inline="always")
def _push(x, out, ptr, start, freq):  # pragma: no cover - compiled
    if x >= (np.uint64(freq) << np.uint64(17)):
        ptr -= 1
        out[ptr] = np.uint16(x & np.uint64(0xFFFF))
        x >>= np.uint64(16)
    # x < 2**32 and freq <= 2**15: a float64 quotient is never within rounding of the next integer
    # (it is at least 2**-15 below it), so its floor is exact, and far cheaper than integer division.
    q = np.uint64(np.float64(x) / np.float64(freq))
    x = (q << np.uint64(PROB_BITS)) + (x - q * np.uint64(freq)) + np.uint64(start)
    return x, ptr


@njit(inline="always")
def _push_raw(x, out, ptr, bits, k):  # pragma: no cover - compiled
    if x >= (np.uint64(1) << np.uint64(32 - k)):
        ptr -= 1
        out[ptr] = np.uint16(x & np.uint64(0xFFFF))
        x >>= np.uint64(16)
    x = (x << np.uint64(k)) | bits
    return x, ptr


@njit(inline="always")
def _push_value(x, out, ptr, v, model, freq, cum):  # pragma: no cover - compiled
    s, nraw = _symbol(v)
    if nraw:
        raw = v & ((np.uint64(1) << np.uint64(nraw)) - np.uint64(1))
        r = nraw
        while r > 16:  # low pieces first: the decoder takes the top piece first
            x, ptr = _push_raw(x, out, ptr, raw & np.uint64(0xFFFF), 16)
            raw >>= np.uint64(16)
            r -= 16
        x, ptr = _push_raw(x, out, ptr, raw, r)
    x, ptr = _push(x, out, ptr, cum[model, s], freq[model, s])
    return x, ptr


@njit(nogil=True, cache=True)
def _encode_class(x, out, ptr, gaps, steps, gap_model, step_model, freq, cum):  # pragma: no cover - compiled
    """Push one class's (gap, step) pairs, last first, then nothing else: END is the caller's."""
    for t in range(gaps.size - 1, -1, -1):
        x, ptr = _push_value(x, out, ptr, np.uint64(steps[t] - np.uint64(1)), step_model, freq, cum)
        x, ptr = _push_value(x, out, ptr, np.uint64(gaps[t]), gap_model, freq, cum)
    return x, ptr


@njit(nogil=True, cache=True)
def encode_chunk(cls, gaps, steps, lo, hi, gap_model, step_model, freq, cum, out):  # pragma: no cover
    """Code one chunk's changes; returns the number of words, which end at the end of `out`.

    Args:
        cls, gaps, steps: per changed element in position order: its class, the gap from the previous changed
            element of its class (its rank for the first), its zigzag ULP step (>= 1).
        lo, hi: the lowest and highest class with a change.
        gap_model, step_model: model index per class; `freq`, `cum` in the writer's layout.
        out: room for at least 2 + 10 * len(cls) + (hi - lo + 1) words.

    Decoder order: for each class lo..hi, its (gap, step) pairs in rank order, then END.
    """
    n = cls.size
    end = end_column(freq)
    nclass = hi - lo + 1
    start = np.zeros(nclass + 1, np.int64)
    for j in range(n):
        start[cls[j] - lo + 1] += 1
    for k in range(nclass):
        start[k + 1] += start[k]
    fill = start[:-1].copy()
    by_class_gaps = np.empty(n, np.uint32)
    by_class_steps = np.empty(n, np.uint64)
    for j in range(n):
        k = cls[j] - lo
        by_class_gaps[fill[k]] = gaps[j]
        by_class_steps[fill[k]] = steps[j]
        fill[k] += 1
    x = np.uint64(_L)
    ptr = out.size
    for k in range(nclass - 1, -1, -1):
        c = lo + k
        m = gap_model[c]
        x, ptr = _push(x, out, ptr, cum[m, end], freq[m, end])
        x, ptr = _encode_class(
            x,
            out,
            ptr,
            by_class_gaps[start[k] : start[k + 1]],
            by_class_steps[start[k] : start[k + 1]],
            m,
            step_model[c],
            freq,
            cum,
        )
    ptr -= 1
    out[ptr] = np.uint16(x & np.uint64(0xFFFF))
    ptr -= 1
    out[ptr] = np.uint16(x >> np.uint64(16))
    return out.size - ptr


@njit(inline="always")
def _pop(x, words, pos, model, freq, cum, lut):  # pragma: no cover - compiled
    """(symbol, state, position, error)."""
    slot = np.int64(x & np.uint64(PROB_SCALE - 1))
    s = lut[model, slot >> (PROB_BITS - LUT_BITS)]
    while cum[model, s + 1] <= slot:
        s += 1
    f = freq[model, s]
    if f == 0:
        return s, x, pos, NO_MODEL
    x, pos, err = _renormalize(np.uint64(f) * (x >> np.uint64(PROB_BITS)) + np.uint64(slot - cum[model, s]), words, pos)
    return s, x, pos, err


@njit(inline="always")
def _renormalize(x, words, pos):  # pragma: no cover - compiled
    """Read a word into a state that fell below 2**16: (state, position, error)."""
    if x < np.uint64(_L):
        if pos >= words.size:
            return x, pos, ENDS_EARLY
        x = (x << np.uint64(16)) | np.uint64(words[pos])
        pos += 1
    return x, pos, 0


@njit(inline="always")
def _pop_raw(x, words, pos, k):  # pragma: no cover - compiled
    bits = x & ((np.uint64(1) << np.uint64(k)) - np.uint64(1))
    x, pos, err = _renormalize(x >> np.uint64(k), words, pos)
    return bits, x, pos, err


@njit(inline="always")
def _pop_value(x, words, pos, model, freq, cum, lut):  # pragma: no cover - compiled
    """(value, state, position, error, is END)."""
    s, x, pos, err = _pop(x, words, pos, model, freq, cum, lut)
    end = s == end_column(freq)
    if err or end:
        return np.uint64(0), x, pos, err, end
    if s < DIRECT:
        return np.uint64(s), x, pos, 0, False
    q = s - DIRECT
    nraw = (q >> SUB_BITS) + _DIRECT_BITS - 1 - SUB_BITS
    raw, err = np.uint64(0), 0
    top = nraw - 16 * ((nraw - 1) // 16) if nraw > 0 else 0
    if top:
        raw, x, pos, err = _pop_raw(x, words, pos, top)
    rem = nraw - top
    while rem > 0 and not err:
        piece, x, pos, err = _pop_raw(x, words, pos, 16)
        raw = (raw << np.uint64(16)) | piece
        rem -= 16
    v = (np.uint64((1 << SUB_BITS) | (q & ((1 << SUB_BITS) - 1))) << np.uint64(nraw)) | raw
    return v, x, pos, err, False


@njit(nogil=True, cache=True)
def decode_chunk(
    words, lo, hi, size, width, gap_model, step_model, freq, cum, lut, n, cls, ranks, steps
):  # pragma: no cover
    """Decode one chunk into class-major lists; returns an error code (0: fine).

    Args:
        size: elements in the chunk (every rank must be below it).
        width: the tensor's bit width (steps must fit it).
        n: how many changed elements the chunk table says the chunk holds (checked exactly).
        cls, ranks, steps: filled (n each), class by class, ranks ascending within a class; empty
            arrays to check the stream without keeping what it holds (memory independent of n).
    """
    store = cls.size >= n
    if words.size < 2:
        return ENDS_EARLY
    x = (np.uint64(words[0]) << np.uint64(16)) | np.uint64(words[1])
    pos = 2
    limit = np.uint64(0xFFFFFFFFFFFFFFFF) if width == 64 else (np.uint64(1) << np.uint64(width)) - np.uint64(1)
    j = 0
    for c in range(lo, hi + 1):
        m, ms = gap_model[c], step_model[c]
        if m < 0:
            return NO_MODEL
        rank = np.int64(-1)
        while True:
            v, x, pos, err, end = _pop_value(x, words, pos, m, freq, cum, lut)
            if err:
                return err
            if end:
                break
            if j >= n:
                return CLASS_OVERFULL
            if v >= np.uint64(size):
                return RANK_PAST_CHUNK
            rank += np.int64(v) + 1
            if rank >= size:
                return RANK_PAST_CHUNK
            if ms < 0:
                return NO_MODEL
            v, x, pos, err, end = _pop_value(x, words, pos, ms, freq, cum, lut)
            if err:
                return err
            if end or v >= limit:
                return STEP_TOO_WIDE
            if store:
                cls[j] = c
                ranks[j] = rank
                steps[j] = v + np.uint64(1)
            j += 1
    if j != n:
        return TOO_FEW
    if pos != words.size or x != np.uint64(_L):
        return NOT_FINISHED
    return 0

"""Compiled passes over every chunk of many tensors at once: a few calls per thread, nothing per chunk in Python.

The chunked codecs cut tensors into independent chunks. Looping over them in Python (a task, a few numpy
calls and a future per chunk) held the interpreter lock for most of the time and left a 16-core host
coding at about one core's rate. Here the chunks are rows of an int64 table; the table is cut into a few
contiguous ranges per worker, balanced by cost (`delta._cores.slices`), and each range is one compiled call
with the GIL released, taken by whichever thread is free (`delta._cores.in_threads`): the writer's scan with
its symbol counts, the rANS coder, the rANS decoder, and the reader's decode-and-place. Tensors reach the
compiled code as typed lists of flat arrays, so one call spans any number of tensors of one dtype.

Every function returns an error code and the row it stopped at instead of raising, so that the caller
reports the first bad chunk in file order with the words `_rans.DECODE_ERRORS` gives.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from . import _rans
from ._kernels import locate_chunk, scan_chunk


# -- writer -----------------------------------------------------------------------------------------------


@njit(nogil=True, cache=True)
def scan_rows(a_list, b_list, rows, shift, mask, ikeys, seeds, gap_hist, step_hist, tally):  # pragma: no cover
    """Scan the chunks `rows` ((tensor, lo, hi) each, tensors of one dtype in `a_list`/`b_list`): their changes,
    symbol counts (added to the histograms and the tally) and hash moves.

    Returns (cls, gaps, steps, table, moved): the changes of every row one after the other (as `scan_chunk`
    writes them; steps in the tensors' own width), per row (count, lowest class, highest class), and per row
    the two hash lanes' moves.

    The outputs have room for every element of the rows to change, so they never grow: only the pages the
    changes fill are ever touched (the rest is address space), and nothing is freed while the threads scan
    (growing by copying freed large blocks, whose unmapping stalled the other thread: a 2-thread scan ran
    slower than one).
    """
    n = rows.shape[0]
    table = np.empty((n, 3), np.int64)
    moved = np.empty((n, 2), np.uint64)
    room = 0
    for r in range(n):
        room += rows[r, 2] - rows[r, 1]
    cls = np.empty(room, np.uint16)
    gaps = np.empty(room, np.uint32)
    steps = np.empty(room, a_list[0].dtype)
    used = 0
    for r in range(n):
        t, lo, hi = rows[r, 0], rows[r, 1], rows[r, 2]
        key = (ikeys[t, 0], ikeys[t, 1], ikeys[t, 2], seeds[t, 0], seeds[t, 1])
        m, cmin, cmax, h0, h1 = scan_chunk(a_list[t], b_list[t], lo, hi, shift, mask, cls[used:], gaps[used:],
                                           steps[used:], key)
        if m:
            _rans.count_symbols(cls[used:used + m], gaps[used:used + m], steps[used:used + m], cmin, cmax, gap_hist,
                                step_hist, tally)
        table[r, 0], table[r, 1], table[r, 2] = m, cmin, cmax
        moved[r, 0], moved[r, 1] = h0, h1
        used += m
    return cls[:used], gaps[:used], steps[:used], table, moved


@njit(nogil=True, cache=True)
def count_rows(cls, gaps, steps, rows, gap_hist, step_hist, tally):  # pragma: no cover - compiled
    """Add the symbols of chunks `rows` ((first, end, lowest class, highest class) each) to the histograms and
    the tally (`_rans.count_symbols`)."""
    for r in range(rows.shape[0]):
        a, b = rows[r, 0], rows[r, 1]
        _rans.count_symbols(cls[a:b], gaps[a:b], steps[a:b], rows[r, 2], rows[r, 3], gap_hist, step_hist, tally)


@njit(nogil=True, cache=True)
def code_rows(cls_list, gaps_list, steps_list, rows, gap_model, step_model, freq, cum):  # pragma: no cover
    """rANS-code the chunks `rows` ((source, first, end, lowest class, highest class) each: changes first..end of
    source arrays `source` of the lists) under one family's models; returns (the words of every row one after
    the other, words per row)."""
    n = rows.shape[0]
    nwords = np.empty(n, np.int64)
    most, total = 0, 0
    for r in range(n):
        bound = 2 + 10 * (rows[r, 2] - rows[r, 1]) + (rows[r, 4] - rows[r, 3] + 1)
        most = max(most, bound)
        total += rows[r, 2] - rows[r, 1]
    scratch = np.empty(most, np.uint16)
    cap = max(total + 2 * n, 16)  # about a word per change to start with
    out = np.empty(cap, np.uint16)
    used = 0
    for r in range(n):
        s, a, b, lo, hi = rows[r, 0], rows[r, 1], rows[r, 2], rows[r, 3], rows[r, 4]
        bound = 2 + 10 * (b - a) + (hi - lo + 1)
        k = _rans.encode_chunk(cls_list[s][a:b], gaps_list[s][a:b], steps_list[s][a:b], lo, hi, gap_model,
                               step_model, freq, cum, scratch[:bound])
        if used + k > cap:
            cap = max(used + k, cap + cap // 2)
            grown = np.empty(cap, np.uint16)
            grown[:used] = out[:used]
            out = grown
        out[used:used + k] = scratch[bound - k:bound]
        nwords[r] = k
        used += k
    return out[:used], nwords


@njit(nogil=True, cache=True)
def gather_words(buffers, rows, out):  # pragma: no cover - compiled
    """Copy words into `out` in row order: row (buffer, start, count) of `buffers` after the previous row's."""
    at = 0
    for r in range(rows.shape[0]):
        src, start, count = rows[r, 0], rows[r, 1], rows[r, 2]
        out[at:at + count] = buffers[src][start:start + count]
        at += count


# -- reader -----------------------------------------------------------------------------------------------

# Columns of a decoding row (`decode_rows`).
FAMILY, WIDTH, SIZE, COUNT, W0, W1, LO, HI, OUT = range(9)


@njit(nogil=True, cache=True)
def decode_rows(words, rows, gap_models, step_models, freq, cum, lut, cls, ranks, steps):  # pragma: no cover
    """rANS-decode the chunks `rows` (columns FAMILY..OUT) into cls/ranks/steps at each row's OUT offset, class
    by class with ranks ascending in each chunk; with empty outputs, check the streams only (memory
    independent of the changes). Returns (error code, row) — (0, -1) when every chunk decodes."""
    store = cls.size > 0
    for r in range(rows.shape[0]):
        f, count, at = rows[r, FAMILY], rows[r, COUNT], rows[r, OUT]
        room = count if store else 0
        err = _rans.decode_chunk(words[rows[r, W0]:rows[r, W1]], rows[r, LO], rows[r, HI], rows[r, SIZE],
                                 rows[r, WIDTH], gap_models[f], step_models[f], freq, cum, lut, count,
                                 cls[at:at + room], ranks[at:at + room], steps[at:at + room])
        if err:
            return err, r
    return 0, -1


# Columns of a decode-and-place row (`place_rows`).
TENSOR, CHUNK_INDEX, P_COUNT, P_W0, P_W1, P_LO, P_HI, P_OUT = range(8)


@njit(nogil=True, cache=True)
def place_rows(words, rows, a_list, pos_list, val_list, dense, shift, mask, chunk, gap_model, step_model, freq, cum,
               lut, ikeys, seeds, moved):  # pragma: no cover - compiled
    """Decode the chunks `rows` (columns TENSOR..P_OUT; tensors of one dtype in `a_list`) and place their changes:
    positions and new values into `pos_list[t]`/`val_list[t]` at the row's P_OUT offset, or, for a `dense`
    tensor, the new values straight into `val_list[t]` (a copy of the old tensor). Hash moves per row into
    `moved`. Returns (error code, row) — (0, -1) when every chunk decodes and places."""
    width = a_list[0].itemsize * 8
    most = 1
    for r in range(rows.shape[0]):
        most = max(most, rows[r, P_COUNT])
    cls, ranks = np.empty(most, np.uint16), np.empty(most, np.int32)
    steps, val_scratch = np.empty(most, a_list[0].dtype), np.empty(most, a_list[0].dtype)
    pos_scratch = np.empty(most, np.int64)
    for r in range(rows.shape[0]):
        t, k, count, at = rows[r, TENSOR], rows[r, CHUNK_INDEX], rows[r, P_COUNT], rows[r, P_OUT]
        a = a_list[t]
        start = k * chunk
        end = min(a.size, start + chunk)
        err = _rans.decode_chunk(words[rows[r, P_W0]:rows[r, P_W1]], rows[r, P_LO], rows[r, P_HI], end - start,
                                 width, gap_model, step_model, freq, cum, lut, count, cls[:count], ranks[:count],
                                 steps[:count])
        if err:
            return err, r
        key = (ikeys[t, 0], ikeys[t, 1], ikeys[t, 2], seeds[t, 0], seeds[t, 1])
        if dense[t]:
            positions, values = pos_scratch[:count], val_scratch[:count]
        else:
            positions, values = pos_list[t][at:at + count], val_list[t][at:at + count]
        err, h0, h1 = locate_chunk(a, start, end, shift, mask, cls[:count], ranks[:count], steps[:count], positions,
                                   values, key)
        if err:
            return err, r
        if dense[t]:
            out = val_list[t]
            for j in range(count):
                out[positions[j]] = values[j]
        moved[r, 0], moved[r, 1] = h0, h1
    return 0, -1


@njit(cache=True)
def walk_rows(rows, changed, numel, masks, chunk):  # pragma: no cover - compiled
    """Assign the chunk table's rows (chunk, count, words, lowest class, highest class) to the tensors in order:
    a tensor's rows end where their counts reach its count. Checks each row as it goes.

    Returns (tensor of each row, first word of each row, rows used, words used, error, error row, error tensor,
    changes held when it stopped): error 1 = the table ends before a tensor's count is reached, 2 = a row is
    malformed (chunks not ascending or past the tensor, a count of 0 or past what is left, under 2 words,
    classes out of order or past the dtype's)."""
    n = rows.shape[0]
    owner = np.empty(n, np.int64)
    first_word = np.empty(n, np.int64)
    row, at = 0, 0
    for e in range(changed.size):
        held, previous = 0, -1
        chunks = max(1, -(-numel[e] // chunk))
        while held < changed[e]:
            if row >= n:
                return owner, first_word, row, at, 1, row, e, held
            k, count, words, lo, hi = rows[row, 0], rows[row, 1], rows[row, 2], rows[row, 3], rows[row, 4]
            size = min(numel[e], (k + 1) * chunk) - k * chunk
            if (not previous < k < chunks or not 1 <= count <= min(size, changed[e] - held) or words < 2
                    or not 0 <= lo <= hi <= masks[e]):
                return owner, first_word, row, at, 2, row, e, held
            owner[row] = e
            first_word[row] = at
            held += count
            previous = k
            at += words
            row += 1
    return owner, first_word, row, at, 0, -1, -1, 0


@njit(nogil=True, cache=True)
def sum_by(owner, moved, n):  # pragma: no cover - compiled
    """Per owner (0..n-1), the sums mod 2**64 of the rows' two lanes."""
    out = np.zeros((n, 2), np.uint64)
    for r in range(owner.size):
        out[owner[r], 0] += moved[r, 0]
        out[owner[r], 1] += moved[r, 1]
    return out

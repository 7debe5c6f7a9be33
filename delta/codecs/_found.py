"""The writer's first stage: the changes of every chunk found, and their symbols counted as they are.

The stage's table is `Found`: the changes of some chunks, one array each, and a row per chunk with changes
(columns TENSOR..CLASS_HI). On the host, `scan_rows` makes it from the chunks to scan (columns MEMBER..HI), one
compiled call per thread over a range of them (`scan_on_host`); on a device `_device_scan` makes it, and
`count_rows` counts its symbols. `sum_by` adds a table's hash moves up per tensor.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from numba import njit
from tqdm import tqdm

from .._cores import PerThread, in_threads, slices
from ..tensors import _device, _sumhash
from ..tensors._sumhash import TensorKey
from ..tensors.bits import bits
from . import _rans
from ._kernels import scan_chunk
from ._models import Counts

DEFAULT_CHUNK = 1 << 20  # elements per chunk unless the caller says
MAX_CHUNK = 1 << 26  # the most a file may say (a reader's bound)

# Columns of a chunk to scan (`chunks_of`, `scan_rows`): a member of the list of tensors scanned together, and the
# chunk's elements [LO, HI) in it.
MEMBER, LO, HI = range(3)

# Columns of `Found.rows`: the tensor (numbered in name order among the diff's tensors; `scan_rows` and
# `_device_scan.scan` number members of what they scanned), the chunk's number in it, its changes [FIRST, STOP) in
# the found arrays, its lowest and highest class with a change.
TENSOR, CHUNK, FIRST, STOP, CLASS_LO, CLASS_HI = range(6)


@dataclass
class Found:
    """The changes of some chunks of `width`-bit tensors, as a scan found them, chunk after chunk.

    Attributes:
        cls, gaps, steps: Per change: its class, the gap from the previous change of its class in its chunk (its
            rank for the first), its zigzag ULP step (>= 1) in the tensors' own width.
        rows: Per chunk with changes (int64, columns TENSOR..CLASS_HI), chunks of a tensor ascending.
        width: Bit width of the tensors.
    """

    cls: np.ndarray
    gaps: np.ndarray
    steps: np.ndarray
    rows: np.ndarray
    width: int


def chunk_size(chunk: int | None) -> int:
    """Elements per chunk for a caller's `chunk` (None: `DEFAULT_CHUNK`).

    Raises:
        ValueError: `chunk` is outside [1, MAX_CHUNK].
    """
    if chunk is None:
        return DEFAULT_CHUNK
    if not 1 <= chunk <= MAX_CHUNK:
        raise ValueError(f"chunk must be in [1, {MAX_CHUNK}] elements, got {chunk}")
    return chunk


def chunks_of(sizes: np.ndarray, chunk: int) -> np.ndarray:
    """The chunks (columns MEMBER..HI) of tensors of `sizes` elements, members in order, chunks ascending."""
    counts = np.maximum(1, -(-sizes // chunk))
    out = np.empty((int(counts.sum()), 3), np.int64)
    out[:, MEMBER] = np.repeat(np.arange(sizes.size, dtype=np.int64), counts)
    out[:, LO] = (np.arange(len(out), dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)) * chunk
    out[:, HI] = np.minimum(out[:, LO] + chunk, sizes[out[:, MEMBER]])
    return out


def span_elements(chunks: np.ndarray, lo: int, hi: int) -> int:
    """Elements of the chunks `lo:hi` (a span may cross tensors: LO and HI count from each tensor's start, so the
    last HI minus the first LO went negative, and the diff's progress bar ran backwards)."""
    return int((chunks[lo:hi, HI] - chunks[lo:hi, LO]).sum())


@njit(nogil=True, cache=True)
def scan_rows(a_list, b_list, chunks, chunk, shift, mask, ikeys, seeds, gap_hist, step_hist, tally):  # pragma: no cover
    """Scan `chunks` (columns MEMBER..HI; members of `a_list`/`b_list`, tensors of one dtype): their changes,
    symbol counts (added to the histograms and the tally) and hash moves.

    Returns (cls, gaps, steps, rows, moved): `Found`'s arrays and rows (TENSOR: the member), and per chunk scanned
    the two hash lanes' moves.

    The outputs have room for every element of the chunks to change, so they never grow: only the pages the
    changes fill are ever touched (the rest is address space), and nothing is freed while the threads scan
    (growing by copying freed large blocks, whose unmapping stalled the other thread: a 2-thread scan ran
    slower than one).
    """
    n = chunks.shape[0]
    rows = np.empty((n, 6), np.int64)
    moved = np.empty((n, 2), np.uint64)
    room = 0
    for r in range(n):
        room += chunks[r, HI] - chunks[r, LO]
    cls = np.empty(room, np.uint16)
    gaps = np.empty(room, np.uint32)
    steps = np.empty(room, a_list[0].dtype)
    used, kept = 0, 0
    for r in range(n):
        t, lo, hi = chunks[r, MEMBER], chunks[r, LO], chunks[r, HI]
        key = (ikeys[t, 0], ikeys[t, 1], ikeys[t, 2], seeds[t, 0], seeds[t, 1])
        m, cmin, cmax, h0, h1 = scan_chunk(
            a_list[t], b_list[t], lo, hi, shift, mask, cls[used:], gaps[used:], steps[used:], key
        )
        moved[r, 0], moved[r, 1] = h0, h1
        if m:
            _rans.count_symbols(
                cls[used : used + m],
                gaps[used : used + m],
                steps[used : used + m],
                cmin,
                cmax,
                gap_hist,
                step_hist,
                tally,
            )
            rows[kept, TENSOR], rows[kept, CHUNK], rows[kept, FIRST], rows[kept, STOP] = t, lo // chunk, used, used + m
            rows[kept, CLASS_LO], rows[kept, CLASS_HI] = cmin, cmax
            kept += 1
        used += m
    return cls[:used], gaps[:used], steps[:used], rows[:kept], moved


@njit(nogil=True, cache=True)
def count_rows(cls, gaps, steps, rows, gap_hist, step_hist, tally):  # pragma: no cover - compiled
    """Add the symbols of the chunks `rows` (`Found.rows`) to the histograms and the tally
    (`_rans.count_symbols`)."""
    for r in range(rows.shape[0]):
        a, b = rows[r, FIRST], rows[r, STOP]
        _rans.count_symbols(
            cls[a:b], gaps[a:b], steps[a:b], rows[r, CLASS_LO], rows[r, CLASS_HI], gap_hist, step_hist, tally
        )


@njit(nogil=True, cache=True)
def sum_by(owner, moved, n):  # pragma: no cover - compiled
    """Per owner (0..n-1), the sums mod 2**64 of the rows' two lanes."""
    out = np.zeros((n, 2), np.uint64)
    for r in range(owner.size):
        out[owner[r], 0] += moved[r, 0]
        out[owner[r], 1] += moved[r, 1]
    return out


def key_tables(keys: Mapping[str, TensorKey] | None, names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(base, block, skip) as int64 and the two seeds as uint64, one row per name (zeros without keys): the
    tensors' hash keys as the kernels take them."""
    rows = [_sumhash.kernel_key(keys[n] if keys is not None else None) for n in names]
    return (
        np.array([r[:3] for r in rows], np.int64).reshape(-1, 3),
        np.array([r[3:] for r in rows], np.uint64).reshape(-1, 2),
    )


def by_dtype(tensors: Mapping[str, torch.Tensor], names: Sequence[str]) -> dict[torch.dtype, list[str]]:
    """`names` by their tensors' dtype, in order."""
    out: dict[torch.dtype, list[str]] = defaultdict(list)
    for n in names:
        out[tensors[n].dtype].append(n)
    return out


def scan_on_host(
    old: Mapping[str, torch.Tensor],
    new: Mapping[str, torch.Tensor],
    names: list[str],
    keys: Mapping[str, TensorKey] | None,
    counts: Counts,
    moved: np.ndarray,
    workers: int,
    progress: str | None,
) -> list[Found]:
    """Scan the host tensors among `names` (the diff's tensors, in name order), dtype by dtype: one compiled call
    per range of chunks, ranges taken by `workers` threads; symbols counted into `counts`, each tensor's hash
    moves added to its row of `moved`; `progress`: a bar of that title."""
    index = {n: i for i, n in enumerate(names)}
    host = [n for n in names if _device.on_host(old[n])]
    found = []
    with tqdm(
        total=sum(old[n].numel() for n in host),
        desc=progress,
        unit="el",
        unit_scale=True,
        disable=progress is None or not host,
    ) as bar:
        for dtype, members in by_dtype(old, host).items():
            shift, mask = counts.classing.field(dtype)
            a_bits, b_bits = [bits(old[n].detach()) for n in members], [bits(new[n].detach()) for n in members]
            per_thread = PerThread(a_bits, b_bits)
            view = a_bits[0].dtype.type
            width = a_bits[0].itemsize * 8
            chunks = chunks_of(np.array([old[n].numel() for n in members], np.int64), counts.chunk)
            ikeys, seeds = key_tables(keys, members)

            def scan(
                lo: int,
                hi: int,
                chunks=chunks,
                per_thread=per_thread,
                shift=view(shift),
                mask=view(mask),
                ikeys=ikeys,
                seeds=seeds,
                width=width,
            ) -> tuple:
                a_list, b_list = per_thread.lists()
                with counts.borrowed(width) as (gap, step, tally):
                    out = scan_rows(
                        a_list, b_list, chunks[lo:hi], counts.chunk, shift, mask, ikeys, seeds, gap, step, tally
                    )
                bar.update(span_elements(chunks, lo, hi))
                return out

            spans = slices(chunks[:, HI] - chunks[:, LO], workers)
            tensor = np.array([index[n] for n in members], np.int64)
            for (lo, hi), (cls, gaps, steps, rows, row_moved) in zip(
                spans, in_threads(scan, spans, workers), strict=True
            ):
                moved += sum_by(tensor[chunks[lo:hi, MEMBER]], row_moved, len(names))
                rows[:, TENSOR] = tensor[rows[:, TENSOR]]
                found.append(Found(cls, gaps, steps, rows, width))
    return found

"""The writer's second stage: the found chunks put in file order and rANS-coded, width by width.

The stage's tables: `Plan`, the found rows in file order (`_found`'s columns) and per width a `WidthPlan`, whose
coding rows (columns SOURCE..CLASS_HI) `code_rows` reads, a range of them per compiled call; and `Coded`, what
the coder wrote: stream `chunks`' rows (`_parsed`'s columns S_CHUNK..S_CLASS_HI) and the words. Made while the
models are built (`_models.WriterModels.building`): a plan is all a coder needs but the models.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from .._cores import in_threads, slices, typed
from . import _found, _rans
from ._models import GAP, STEP, Classing, WriterModels
from ._parsed import S_CHUNK, S_CLASS_HI, S_CLASS_LO, S_COUNT, S_WORDS
from ._workspace import Workspace

# Columns of a coding row (`code_rows`): which of its width's found arrays the chunk's changes are in (an index
# into `WidthPlan.lists`), the changes [FIRST, STOP) there, the chunk's lowest and highest class with a change.
SOURCE, FIRST, STOP, CLASS_LO, CLASS_HI = range(5)

# Columns of a row of `gather_words`: the buffer a chunk's words are in, where they start, how many.
BUFFER, START, COUNT = range(3)


@dataclass
class WidthPlan:
    """The chunks of one bit width, whose models are their own.

    Attributes:
        width: Bit width of their tensors.
        rows: Their rows in the plan's `rows` (file order).
        lists: Typed lists (`delta._cores.typed`) of the found arrays they read: cls, gaps, steps.
        coding: Their coding rows (columns SOURCE..CLASS_HI), in the same order.
    """

    width: int
    rows: np.ndarray
    lists: tuple
    coding: np.ndarray


@dataclass
class Plan:
    """The chunks with changes of one diff in file order (tensors by name, chunks ascending; `_found`'s columns),
    and per width what coding them needs."""

    rows: np.ndarray
    widths: list[WidthPlan]

    @classmethod
    def of(cls, found: list[_found.Found]) -> Plan:
        found = [f for f in found if len(f.rows)]
        if not found:
            return cls(np.zeros((0, 6), np.int64), [])
        source = np.repeat(np.arange(len(found)), [len(f.rows) for f in found])
        rows = np.concatenate([f.rows for f in found])
        order = np.lexsort((rows[:, _found.CHUNK], rows[:, _found.TENSOR]))
        rows, source = rows[order], source[order]
        widths = np.array([f.width for f in found], np.int64)[source]
        plan = []
        for width in np.unique(widths).tolist():
            sel = np.flatnonzero(widths == width)
            used = np.unique(source[sel])
            lists = tuple(typed([getattr(found[i], f) for i in used.tolist()]) for f in ("cls", "gaps", "steps"))
            coding = np.empty((sel.size, 5), np.int64)
            coding[:, SOURCE] = np.searchsorted(used, source[sel])
            coding[:, FIRST], coding[:, STOP] = rows[sel, _found.FIRST], rows[sel, _found.STOP]
            coding[:, CLASS_LO], coding[:, CLASS_HI] = rows[sel, _found.CLASS_LO], rows[sel, _found.CLASS_HI]
            plan.append(WidthPlan(width, sel, lists, coding))
        return cls(rows, plan)


@dataclass
class Coded:
    """What the coder wrote, in file order.

    Attributes:
        rows: Stream `chunks`' rows (columns `_parsed.S_CHUNK..S_CLASS_HI`).
        tensor: Each row's tensor (numbered in name order among the diff's tensors).
        words: Every chunk's words, one chunk after the other, in the caller's `Workspace` (copy them out
            before letting go of it).
    """

    rows: np.ndarray
    tensor: np.ndarray
    words: np.ndarray


@njit(nogil=True, cache=True)
def code_rows(cls_list, gaps_list, steps_list, rows, gap_model, step_model, freq, cum):  # pragma: no cover
    """rANS-code the chunks `rows` (columns SOURCE..CLASS_HI) under one width's models; returns (the words of every
    row one after the other, words per row)."""
    n = rows.shape[0]
    nwords = np.empty(n, np.int64)
    most, total = 0, 0
    for r in range(n):
        bound = 2 + 10 * (rows[r, STOP] - rows[r, FIRST]) + (rows[r, CLASS_HI] - rows[r, CLASS_LO] + 1)
        most = max(most, bound)
        total += rows[r, STOP] - rows[r, FIRST]
    scratch = np.empty(most, np.uint16)
    cap = max(total + 2 * n, 16)  # about a word per change to start with
    out = np.empty(cap, np.uint16)
    used = 0
    for r in range(n):
        s, a, b, lo, hi = rows[r, SOURCE], rows[r, FIRST], rows[r, STOP], rows[r, CLASS_LO], rows[r, CLASS_HI]
        bound = 2 + 10 * (b - a) + (hi - lo + 1)
        k = _rans.encode_chunk(
            cls_list[s][a:b],
            gaps_list[s][a:b],
            steps_list[s][a:b],
            lo,
            hi,
            gap_model,
            step_model,
            freq,
            cum,
            scratch[:bound],
        )
        if used + k > cap:
            cap = max(used + k, cap + cap // 2)
            grown = np.empty(cap, np.uint16)
            grown[:used] = out[:used]
            out = grown
        out[used : used + k] = scratch[bound - k : bound]
        nwords[r] = k
        used += k
    return out[:used], nwords


@njit(nogil=True, cache=True)
def gather_words(buffers, rows, out):  # pragma: no cover - compiled
    """Copy words into `out` in row order (columns BUFFER..COUNT of `buffers`), each row's after the previous."""
    at = 0
    for r in range(rows.shape[0]):
        src, start, count = rows[r, BUFFER], rows[r, START], rows[r, COUNT]
        out[at : at + count] = buffers[src][start : start + count]
        at += count


def code(plan: Plan, models: WriterModels, classing: Classing, workers: int, workspace: Workspace) -> Coded:
    """rANS-code every chunk of `plan`, width by width, one compiled call per range of rows, ranges taken by
    `workers` threads (each call also notes, on its thread, where its words went); the words gathered into
    `workspace`'s memory."""
    rows = plan.rows
    where = np.zeros((len(rows), 3), np.int64)  # columns BUFFER..COUNT
    buffers: list[np.ndarray] = []
    for part in plan.widths:
        classes = classing.classes(part.width)
        gap_model, step_model = models.of(GAP, part.width, classes), models.of(STEP, part.width, classes)
        spans = slices(part.coding[:, STOP] - part.coding[:, FIRST], workers)
        first = len(buffers)

        def code_span(
            lo: int, hi: int, part=part, gap_model=gap_model, step_model=step_model, first=first, spans=spans
        ) -> np.ndarray:
            words, counts = code_rows(*part.lists, part.coding[lo:hi], gap_model, step_model, models.freq, models.cum)
            at = part.rows[lo:hi]
            where[at, COUNT] = counts
            where[at, BUFFER] = first + spans.index((lo, hi))
            where[at, START] = np.cumsum(counts) - counts
            return words

        buffers += in_threads(code_span, spans, workers)
    words = workspace.words(int(where[:, COUNT].sum()))
    if len(plan.widths) == 1:  # one width: its spans' words are in file order already
        np.concatenate(buffers, out=words)
    elif buffers:
        gather_words(typed(buffers), where, words)
    out = np.empty((len(rows), 5), np.int64)
    out[:, S_CHUNK] = rows[:, _found.CHUNK]
    out[:, S_COUNT] = rows[:, _found.STOP] - rows[:, _found.FIRST]
    out[:, S_WORDS] = where[:, COUNT]
    out[:, S_CLASS_LO], out[:, S_CLASS_HI] = rows[:, _found.CLASS_LO], rows[:, _found.CLASS_HI]
    return Coded(out, rows[:, _found.TENSOR], words)

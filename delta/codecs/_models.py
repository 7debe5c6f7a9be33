"""The rANS models of one delta: counted as the writer scans (`Counts`), built from the counts and written as
stream `models` by the writer (`WriterModels`), parsed from that stream by the reader (`ReaderModels`).

A model codes one kind of value (`GAP`: position gaps, `STEP`: ULP steps) of one bit width in one class; a delta's
models serve all its chunks. The writer's and the reader's tables differ in layout, each for its own reason:

- the writer's: int64 (quantising sums counts), a column per symbol the widths' values can need
  (`_rans.writer_symbols`), so that quantising and coding touch only those;
- the reader's: int32 (half the room), `_rans.ALPHABET` columns (any symbol a file may hold), with the decoder's
  coarse lookup table.

In both, END sits in the last column (`_rans.end_column`) and below it a column is its symbol.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from .._cores import Started, slices
from ..errors import DeltaFormatError
from ..tensors.bits import classes_of_width, layout_of
from . import _rans
from ._workspace import Workspace

GAP, STEP = 0, 1  # the kinds of model
Key = tuple[int, int, int]  # (kind, width in bits, class): a model's place in stream `models`


@dataclass(frozen=True)
class Classing:
    """How a codec splits elements into classes: by the exponent field of the old value (`ctx`), or all in one
    (`gap`, whose ranks are then positions)."""

    context: bool

    def field(self, dtype: torch.dtype) -> tuple[int, int]:
        """(shift, mask) of the class field in `dtype`'s bit patterns; (0, 0) for one class."""
        layout = layout_of(dtype)
        return (layout.shift, layout.mask) if self.context else (0, 0)

    def classes(self, width: int) -> int:
        """Classes of `width`-bit tensors."""
        return classes_of_width(width) if self.context else 1


class Counts:
    """Symbol counts per (width, class) of one delta. A thread borrows histograms for a range of chunks and gives
    them back: `workers` sets per width, made at its first use as one (workers, classes, symbols) array per kind
    (the writer's symbols of the width, `_rans.writer_symbols`) and a (workers, classes, 2) tally of ENDs and
    changes per class, whatever the number of ranges or groups; they are summed once, by `WriterModels.building`."""

    def __init__(self, classing: Classing, workers: int, chunk: int) -> None:
        self.classing = classing
        self.workers = workers
        self.chunk = chunk
        self._made: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}  # width -> (gap, step, tally)
        self._free: dict[int, list[int]] = {}
        self._lock = threading.Lock()

    @contextmanager
    def borrowed(self, width: int) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Histograms and tally for changes of `width` (dtypes of one width share their models), this thread's
        until the block ends."""
        with self._lock:
            if width not in self._made:
                shape = (self.workers, self.classing.classes(width), _rans.writer_symbols(width, self.chunk))
                self._made[width] = (
                    np.zeros(shape, np.int32),
                    np.zeros(shape, np.int32),
                    np.zeros(shape[:2] + (2,), np.int64),
                )
                self._free[width] = list(range(self.workers))
            i = self._free[width].pop()  # never empty: at most `workers` threads borrow at once
        gap, step, tally = self._made[width]
        try:
            yield gap[i], step[i], tally[i]
        finally:
            with self._lock:
                self._free[width].append(i)

    def histograms(self) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Per width, the (gap, step) histograms and the tally of every set (their counts add up to the
        delta's)."""
        return dict(self._made)


class _Models:
    """Which model codes which class: the models' keys in stream order, and per (kind, width, classes) the model
    of each class."""

    def __init__(self, keys: list[Key]) -> None:
        self.keys = keys
        self._keys = np.array(keys, np.int64).reshape(-1, 3)
        self._of: dict[Key, np.ndarray] = {}

    def of(self, kind: int, width: int, classes: int) -> np.ndarray:
        """Model index per class (-1: none) for one kind and width (read only; shared between threads)."""
        key = (kind, width, classes)
        if key not in self._of:
            out = np.full(classes, -1, np.int32)
            k, w, c = self._keys.T
            mine = np.flatnonzero((k == kind) & (w == width) & (c < classes))
            out[c[mine]] = mine
            self._of[key] = out
        return self._of[key]


class WriterModels(_Models):
    """The writer's models: frequencies and cumulative starts in the writer's layout (module docstring), in the
    caller's `Workspace`."""

    def __init__(self, keys: list[Key], freq: np.ndarray, cum: np.ndarray) -> None:
        super().__init__(keys)
        self.freq = freq
        self.cum = cum

    @classmethod
    def building(cls, counts: Counts, workers: int, workspace: Workspace) -> tuple[WriterModels, Started]:
        """The models of every (kind, width, class) with a count, and the threads that fill their tables, started:
        `workers - 1` threads begin at once, the caller joins them by leaving `with filling:` (doing other work
        in the block meanwhile), and only then may the tables be read.

        The classes with models come from the tally (gap models: the classes with an END, which every class in
        a chunk's class range counts; step models: those with a change), not from the histograms, most of whose
        rows no scan wrote (reading them faults in a page each). The models are cut into equal shares on
        `workers` threads (the classes used cluster: ranges of classes would leave one thread most of the work),
        each summed, quantised and accumulated by a few compiled calls per share (`_rans.fill_models`)."""
        hists = sorted(counts.histograms().items())
        tallies = {width: tally.sum(axis=0) for width, (_, _, tally) in hists}
        jobs = [(GAP, width, gap, np.flatnonzero(tallies[width][:, 0])) for width, (gap, _, _) in hists]
        jobs += [(STEP, width, step, np.flatnonzero(tallies[width][:, 1])) for width, (_, step, _) in hists]
        keys = [(kind, width, c) for kind, width, _, classes in jobs for c in classes.tolist()]
        freq, cum = workspace.writer_tables(len(keys), max((counted.shape[2] for *_, counted, _ in jobs), default=2))
        start = np.cumsum([0] + [len(classes) for *_, classes in jobs]).tolist()

        def fill(lo: int, hi: int) -> None:  # models lo..hi-1, across the jobs that found them
            for i, (_, _, counted, classes) in enumerate(jobs):
                a, b = max(lo, start[i]), min(hi, start[i + 1])
                if a < b:
                    _rans.fill_models(counted, classes[a - start[i] : b - start[i]], freq[a:b], cum[a:b])

        return cls(keys, freq, cum), Started(fill, slices(np.ones(len(keys)), workers), workers)

    def to_table(self) -> np.ndarray:
        """Stream `models`: per model (kind, width, class, k) then its k (symbol minus the previous, frequency)
        pairs, made for every model at once."""
        model, at_column = np.nonzero(self.freq)
        symbol = np.where(at_column == _rans.end_column(self.freq), _rans.END, at_column)
        k = np.bincount(model, minlength=len(self.keys))
        step = np.diff(symbol, prepend=0)
        firsts = (np.cumsum(k) - k)[k > 0]
        step[firsts] = symbol[firsts]  # a model's first symbol counts from 0
        out = np.empty(4 * len(self.keys) + 2 * model.size, np.int64)
        head = 4 * np.arange(len(self.keys)) + 2 * (np.cumsum(k) - k)
        for column, values in enumerate(zip(*self.keys, strict=True)):
            out[head + column] = values
        out[head + 3] = k
        at = 4 * (model + 1) + 2 * np.arange(model.size)  # pair j of model i follows i + 1 headers and j pairs
        out[at], out[at + 1] = step, self.freq[model, at_column]
        return out.astype(np.uint32)


class ReaderModels(_Models):
    """The reader's models, parsed from stream `models`: frequencies, cumulative starts and the decoder's coarse
    lookup (`_rans.lookup`), in the reader's layout (module docstring), in the caller's `Workspace`."""

    def __init__(self, keys: list[Key], freq: np.ndarray, cum: np.ndarray, lut: np.ndarray) -> None:
        super().__init__(keys)
        self.freq = freq
        self.cum = cum
        self.lut = lut

    @classmethod
    def parse(cls, data: np.ndarray, allowed: dict[Key, int], workspace: Workspace) -> ReaderModels:
        """Parse stream `models`: every model must be one of `allowed` (the chunk table's classes), none with a
        symbol above the largest its values can take (`allowed[key]`; END besides for gap models).

        Raises:
            DeltaFormatError: the stream is malformed, or a model is not allowed.
        """
        keys: list[Key] = []
        freqs, cum, lut = workspace.reader_tables(len(allowed))
        freqs.fill(0)
        at = 0
        while at < data.size:
            if at + 4 > data.size:
                raise DeltaFormatError("stream 'models' ends early")
            kind, width, c, k = (int(v) for v in data[at : at + 4])
            at += 4
            key = (kind, width, c)
            if key not in allowed:
                raise DeltaFormatError(f"stream 'models' has a model no chunk of this delta uses: {key}")
            if (keys and key <= keys[-1]) or not 1 <= k <= _rans.ALPHABET or at + 2 * k > data.size:
                raise DeltaFormatError(f"model {key} is malformed")
            pairs = data[at : at + 2 * k].astype(np.int64).reshape(-1, 2)
            at += 2 * k
            symbols = np.cumsum(pairs[:, 0])
            if (
                (pairs[1:, 0] <= 0).any()
                or symbols[-1] >= _rans.ALPHABET
                or (pairs[:, 1] <= 0).any()
                or int(pairs[:, 1].sum()) != _rans.PROB_SCALE
            ):
                raise DeltaFormatError(f"model {key} is malformed")
            top = int(symbols[-1])
            if kind == GAP and top == _rans.END:  # END closes a class's gaps; the values' symbols come below it
                top = int(symbols[-2]) if k > 1 else -1
            if top > allowed[key]:
                raise DeltaFormatError(f"model {key} has symbols for values its tensors cannot hold")
            freqs[len(keys), symbols] = pairs[:, 1]
            keys.append(key)
        n = len(keys)
        return cls(keys, freqs[:n], _rans.cumulative(freqs[:n], cum[:n]), _rans.lookup(cum[:n], lut[:n]))

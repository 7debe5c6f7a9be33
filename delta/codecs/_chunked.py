"""Codecs `ctx` (the default) and `gap`: independent chunks of class-rank gaps and ULP steps under rANS.

Values are stored relative to the old value the reader already holds: the difference of the two bit
patterns in float order, zigzag folded, so a one-ULP step is a small number.

`ctx` conditions on the old value. After an AdamW step at RL learning rates a bf16 weight changes
only if the step exceeds half its ULP, which its exponent sets, so the exponent predicts whether an
element changes and by how many ULPs. Elements are split into classes by the exponent of their old
value; positions are coded as gaps between *ranks inside the class*, which the reader recovers by
scanning its own old tensor, and every (kind, width, class) has its own model. `gap` is the same
with one class: plain position gaps, and decoding touches only the changed elements.

Every tensor is cut into chunks of `chunk` elements (the first value of stream `chunks`); ranks
restart in each chunk, so chunks are coded and decoded independently: the chunks of many tensors are rows
of one table, and each worker thread makes one compiled call over its slice of the rows (`_batch`).

Streams:
  `models`  zstd uint32: per model, sorted by (kind, width, class): kind (0 gap, 1 step), width,
            class, k, then k (symbol minus the previous symbol, frequency) pairs; the frequencies
            of a model sum to 2**15 (see `_rans`).
  `chunks`  zstd uint32: the chunk size, then per chunk with changes (tensors in name order, chunks
            ascending): its index in the tensor, changed elements, rANS words (at least 2), lowest
            and highest class with a change. A tensor's rows end where their counts reach its count,
            so the table is never larger than a fixed multiple of the words it describes.
  `words`   the chunks' rANS words, uint16 little-endian, one chunk after the other.
"""

from __future__ import annotations

import contextvars
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass

import numpy as np
import torch
from tqdm import tqdm

from .._cores import PerThread, Started, in_threads, resolve_workers, slices, typed
from .._stages import stage
from ..errors import DeltaFormatError
from ..tensors import _device, _groups, _sumhash
from ..tensors.bits import DTYPE_NAMES, DTYPES_BY_NAME, bits, classes_of_width, layout_of
from . import _batch, _device_scan, _rans
from ._base import Change, Codec, Encoded, TensorEntry
from ._streams import pack, unpack

CHUNK = 1 << 20
MAX_CHUNK = 1 << 26
Key = tuple[int, int, int]  # (kind index, width in bits, class)


class _Models:
    """The models of one delta: frequencies and decoder tables, and which model serves which class."""

    def __init__(self, keys: list[Key], freqs: np.ndarray, decoding: bool = False, cum: np.ndarray | None = None
                 ) -> None:
        self.keys = keys
        self.freq = freqs
        self.cum = _rans.cumulative(freqs) if cum is None else cum  # `cum` given: the writer's, made with freqs
        self.lut = _rans.lookup(self.cum) if decoding else None  # the decoder's table: a writer needs none
        self._keys = np.array(keys, np.int64).reshape(-1, 3)
        self._of: dict[tuple[int, int, int], np.ndarray] = {}

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

    @classmethod
    def started(cls, counts: _Counts, workers: int) -> Callable[[], _Models]:
        """Start building the models (`workers - 1` threads begin; the caller may prepare other work), and
        return the call that joins the building and returns them.

        The models of every (kind, width, class) with a count, from the counts' histograms: the classes with
        models read from the tally (gap models: the classes with an END, which every class in a chunk's class
        range counts; step models: those with a change), not from the histograms, most of whose rows no scan
        wrote (reading them faults in a page each), then cut into equal shares on `workers` threads (the
        classes used cluster: ranges of classes would leave one thread most of the work), summed, quantised and
        accumulated by a few compiled calls per share into the tables (`_WriterTables`)."""
        hists = sorted(counts.histograms().items())
        tallies = {width: tally.sum(axis=0) for width, (_, _, tally) in hists}
        jobs = [(0, width, gap, np.flatnonzero(tallies[width][:, 0])) for width, (gap, _, _) in hists]
        jobs += [(1, width, step, np.flatnonzero(tallies[width][:, 1])) for width, (_, step, _) in hists]
        keys = [(kind, width, c) for kind, width, _, classes in jobs for c in classes.tolist()]
        freq, cum = _WRITER_TABLES.take(len(keys), max((counted.shape[2] for *_, counted, _ in jobs), default=2))
        start = np.cumsum([0] + [len(classes) for *_, classes in jobs]).tolist()

        def fill(lo: int, hi: int) -> None:  # models lo..hi-1, across the jobs that found them
            for i, (_, _, counted, classes) in enumerate(jobs):
                a, b = max(lo, start[i]), min(hi, start[i + 1])
                if a < b:
                    _rans.fill_models(counted, classes[a - start[i]:b - start[i]], freq[a:b], cum[a:b])

        filling = Started(fill, slices(np.ones(len(keys)), workers), workers)

        def join() -> _Models:
            filling.join()
            return cls(keys, freq, cum=cum)

        return join

    def to_table(self) -> np.ndarray:
        """Stream `models`: per model (kind, width, class, k) then its k (symbol minus the previous, frequency)
        pairs, made for every model at once."""
        model, at_column = np.nonzero(self.freq)
        symbol = np.where(at_column == self.freq.shape[1] - 1, _rans.END, at_column)  # the writer's tables: END last
        k = np.bincount(model, minlength=len(self.keys))
        step = np.diff(symbol, prepend=0)
        firsts = (np.cumsum(k) - k)[k > 0]
        step[firsts] = symbol[firsts]  # a model's first symbol counts from 0
        out = np.empty(4 * len(self.keys) + 2 * model.size, np.int64)
        head = 4 * np.arange(len(self.keys)) + 2 * (np.cumsum(k) - k)
        for column, values in enumerate(zip(*self.keys)):
            out[head + column] = values
        out[head + 3] = k
        at = 4 * (model + 1) + 2 * np.arange(model.size)  # pair j of model i follows i + 1 headers and j pairs
        out[at], out[at + 1] = step, self.freq[model, at_column]
        return out.astype(np.uint32)

    @classmethod
    def from_table(cls, data: np.ndarray, allowed: dict[Key, int]) -> _Models:
        """Parse stream `models`: every model must be one of `allowed` (the chunk table's classes), none with a
        symbol above the largest its values can take (`allowed[key]`; END besides for gap models)."""
        keys: list[Key] = []
        freqs = np.zeros((len(allowed), _rans.ALPHABET), np.int32)  # int32: half the room of the writer's tables
        at = 0
        while at < data.size:
            if at + 4 > data.size:
                raise DeltaFormatError("stream 'models' ends early")
            kind, width, c, k = (int(v) for v in data[at:at + 4])
            at += 4
            key = (kind, width, c)
            if key not in allowed:
                raise DeltaFormatError(f"stream 'models' has a model no chunk of this delta uses: {key}")
            if (keys and key <= keys[-1]) or not 1 <= k <= _rans.ALPHABET or at + 2 * k > data.size:
                raise DeltaFormatError(f"model {key} is malformed")
            pairs = data[at:at + 2 * k].astype(np.int64).reshape(-1, 2)
            at += 2 * k
            symbols = np.cumsum(pairs[:, 0])
            if ((pairs[1:, 0] <= 0).any() or symbols[-1] >= _rans.ALPHABET or (pairs[:, 1] <= 0).any()
                    or int(pairs[:, 1].sum()) != _rans.PROB_SCALE):
                raise DeltaFormatError(f"model {key} is malformed")
            top = int(symbols[-1])
            if kind == 0 and top == _rans.END:  # END closes a class's gaps; the values' symbols come below it
                top = int(symbols[-2]) if k > 1 else -1
            if top > allowed[key]:
                raise DeltaFormatError(f"model {key} has symbols for values its tensors cannot hold")
            freqs[len(keys), symbols] = pairs[:, 1]
            keys.append(key)
        return cls(keys, freqs[:len(keys)], decoding=True)


class _WriterTables(threading.local):
    """The writer's frequency and cumulative tables, and the words of its chunks, kept by each thread for its next
    diff up to `KEPT` models at the full alphabet and `KEPT_WORDS` words.

    Fresh memory costs a page fault for every 4 KB filled (~1.5 ms for SmolLM2's 126 models, more than filling
    them, ~0.2 ms for its words; faults do not run side by side on two threads); a diff's models and words live
    only while it codes (the words are copied into the delta's stream), so a thread's next diff can take the
    same memory. Larger ones are made afresh and not kept. The tables are in the writer's layout: a column per
    symbol its widths can need, END in the last (`_rans.writer_symbols`)."""

    KEPT = 512  # models of _rans.ALPHABET symbols: 2 x 15 KB each, ~15 MB a thread at most
    KEPT_WORDS = 1 << 23  # 16 MB

    def __init__(self) -> None:
        self._freq = np.empty(0, np.int64)
        self._cum = np.empty(0, np.int64)
        self._words = np.empty(0, np.uint16)

    def take(self, models: int, symbols: int) -> tuple[np.ndarray, np.ndarray]:
        """Tables of `symbols` columns (`cum`: one more) for `models` models (contents undefined), valid until this
        thread's next call."""
        need = models * (symbols + 1)
        if need > self.KEPT * (_rans.ALPHABET + 1):
            return np.empty((models, symbols), np.int64), np.empty((models, symbols + 1), np.int64)
        if need > self._cum.size:
            size = min(self.KEPT * (_rans.ALPHABET + 1), max(need, 2 * self._cum.size))
            self._freq, self._cum = np.empty(size, np.int64), np.empty(size, np.int64)
        return (self._freq[:models * symbols].reshape(models, symbols),
                self._cum[:need].reshape(models, symbols + 1))

    def words(self, n: int) -> np.ndarray:
        """Room for `n` words (contents undefined), valid until this thread's next call."""
        if n > self.KEPT_WORDS:
            return np.empty(n, np.uint16)
        if n > self._words.size:
            self._words = np.empty(min(self.KEPT_WORDS, max(n, 2 * self._words.size)), np.uint16)
        return self._words[:n]


_WRITER_TABLES = _WriterTables()


def _chunks_of(numel: int, chunk: int) -> int:
    return max(1, -(-numel // chunk))


@dataclass
class _Found:
    """The changes of some chunks as a scan found them: one array each, chunk after chunk, and a row per chunk
    with changes: (tensor, chunk in the tensor, first change, one past its last, lowest class, highest class),
    tensors numbered in name order; all of tensors of `width` bits."""

    cls: np.ndarray
    gaps: np.ndarray
    steps: np.ndarray
    rows: np.ndarray
    width: int


class _Counts:
    """Symbol counts per (width, class) of one delta. A thread borrows histograms for a range of chunks and gives
    them back: `workers` sets per width, made at its first use as one (workers, classes, symbols) array per kind
    (the writer's symbols of the width, `_rans.writer_symbols`) and a (workers, classes, 2) tally of ENDs and
    changes per class, whatever the number of ranges or groups; they are summed once, by `_Models.started`."""

    def __init__(self, classes: Callable[[int], int], workers: int, chunk: int) -> None:
        self.classes = classes  # classes of a width (the codec's `_classes`)
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
                shape = (self.workers, self.classes(width), _rans.writer_symbols(width, self.chunk))
                self._made[width] = (np.zeros(shape, np.int32), np.zeros(shape, np.int32),
                                     np.zeros(shape[:2] + (2,), np.int64))
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


def _ordered_chunks(sizes: np.ndarray, chunk: int) -> np.ndarray:
    """(member, lo, hi) of every chunk of tensors of `sizes` elements, members in order, chunks ascending."""
    counts = np.maximum(1, -(-sizes // chunk))
    member = np.repeat(np.arange(sizes.size, dtype=np.int64), counts)
    k = np.arange(member.size, dtype=np.int64) - np.repeat(np.cumsum(counts) - counts, counts)
    lo = k * chunk
    return np.stack([member, lo, np.minimum(lo + chunk, sizes[member])], axis=1)


def _key_tables(keys, names: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """(base, block, skip) as int64 and the two seeds as uint64, one row per name (zeros without keys)."""
    rows = [_sumhash.kernel_key(keys[n] if keys is not None else None) for n in names]
    return (np.array([r[:3] for r in rows], np.int64).reshape(-1, 3),
            np.array([r[3:] for r in rows], np.uint64).reshape(-1, 2))


def _by_dtype(tensors, names: list[str]) -> dict[torch.dtype, list[str]]:
    out: dict[torch.dtype, list[str]] = defaultdict(list)
    for n in names:
        out[tensors[n].dtype].append(n)
    return out


@dataclass
class _Plan:
    """The chunks with changes in file order (tensors by name, chunks ascending; `_Found.rows`' columns) and,
    per width, which of them it holds, the typed lists of the found arrays they read, and their coding rows
    (source array, first, end, lowest class, highest class): all a coder needs but the models, so it is made
    while they are built."""

    rows: np.ndarray
    widths: list[tuple[int, np.ndarray, tuple, np.ndarray]]

    @classmethod
    def of(cls, found: list[_Found]) -> _Plan:
        found = [f for f in found if len(f.rows)]
        if not found:
            return cls(np.zeros((0, 6), np.int64), [])
        source = np.repeat(np.arange(len(found)), [len(f.rows) for f in found])
        rows = np.concatenate([f.rows for f in found])
        order = np.lexsort((rows[:, 1], rows[:, 0]))
        rows, source = rows[order], source[order]
        widths = np.array([f.width for f in found], np.int64)[source]
        plan = []
        for width in np.unique(widths).tolist():
            sel = np.flatnonzero(widths == width)
            used = np.unique(source[sel])
            local = np.searchsorted(used, source[sel])
            lists = tuple(typed([getattr(found[i], f) for i in used.tolist()]) for f in ("cls", "gaps", "steps"))
            plan.append((width, sel, lists, np.stack([local, rows[sel, 2], rows[sel, 3], rows[sel, 4], rows[sel, 5]],
                                                     axis=1)))
        return cls(rows, plan)


class ChunkedCodec(Codec):
    """Class-rank gaps + ULP steps in independent chunks under rANS; `context=False` is `gap` (one class)."""

    form = "sparse"
    STREAMS = frozenset({"models", "chunks", "words"})

    def __init__(self, context: bool) -> None:
        self.context = context
        self.name = "ctx" if context else "gap"
        self.description = ("gaps of in-class ranks (class = old exponent) + ULP steps, rANS per class, chunked"
                            if context else "position gaps + ULP steps, rANS, chunked")

    def _field(self, dtype: torch.dtype) -> tuple[int, int]:
        layout = layout_of(dtype)
        return (layout.shift, layout.mask) if self.context else (0, 0)

    def _classes(self, width: int) -> int:
        return classes_of_width(width) if self.context else 1

    # -- encode -----------------------------------------------------------------------------------

    def encode(self, old, new, names, progress=False, workers=None, chunk=None, keys=None):
        chunk = CHUNK if chunk is None else chunk
        if not 1 <= chunk <= MAX_CHUNK:
            raise ValueError(f"chunk must be in [1, {MAX_CHUNK}] elements, got {chunk}")
        workers = resolve_workers(workers)
        names = sorted(names)
        counts = _Counts(self._classes, workers, chunk)
        moved = np.zeros((len(names), 2), np.uint64)  # per tensor, the hash lanes' moves
        with _device.Staging() as staging:  # the device scans' host copies live until coded
            found = self._scan_on_device(old, new, names, chunk, keys, counts, moved, workers, progress, staging)
            with stage("scan"):  # the host scan hashes and counts symbols as it goes: all in this stage
                found += self._scan_on_host(old, new, names, chunk, keys, counts, moved, workers, progress)
            with stage("code"):
                building = _Models.started(counts, workers)
                try:
                    plan = _Plan.of(found)
                finally:  # joined whatever happens: the threads fill this thread's kept tables
                    models = building()
                table, words = self._code(plan, models, workers)
        changed = np.bincount(table[:, 0], weights=table[:, 2], minlength=len(names)).astype(np.int64)
        entries = [TensorEntry(name, DTYPE_NAMES[old[name].dtype], tuple(old[name].shape), "sparse", int(c))
                   for name, c in zip(names, changed.tolist()) if c]
        sums = ({name: (int(moved[i, 0]), int(moved[i, 1])) for i, name in enumerate(names) if changed[i]}
                if keys is not None else None)
        rows = np.concatenate([[chunk], table[:, 1:].reshape(-1)]).astype(np.uint32)
        blobs = {"models": pack(models.to_table()), "chunks": pack(rows),
                 "words": words.astype("<u2", copy=False).view(np.uint8)}  # copied out of the writer's words here
        return Encoded(entries, {k: torch.frombuffer(bytearray(v), dtype=torch.uint8) if len(v) else
                                 torch.empty(0, dtype=torch.uint8) for k, v in blobs.items()}, sums)

    def _scan_on_host(self, old, new, names, chunk, keys, counts: _Counts, moved, workers, progress) -> list[_Found]:
        """The compiled scan of the host tensors among `names`, dtype by dtype: one call per worker, each over its
        share of the chunks (changes, symbol counts and hash moves)."""
        index = {n: i for i, n in enumerate(names)}
        host = [n for n in names if _device.on_host(old[n])]
        found = []
        with tqdm(total=sum(old[n].numel() for n in host), desc=f"diff {self.name}", unit="el", unit_scale=True,
                  disable=not progress or not host) as bar:
            for dtype, members in _by_dtype(old, host).items():
                shift, mask = self._field(dtype)
                a_bits, b_bits = [bits(old[n].detach()) for n in members], [bits(new[n].detach()) for n in members]
                per_thread = PerThread(a_bits, b_bits)
                view = a_bits[0].dtype.type
                width = a_bits[0].itemsize * 8
                chunks = _ordered_chunks(np.array([old[n].numel() for n in members], np.int64), chunk)
                ikeys, seeds = _key_tables(keys, members)

                def scan(lo: int, hi: int, chunks=chunks, per_thread=per_thread, shift=view(shift),
                         mask=view(mask), ikeys=ikeys, seeds=seeds, width=width) -> tuple:
                    a_list, b_list = per_thread.lists()
                    with counts.borrowed(width) as (gap, step, tally):
                        out = _batch.scan_rows(a_list, b_list, chunks[lo:hi], shift, mask, ikeys, seeds, gap, step,
                                               tally)
                    bar.update(int(chunks[hi - 1, 2] - chunks[lo, 1]) if hi > lo else 0)
                    return out

                spans = slices(chunks[:, 2] - chunks[:, 1], workers)
                tensor = np.array([index[n] for n in members], np.int64)
                for (lo, hi), (cls, gaps, steps, table, row_moved) in zip(spans, in_threads(scan, spans, workers)):
                    part = chunks[lo:hi]
                    moved += _batch.sum_by(tensor[part[:, 0]], row_moved, len(names))
                    keep = table[:, 0] > 0
                    ends = np.cumsum(table[keep, 0])
                    rows = np.stack([tensor[part[keep, 0]], part[keep, 1] // chunk, ends - table[keep, 0], ends,
                                     table[keep, 1], table[keep, 2]], axis=1)
                    found.append(_Found(cls, gaps, steps, rows, width))
        return found

    def _scan_on_device(self, old, new, names, chunk, keys, counts: _Counts, moved, workers, progress,
                        staging) -> list[_Found]:
        """The whole-tensor scan (`_device_scan`) of the device tensors among `names`, group by group where they
        live; each group's symbols are counted on host threads while the device scans the next group."""
        index = {n: i for i, n in enumerate(names)}
        found = []
        pending = None

        def count(got: _device_scan.Scanned, width: int) -> None:
            spans = slices(got.rows[:, 3] - got.rows[:, 2], workers)
            in_threads(lambda lo, hi: self._count_rows(got, lo, hi, width, counts), spans, workers)

        on_device = [n for n in names if not _device.on_host(old[n])]
        with ThreadPoolExecutor(1, thread_name_prefix="delta-count") as host_stage:
            for group in tqdm(_groups.groups(old, on_device, chunk), desc=f"diff {self.name} on the device",
                              unit="group", disable=not progress or not on_device):
                shift, mask = self._field(old[group.names[0]].dtype)
                width = old[group.names[0]].element_size() * 8
                got = _device_scan.scan(old, new, group, shift, mask, keys, staging)
                tensor = np.array([index[n] for n in group.names], np.int64)
                if got.sums is not None:
                    moved += _batch.sum_by(tensor, got.sums, len(names))
                rows = got.rows.copy()
                rows[:, 0] = tensor[rows[:, 0]]
                found.append(_Found(got.cls, got.gaps, got.steps, rows, width))
                if pending is not None:
                    pending.result()
                pending = host_stage.submit(contextvars.copy_context().run, self._counted_in_stage, count, got, width)
            if pending is not None:
                pending.result()
        return found

    @staticmethod
    def _counted_in_stage(count, got, width) -> None:
        with stage("code"):
            count(got, width)

    @staticmethod
    def _count_rows(got: _device_scan.Scanned, lo: int, hi: int, width: int, counts: _Counts) -> None:
        with counts.borrowed(width) as (gap, step, tally):
            _batch.count_rows(got.cls, got.gaps, got.steps, np.ascontiguousarray(got.rows[lo:hi, 2:]), gap, step,
                              tally)

    def _code(self, plan: _Plan, models: _Models, workers: int) -> tuple[np.ndarray, np.ndarray]:
        """rANS-code every chunk of `plan`, width by width, one compiled call per span of rows (which also notes
        where its words went, on its thread); returns the chunk table (tensor, chunk, changed, words, lowest
        class, highest class per row, in file order) and the words."""
        rows = plan.rows
        nwords = np.zeros(len(rows), np.int64)
        where = np.zeros((len(rows), 3), np.int64)  # buffer, start in it, words
        buffers: list[np.ndarray] = []
        for width, sel, lists, coded in plan.widths:
            classes = self._classes(width)
            gap_model, step_model = models.of(0, width, classes), models.of(1, width, classes)
            spans = slices(coded[:, 2] - coded[:, 1], workers)
            first = len(buffers)

            def code(lo: int, hi: int, coded=coded, lists=lists, gap_model=gap_model, step_model=step_model,
                     sel=sel, first=first, spans=spans) -> np.ndarray:
                words, counts = _batch.code_rows(*lists, coded[lo:hi], gap_model, step_model, models.freq,
                                                 models.cum)
                at = sel[lo:hi]
                nwords[at] = counts
                where[at, 0] = first + spans.index((lo, hi))
                where[at, 1] = np.cumsum(counts) - counts
                return words

            buffers += in_threads(code, spans, workers)
        where[:, 2] = nwords
        words = _WRITER_TABLES.words(int(nwords.sum()))
        if len(plan.widths) == 1:  # one width: its spans' words are in file order already
            np.concatenate(buffers, out=words)
        elif buffers:
            _batch.gather_words(typed(buffers), where, words)
        table = np.stack([rows[:, 0], rows[:, 1], rows[:, 3] - rows[:, 2], nwords, rows[:, 4], rows[:, 5]], axis=1)
        return table, words

    # -- decode -----------------------------------------------------------------------------------

    def stream_names(self, entries):
        return set(self.STREAMS)

    def check_streams(self, entries, blobs):
        for name in sorted(self.STREAMS):
            blob = blobs.get(name)
            if blob is None or blob.dtype != torch.uint8 or blob.dim() != 1:
                raise DeltaFormatError(f"stream {name!r} must be a 1-D uint8 tensor, got "
                                       f"{'nothing' if blob is None else f'{blob.dtype} {tuple(blob.shape)}'}")

    def _parse(self, entries: tuple[TensorEntry, ...], blobs) -> tuple[_Models, np.ndarray, np.ndarray, int]:
        """Models, the chunk rows with changes, the words and the chunk size. A row is (entry, chunk, changed,
        first word, one past its last word, lowest class, highest class, first change in its entry's changes),
        entries in order, chunks ascending.

        Every count is checked against the tensor sizes and the stream lengths before anything the
        size of a tensor is allocated: the chunk table is bounded by the words it describes, the
        models by the classes and counts of the chunk table.
        """
        for e in entries:
            if e.form != "sparse":
                raise DeltaFormatError(f"form {e.form!r} is not one of this codec's", tensor=e.name)
            if e.dtype not in DTYPES_BY_NAME:
                raise DeltaFormatError(f"dtype {e.dtype!r} is not supported", tensor=e.name)
            if not 0 < e.changed <= e.numel:
                raise DeltaFormatError(f"{e.changed} changed elements in a tensor of {e.numel}", tensor=e.name)
        if set(blobs) != self.STREAMS:
            raise DeltaFormatError(f"streams are {sorted(blobs)[:6]}, expected {sorted(self.STREAMS)}")
        self.check_streams(entries, blobs)
        raw = {k: v.numpy().tobytes() for k, v in blobs.items()}
        if len(raw["words"]) % 2:
            raise DeltaFormatError("stream 'words' is not a whole number of 16-bit words")
        words = np.frombuffer(raw["words"], "<u2")
        head = unpack(raw["chunks"], np.uint32, None, "chunks", 1 + 5 * (words.size // 2))
        if head.size < 1 or not 1 <= int(head[0]) <= MAX_CHUNK or (head.size - 1) % 5:
            raise DeltaFormatError(f"stream 'chunks' is malformed: chunk size {int(head[0]) if head.size else None} "
                                   f"(must be in [1, {MAX_CHUNK}]), {head.size - 1} values (a multiple of 5)")
        chunk = int(head[0])
        table = head[1:].reshape(-1, 5).astype(np.int64)
        dtypes = [DTYPES_BY_NAME[e.dtype] for e in entries]
        masks = np.array([self._field(d)[1] for d in dtypes], np.int64)
        widths = np.array([layout_of(d).itemsize * 8 for d in dtypes], np.int64)
        numel = np.array([e.numel for e in entries], np.int64)
        changed = np.array([e.changed for e in entries], np.int64)
        owner, first_word, used, at, err, row, bad, held = _batch.walk_rows(table, changed, numel, masks, chunk)
        if err == 1:
            raise DeltaFormatError(f"stream 'chunks' ends after {held} of {changed[bad]} changed elements",
                                   tensor=entries[bad].name)
        if err == 2:
            k, count, n_words, lo, hi = table[row].tolist()
            raise DeltaFormatError(f"chunk row {row + 1} is malformed (chunk {k}, {count} changed, {n_words} words, "
                                   f"classes {lo}..{hi})", tensor=entries[bad].name)
        if used != len(table) or at != words.size:
            raise DeltaFormatError(f"streams 'chunks' and 'words' hold data no tensor uses ({len(table) - used} rows, "
                                   f"{words.size - at} words)")
        ends = np.cumsum(table[:, 1])
        starts = np.repeat(np.cumsum(changed) - changed, np.bincount(owner[:used], minlength=len(entries)))
        rows = np.stack([owner, table[:, 0], table[:, 1], first_word, first_word + table[:, 2], table[:, 3],
                         table[:, 4], ends - table[:, 1] - starts], axis=1)
        allowed = self._allowed(rows, widths, numel, chunk)
        models = _Models.from_table(unpack(raw["models"], np.uint32, None, "models",
                                           self._most_model_values(rows, allowed)), allowed)
        return models, rows, words, chunk

    @staticmethod
    def _sizes(rows: np.ndarray, numel: np.ndarray, chunk: int) -> np.ndarray:
        """Elements of each row's chunk."""
        return np.minimum(numel[rows[:, 0]], (rows[:, 1] + 1) * chunk) - rows[:, 1] * chunk

    def _allowed(self, rows, widths, numel, chunk) -> dict[Key, int]:
        """Per model the chunk table's classes can use, the largest symbol its values can need: a gap is below its
        chunk's size, a step minus one below 2**width - 1."""
        allowed: dict[Key, int] = {}
        sizes = self._sizes(rows, numel, chunk)
        for width in np.unique(widths[rows[:, 0]]).tolist():
            sel = widths[rows[:, 0]] == width
            span = np.zeros(self._classes(width) + 1, np.int64)  # classes some chunk of this width spans
            np.add.at(span, rows[sel, 5], 1)
            np.add.at(span, rows[sel, 6] + 1, -1)
            gap_top, step_top = _rans.symbol_of(int(sizes[sel].max()) - 1), _rans.symbol_of((1 << width) - 2)
            for c in np.flatnonzero(np.cumsum(span)[:-1] > 0).tolist():
                allowed[(0, width, c)] = gap_top
                allowed[(1, width, c)] = step_top
        return allowed

    @staticmethod
    def _most_model_values(rows, allowed: dict[Key, int]) -> int:
        """The most values stream `models` can hold: 4 per model, 2 per (symbol, frequency) pair, pairs bounded by
        the symbols the changes can need (a gap and a step per change, an END per class) and by the alphabets."""
        symbols = int((2 * rows[:, 2] + rows[:, 6] - rows[:, 5] + 1).sum())
        pairs = 0
        for key, top in allowed.items():
            pairs += top + 1 + (key[0] == 0)
        return 4 * len(allowed) + 2 * min(symbols, pairs)

    def _model_tables(self, models: _Models, entries) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per entry its family (width, classes) and width; per family the model of each class (-1: none), padded
        to the most classes: what `_batch.decode_rows` takes."""
        families: dict[tuple[int, int], int] = {}
        family, width = [], []
        for e in entries:
            dtype = DTYPES_BY_NAME[e.dtype]
            w, classes = layout_of(dtype).itemsize * 8, self._field(dtype)[1] + 1
            family.append(families.setdefault((w, classes), len(families)))
            width.append(w)
        most = max([c for _, c in families] + [1])
        gap_models = np.full((max(1, len(families)), most), -1, np.int32)
        step_models = gap_models.copy()
        for (w, classes), f in families.items():
            gap_models[f, :classes], step_models[f, :classes] = models.of(0, w, classes), models.of(1, w, classes)
        return np.array(family, np.int64), np.array(width, np.int64), gap_models, step_models

    def _decode_table(self, models, entries, rows, chunk, out: np.ndarray | None) -> tuple:
        """Rows for `_batch.decode_rows` (columns FAMILY..OUT) and the model tables; `out`: each row's first change
        in the output arrays (None: check only)."""
        family, width, gap_models, step_models = self._model_tables(models, entries)
        numel = np.array([e.numel for e in entries], np.int64)
        e = rows[:, 0]
        table = np.stack([family[e], width[e], self._sizes(rows, numel, chunk), rows[:, 2], rows[:, 3], rows[:, 4],
                          rows[:, 5], rows[:, 6], np.zeros(len(rows), np.int64) if out is None else out], axis=1)
        return table, gap_models, step_models

    def _raise_at(self, err: int, row: int, rows: np.ndarray, entries, chunk) -> None:
        raise DeltaFormatError(f"chunk at element {int(rows[row, 1]) * chunk} does not decode: "
                               f"{_rans.DECODE_ERRORS[err]}", tensor=entries[int(rows[row, 0])].name)

    def decode(self, entries, blobs, state, workers=None, keys=None):
        workers = resolve_workers(workers)
        models, rows, words, chunk = self._parse(entries, blobs)
        on_device = [i for i, e in enumerate(entries) if not _device.on_host(state[e.name])]
        on_host = [i for i, e in enumerate(entries) if _device.on_host(state[e.name])]
        changes = self._decode_on_device(on_device, entries, models, rows, words, chunk, state, workers, keys)
        changes.update(self._decode_on_host(on_host, entries, models, rows, words, chunk, state, workers, keys))
        return [changes[e.name] for e in entries]

    def _decode_on_host(self, chosen, entries, models, rows, words, chunk, state, workers, keys) -> dict[str, Change]:
        """Decode, place and hash the changes of entries `chosen` (host tensors), dtype by dtype: one compiled call
        per worker over its share of the chunks."""
        changes = {}
        by_dtype: dict[torch.dtype, list[int]] = defaultdict(list)
        for i in chosen:
            by_dtype[state[entries[i].name].dtype].append(i)
        for dtype, members in by_dtype.items():
            shift, mask = self._field(dtype)
            names = [entries[i].name for i in members]
            a = [bits(state[n]) for n in names]
            dense = np.array([entries[i].changed * (8 + x.itemsize) > x.nbytes for i, x in zip(members, a)])
            # Positions and values would take more room than the tensor where `dense`: build the new tensor
            # instead (a copy of the old one with each chunk's changes written in), so no delta costs the reader
            # more than one copy of each tensor it changes.
            pos = [np.empty(0 if d else entries[i].changed, np.int64) for i, d in zip(members, dense)]
            val = [x.copy() if d else np.empty(entries[i].changed, x.dtype) for i, x, d in zip(members, a, dense)]
            local = np.full(len(entries), -1, np.int64)
            local[members] = np.arange(len(members))
            sel = np.flatnonzero(local[rows[:, 0]] >= 0)
            part = rows[sel]
            placed = np.stack([local[part[:, 0]], part[:, 1], part[:, 2], part[:, 3], part[:, 4], part[:, 5],
                               part[:, 6], part[:, 7]], axis=1)
            ikeys, seeds = _key_tables(keys, names)
            width = a[0].itemsize * 8
            classes = self._classes(width)
            lists = (typed(a), typed(pos), typed(val))
            view = a[0].dtype.type
            moved = np.zeros((len(placed), 2), np.uint64)

            def run(lo: int, hi: int, placed=placed, lists=lists, dense=dense, shift=view(shift), mask=view(mask),
                    gap_model=models.of(0, width, classes), step_model=models.of(1, width, classes), ikeys=ikeys,
                    seeds=seeds, moved=moved) -> tuple[int, int]:
                err, row = _batch.place_rows(words, placed[lo:hi], *lists, dense, shift, mask, chunk, gap_model,
                                             step_model, models.freq, models.cum, models.lut, ikeys, seeds,
                                             moved[lo:hi])
                return err, (lo + row if err else -1)

            # cost: the context scan walks every element of a chunk; `gap` only its changes
            sizes = self._sizes(part, np.array([e.numel for e in entries], np.int64), chunk)
            spans = slices(sizes if self.context else part[:, 2], workers)
            with stage("decode"):  # rANS, placing and hashing each change
                failed = [(row, err) for err, row in in_threads(run, spans, workers) if err]
            if failed:
                row, err = min(failed)
                self._raise_at(err, int(sel[row]), rows, entries, chunk)
            sums = _batch.sum_by(placed[:, 0], moved, len(members))
            for t, name in enumerate(names):
                changes[name] = Change(name, None if dense[t] else pos[t], val[t],
                                       (int(sums[t, 0]), int(sums[t, 1])) if keys is not None else None)
        return changes

    def _decode_on_device(self, chosen, entries, models, rows, words, chunk, state, workers, keys
                          ) -> dict[str, Change]:
        """Decode each group's chunks on host threads into staging memory, then place them on the device
        (`_device_scan.locate`): the host decodes group k + 1 while the device places group k."""
        if not chosen:
            return {}
        names = [entries[i].name for i in chosen]
        index = {e.name: i for i, e in enumerate(entries)}
        groups = _groups.groups(state, names, chunk)
        table, gap_models, step_models = self._decode_table(models, entries, rows, chunk, None)
        parts: dict[str, list[tuple[torch.Tensor, torch.Tensor, _sumhash.Sums | None]]] = defaultdict(list)
        device = state[names[0]].device

        bounds = np.searchsorted(rows[:, 0], np.arange(len(entries) + 1))  # each entry's rows

        def decode_group(group: _groups.Group, staging: _device.Staging) -> tuple:
            picked = []
            for t, name in enumerate(group.names):  # the member's rows: its chunks inside the group's part
                lo, hi = bounds[index[name]], bounds[index[name] + 1]
                first = group.first_chunk(t)
                k = rows[lo:hi, 1]
                last = first + -(-group.sizes[t] // chunk)
                picked.append(np.arange(lo + np.searchsorted(k, first), lo + np.searchsorted(k, last)))
            sel = np.concatenate(picked)
            counts = [int(rows[p, 2].sum()) for p in picked]
            total = int(rows[sel, 2].sum())
            width = state[group.names[0]].element_size() * 8
            pinned = device.type != "cpu"
            cls = staging.empty(total, np.uint16, pinned)
            ranks = staging.empty(total, np.int32, pinned)
            steps = staging.empty(total, _groups.UINT[width // 8], pinned)
            part = table[sel].copy()
            part[:, _batch.OUT] = np.cumsum(part[:, _batch.COUNT]) - part[:, _batch.COUNT]
            spans = slices(part[:, _batch.COUNT], workers)
            with stage("decode"):
                failed = [(lo + row, err) for (lo, _), (err, row) in zip(spans, in_threads(
                    lambda lo, hi: _batch.decode_rows(words, part[lo:hi], gap_models, step_models, models.freq,
                                                      models.cum, models.lut, cls, ranks, steps), spans, workers)) if err]
            if failed:
                row, err = min(failed)
                return None, (err, int(sel[row]))
            member = np.repeat(np.arange(len(group.names)), [p.size for p in picked])
            gchunk = group.chunk_base[member] + rows[sel, 1] - np.array(group.starts, np.int64)[member] // chunk
            return (cls, ranks, steps, gchunk, rows[sel, 2], counts), None

        with ThreadPoolExecutor(1, thread_name_prefix="delta-decode") as host_stage:
            stagings = [_device.Staging() for _ in groups]
            ahead = [host_stage.submit(contextvars.copy_context().run, decode_group, g, s)
                     for g, s in zip(groups[:1], stagings[:1])]
            try:
                for k, group in enumerate(groups):
                    decoded, failure = ahead[k].result()
                    if k + 1 < len(groups):  # the host decodes the next group while the device places this one
                        ahead.append(host_stage.submit(contextvars.copy_context().run, decode_group, groups[k + 1],
                                                       stagings[k + 1]))
                    if failure is not None:
                        self._raise_at(*failure, rows, entries, chunk)
                    shift, mask = self._field(state[group.names[0]].dtype)
                    got = _device_scan.locate(state, group, shift, mask, *decoded, keys)
                    stagings[k].close()  # `locate` waited for the device: the uploads are done
                    if got.bad is not None:
                        raise DeltaFormatError(f"a chunk does not decode: {_rans.DECODE_ERRORS[_rans.RANK_PAST_CLASS]}",
                                               tensor=group.names[got.bad])
                    for t, name in enumerate(group.names):
                        parts[name].append((got.positions[t], got.values[t], got.sums[t] if got.sums else None))
            finally:
                for f in ahead:
                    f.cancel()
                wait(ahead)
                for s in stagings:
                    s.close()
        changes = {}
        for name, pieces in parts.items():
            positions, values, moved = zip(*pieces)
            sums = None
            if keys is not None:
                sums = _sumhash.ZERO
                for m in moved:
                    sums = _sumhash.add(sums, m)
            changes[name] = Change(name, positions[0] if len(pieces) == 1 else torch.cat(positions),
                                   values[0] if len(pieces) == 1 else torch.cat(values), sums)
        return changes

    def check(self, entries, blobs, workers=None, foreign=False):
        """Every chunk's words decoded without the state: the rANS stream ends on its initial state with
        every word used, holds as many changes per class range as the chunk table says, ranks below the
        chunk's size, steps within the dtype's width. Not checkable without the old tensor: for `ctx`,
        that each rank exists in its class of the old tensor; for both, the new values themselves."""
        workers = resolve_workers(workers)
        models, rows, words, chunk = self._parse(entries, blobs)
        table, gap_models, step_models = self._decode_table(models, entries, rows, chunk, None)
        none16, none32, noneu = np.empty(0, np.uint16), np.empty(0, np.int32), np.empty(0, np.uint64)
        spans = slices(table[:, _batch.COUNT], workers)
        failed = [(lo + row, err) for (lo, _), (err, row) in zip(spans, in_threads(
            lambda lo, hi: _batch.decode_rows(words, table[lo:hi], gap_models, step_models, models.freq, models.cum,
                                              models.lut, none16, none32, noneu), spans, workers)) if err]
        if failed:
            row, err = min(failed)
            self._raise_at(err, row, rows, entries, chunk)
        where = ("positions inside their chunk, strictly increasing" if not self.context else
                 "class ranks inside their chunk")
        return (f"{len(entries)} tensors in {len(rows)} chunks, every chunk's rANS words decoding exactly to the "
                f"chunk table's counts, with {where} and steps within each dtype's width")

    def tensor_bytes(self, entries, blobs):
        """Each tensor's rANS words, plus its share of the tables by the share of words it holds."""
        _, rows, _, _ = self._parse(entries, blobs)
        tables = sum(v.numel() for k, v in blobs.items() if k != "words")
        own = 2 * np.bincount(rows[:, 0], weights=rows[:, 4] - rows[:, 3], minlength=len(entries)).astype(np.int64)
        total = max(1, int(own.sum()))
        return {e.name: int(n) + round(tables * int(n) / total) for e, n in zip(entries, own.tolist())}

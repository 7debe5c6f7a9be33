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
restart in each chunk, so chunks are coded and decoded independently, one per thread.

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

import threading
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import torch
from numba import njit

from ..errors import DeltaFormatError
from ..tensors._device import scan_chunk_torch
from ..tensors.bits import DTYPE_NAMES, DTYPES_BY_NAME, bits, classes_of_width, layout_of
from . import _rans
from ._base import Change, Codec, TensorEntry, run_tasks
from ._kernels import locate_chunk, scan_chunk
from ._streams import pack, unpack

CHUNK = 1 << 20
MAX_CHUNK = 1 << 26
KINDS = ("gap", "step")
Key = tuple[int, int, int]  # (kind index, width in bits, class)


@dataclass
class _Scanned:
    """One chunk's changes, as the writer's scan found them."""

    count: int
    lo: int
    hi: int
    cls: np.ndarray
    gaps: np.ndarray
    steps: np.ndarray


class _Histograms:
    """Symbol counts per (width, class), one set per thread, summed at the end."""

    def __init__(self) -> None:
        self._local = threading.local()
        self._all: list[dict[int, tuple[np.ndarray, np.ndarray]]] = []
        self._lock = threading.Lock()

    def of(self, width: int, classes: int) -> tuple[np.ndarray, np.ndarray]:
        """This thread's histograms for `width` (dtypes of one width share them: `classes` is their most)."""
        mine = getattr(self._local, "hists", None)
        if mine is None:
            mine = self._local.hists = {}
            with self._lock:
                self._all.append(mine)
        if width not in mine:
            mine[width] = (np.zeros((classes, _rans.ALPHABET), np.int32), np.zeros((classes, _rans.ALPHABET), np.int32))
        return mine[width]

    def total(self) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        out: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for hists in self._all:
            for width, (g, s) in hists.items():
                if width in out:
                    out[width] = (out[width][0] + g, out[width][1] + s)
                else:
                    out[width] = (g.copy(), s.copy())
        return out


class _Models:
    """The models of one delta: frequencies and decoder tables, and which model serves which class."""

    def __init__(self, keys: list[Key], freqs: np.ndarray) -> None:
        self.keys = keys
        self.freq = freqs
        self.cum, self.lut = _rans.tables(freqs) if keys else (np.zeros((0, _rans.ALPHABET + 1), np.int64),
                                                                np.zeros((0, 1 << _rans.LUT_BITS), np.int32))
        self.index = {k: i for i, k in enumerate(keys)}
        self._of: dict[tuple[int, int, int], np.ndarray] = {}

    def of(self, kind: int, width: int, classes: int) -> np.ndarray:
        """Model index per class (-1: none) for one kind and width (read only; shared between threads)."""
        key = (kind, width, classes)
        if key not in self._of:
            out = np.full(classes, -1, np.int32)
            for (k, w, c), i in self.index.items():
                if k == kind and w == width and c < classes:
                    out[c] = i
            self._of[key] = out
        return self._of[key]

    @classmethod
    def build(cls, hists: dict[int, tuple[np.ndarray, np.ndarray]]) -> _Models:
        keys, rows = [], []
        for width in sorted(hists):
            for kind, hist in enumerate(hists[width]):
                for c in np.flatnonzero(hist.sum(axis=1)).tolist():
                    keys.append((kind, width, c))
                    rows.append(_rans.quantize(hist[c]))
        keys_sorted = sorted(range(len(keys)), key=lambda i: keys[i])
        freqs = np.array([rows[i] for i in keys_sorted], np.int64).reshape(-1, _rans.ALPHABET)
        return cls([keys[i] for i in keys_sorted], freqs)

    def to_table(self) -> np.ndarray:
        table: list[int] = []
        for (kind, width, c), f in zip(self.keys, self.freq):
            symbols = np.flatnonzero(f)
            table += [kind, width, c, symbols.size]
            table += np.stack([np.diff(symbols, prepend=0), f[symbols]], axis=1).reshape(-1).tolist()
        return np.asarray(table, np.uint32)

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
        return cls(keys, freqs[:len(keys)])


def _chunks_of(numel: int, chunk: int) -> int:
    return max(1, -(-numel // chunk))


class _Scratch(threading.local):
    """Per-thread buffers for the scan (a chunk's worth), reused across chunks and calls."""

    def take(self, chunk: int, itemsize: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        bufs = getattr(self, "bufs", None)
        if bufs is None or bufs[0].size < chunk:
            bufs = self.bufs = (np.empty(chunk, np.uint16), np.empty(chunk, np.uint32), np.empty(chunk, np.uint64))
        return bufs


_SCRATCH = _Scratch()


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

    # -- encode -----------------------------------------------------------------------------------

    def encode(self, old, new, names, progress=False, workers=None, chunk=None):
        chunk = CHUNK if chunk is None else chunk
        if not 1 <= chunk <= MAX_CHUNK:
            raise ValueError(f"chunk must be in [1, {MAX_CHUNK}] elements, got {chunk}")
        names = sorted(names)
        hists = _Histograms()
        tasks = [(name, k) for name in names for k in range(_chunks_of(old[name].numel(), chunk))]
        flat = {name: _flat_pair(old[name], new[name]) for name in names}

        def scan(task: tuple[str, int]) -> _Scanned:
            name, k = task
            a, b = flat[name]
            shift, mask = self._field(old[name].dtype)
            lo, hi = k * chunk, min(a.numel() if isinstance(a, torch.Tensor) else a.size, (k + 1) * chunk)
            if isinstance(a, torch.Tensor):
                found = _Scanned(*scan_chunk_torch(a[lo:hi], b[lo:hi], shift, mask))
            else:
                cls, gaps, steps = _SCRATCH.take(chunk, a.itemsize)
                m, cmin, cmax = scan_chunk(a, b, lo, hi, a.dtype.type(shift), a.dtype.type(mask), cls, gaps, steps)
                found = _Scanned(m, cmin, cmax, cls[:m].copy(), gaps[:m].copy(), steps[:m].copy())
            if found.count:
                width = old[name].element_size() * 8
                gap_hist, step_hist = hists.of(width, classes_of_width(width) if self.context else 1)
                _rans.count_symbols(found.cls, found.gaps, found.steps, found.lo, found.hi, gap_hist, step_hist)
            return found

        scanned = run_tasks(scan, tasks, workers, progress, f"diff {self.name}")
        models = _Models.build(hists.total())
        by_tensor: dict[str, list[_Scanned]] = defaultdict(list)
        for (name, _), found in zip(tasks, scanned):
            by_tensor[name].append(found)

        def code(task: tuple[str, int]) -> np.ndarray:
            name, k = task
            found = by_tensor[name][k]
            if not found.count:
                return np.zeros(0, np.uint16)
            width = old[name].element_size() * 8
            classes = self._field(old[name].dtype)[1] + 1
            out = np.empty(2 + 10 * found.count + (found.hi - found.lo + 1), np.uint16)
            n = _rans.encode_chunk(found.cls, found.gaps, found.steps, found.lo, found.hi,
                                   models.of(0, width, classes), models.of(1, width, classes),
                                   models.freq, models.cum, out)
            return out[out.size - n:].copy()

        changed_tasks = [t for t in tasks if by_tensor[t[0]][t[1]].count]
        words = run_tasks(code, changed_tasks, workers, False, "")
        entries, rows = [], [chunk]
        for name in names:
            n_changed = sum(f.count for f in by_tensor[name])
            if n_changed:
                entries.append(TensorEntry(name, DTYPE_NAMES[old[name].dtype], tuple(old[name].shape), "sparse",
                                           n_changed))
        for (name, k), w in zip(changed_tasks, words):
            found = by_tensor[name][k]
            rows += [k, found.count, w.size, found.lo, found.hi]
        stream = np.concatenate(words).astype("<u2") if words else np.zeros(0, "<u2")
        blobs = {"models": pack(models.to_table()), "chunks": pack(np.asarray(rows, np.uint32)),
                 "words": stream.tobytes()}
        return entries, {k: torch.frombuffer(bytearray(v), dtype=torch.uint8) if v else torch.empty(0, dtype=torch.uint8)
                         for k, v in blobs.items()}

    # -- decode -----------------------------------------------------------------------------------

    def stream_names(self, entries):
        return set(self.STREAMS)

    def check_streams(self, entries, blobs):
        for name in sorted(self.STREAMS):
            blob = blobs.get(name)
            if blob is None or blob.dtype != torch.uint8 or blob.dim() != 1:
                raise DeltaFormatError(f"stream {name!r} must be a 1-D uint8 tensor, got "
                                       f"{'nothing' if blob is None else f'{blob.dtype} {tuple(blob.shape)}'}")

    def _parse(self, entries: tuple[TensorEntry, ...], blobs) -> tuple[_Models, list[list[tuple]], np.ndarray, int]:
        """Models, per entry its chunks with changes (index, count, words start, words end, lo, hi), the words
        and the chunk size.

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
        rows = head[1:].reshape(-1, 5).astype(np.int64)
        plan, at, row = [], 0, 0
        classes: dict[int, set[int]] = defaultdict(set)  # classes a chunk of each width spans
        largest: dict[int, int] = defaultdict(int)  # the largest chunk of each width: gaps stay below it
        symbols = 0  # the most distinct symbols the models can need: a gap and a step per change, an END per class
        for e in entries:
            dtype = DTYPES_BY_NAME[e.dtype]
            mask, width = self._field(dtype)[1], layout_of(dtype).itemsize * 8
            chunks, held, previous = [], 0, -1
            while held < e.changed:
                if row >= len(rows):
                    raise DeltaFormatError(f"stream 'chunks' ends after {held} of {e.changed} changed elements",
                                           tensor=e.name)
                k, count, n_words, lo, hi = rows[row].tolist()
                row += 1
                size = min(e.numel, (k + 1) * chunk) - k * chunk
                if (not previous < k < _chunks_of(e.numel, chunk) or not 1 <= count <= min(size, e.changed - held)
                        or n_words < 2 or not 0 <= lo <= hi <= mask):
                    raise DeltaFormatError(f"chunk row {row} is malformed (chunk {k}, {count} changed, {n_words} words, "
                                           f"classes {lo}..{hi})", tensor=e.name)
                chunks.append((k, count, at, at + n_words, lo, hi))
                classes[width].update(range(lo, hi + 1))
                largest[width] = max(largest[width], size)
                symbols += 2 * count + hi - lo + 1
                held, previous, at = held + count, k, at + n_words
            plan.append(chunks)
        if row != len(rows) or at != words.size:
            raise DeltaFormatError(f"streams 'chunks' and 'words' hold data no tensor uses ({len(rows) - row} rows, "
                                   f"{words.size - at} words)")
        # Per model, the largest symbol its values can need: a gap is below its chunk's size, a step minus one
        # below 2**width - 1; so the most symbols (pairs) it holds, END included for gap models.
        allowed = {(kind, width, c): _rans.symbol_of(largest[width] - 1 if kind == 0 else (1 << width) - 2)
                   for width, cs in classes.items() for c in cs for kind in range(len(KINDS))}
        pairs = sum(top + 1 + (key[0] == 0) for key, top in allowed.items())
        most = 4 * len(allowed) + 2 * min(symbols, pairs)
        models = _Models.from_table(unpack(raw["models"], np.uint32, None, "models", most), allowed)
        return models, plan, words, chunk

    def decode(self, entries, blobs, state, workers=None):
        models, plan, words, chunk = self._parse(entries, blobs)
        changes, tasks = [], []
        for e, chunks in zip(entries, plan):
            dtype = DTYPES_BY_NAME[e.dtype]
            a = bits(state[e.name])
            if e.changed * (8 + a.itemsize) > a.nbytes:
                # Positions and values would take more room than the tensor: build the new tensor instead (a
                # copy of the old one, each chunk's changes written into it), so no delta costs the reader
                # more than one copy of each tensor it changes.
                change = Change(e.name, None, a.copy())
            else:
                change = Change(e.name, np.empty(e.changed, np.int64), np.empty(e.changed, a.dtype))
            changes.append(change)
            shift, mask = self._field(dtype)
            width = a.itemsize * 8
            gap_model, step_model = models.of(0, width, mask + 1), models.of(1, width, mask + 1)
            offset = 0
            for k, count, w0, w1, lo, hi in chunks:
                tasks.append((e.name, a, k * chunk, min(a.size, (k + 1) * chunk), count, w0, w1, lo, hi, shift, mask,
                              gap_model, step_model, change, offset))
                offset += count

        def run(task: tuple) -> None:
            name, a, start, end, count, w0, w1, lo, hi, shift, mask, gap_model, step_model, change, offset = task
            # Per change: its class, its rank in the chunk (< 2**26) and its step (fits the tensor's width).
            cls, ranks, steps = np.empty(count, np.uint16), np.empty(count, np.int32), np.empty(count, a.dtype)
            err = _rans.decode_chunk(words[w0:w1], lo, hi, end - start, a.itemsize * 8, gap_model, step_model,
                                     models.freq, models.cum, models.lut, count, cls, ranks, steps)
            if not err:
                if change.positions is None:
                    positions = np.empty(count, np.int32 if a.size < 2**31 else np.int64)
                    values = np.empty(count, a.dtype)
                else:
                    positions, values = change.positions[offset:offset + count], change.values[offset:offset + count]
                err = locate_chunk(a, start, end, a.dtype.type(shift), a.dtype.type(mask), cls, ranks, steps,
                                   positions, values)
                if not err and change.positions is None:
                    _put(change.values, positions, values)
                del positions, values
            del cls, ranks, steps  # the error's traceback keeps this frame: not its scratch
            if err:
                raise DeltaFormatError(f"chunk at element {start} does not decode: {_rans.DECODE_ERRORS[err]}",
                                       tensor=name)

        run_tasks(run, tasks, workers, False, "")
        return changes

    def check(self, entries, blobs, workers=None, foreign=False):
        """Every chunk's words decoded without the state: the rANS stream ends on its initial state with
        every word used, holds as many changes per class range as the chunk table says, ranks below the
        chunk's size, steps within the dtype's width. Not checkable without the old tensor: for `ctx`,
        that each rank exists in its class of the old tensor; for both, the new values themselves."""
        models, plan, words, chunk = self._parse(entries, blobs)
        none16, none32, noneu = np.empty(0, np.uint16), np.empty(0, np.int32), np.empty(0, np.uint64)
        tasks = []
        for e, chunks in zip(entries, plan):
            dtype = DTYPES_BY_NAME[e.dtype]
            mask, width = self._field(dtype)[1], layout_of(dtype).itemsize * 8
            gap_model, step_model = models.of(0, width, mask + 1), models.of(1, width, mask + 1)
            for k, count, w0, w1, lo, hi in chunks:
                size = min(e.numel, (k + 1) * chunk) - k * chunk
                tasks.append((e.name, k * chunk, size, width, count, w0, w1, lo, hi, gap_model, step_model))

        def run(task: tuple) -> None:
            name, start, size, width, count, w0, w1, lo, hi, gap_model, step_model = task
            err = _rans.decode_chunk(words[w0:w1], lo, hi, size, width, gap_model, step_model, models.freq, models.cum,
                                     models.lut, count, none16, none32, noneu)
            if err:
                raise DeltaFormatError(f"chunk at element {start} does not decode: {_rans.DECODE_ERRORS[err]}",
                                       tensor=name)

        run_tasks(run, tasks, workers, False, "")
        where = ("positions inside their chunk, strictly increasing" if not self.context else
                 "class ranks inside their chunk")
        return (f"{len(entries)} tensors in {len(tasks)} chunks, every chunk's rANS words decoding exactly to the "
                f"chunk table's counts, with {where} and steps within each dtype's width")

    def tensor_bytes(self, entries, blobs):
        """Each tensor's rANS words, plus its share of the tables by the share of words it holds."""
        _, plan, _, _ = self._parse(entries, blobs)
        tables = sum(v.numel() for k, v in blobs.items() if k != "words")
        own = {e.name: 2 * sum(c[3] - c[2] for c in chunks) for e, chunks in zip(entries, plan)}
        total = max(1, sum(own.values()))
        return {name: n + round(tables * n / total) for name, n in own.items()}


@njit(nogil=True, cache=True)
def _put(flat, positions, values):  # pragma: no cover - compiled
    """flat[positions] = values, without the GIL (numpy's fancy assignment holds it)."""
    for j in range(positions.size):
        flat[positions[j]] = values[j]


def _flat_pair(old: torch.Tensor, new: torch.Tensor) -> tuple:
    """Flat bit views of both tensors: numpy on CPU, torch where they live otherwise."""
    if old.device.type != "cpu" and old.element_size() <= 4:
        return old.detach().contiguous().reshape(-1), new.detach().to(old.device).contiguous().reshape(-1)
    return bits(old.detach().cpu().contiguous()), bits(new.detach().cpu().contiguous())

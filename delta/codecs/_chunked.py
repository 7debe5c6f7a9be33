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
from tqdm import tqdm

from .._stages import stage
from ..errors import DeltaFormatError
from ..tensors import _device, _sumhash
from ..tensors.bits import DTYPE_NAMES, DTYPES_BY_NAME, bits, classes_of_width, layout_of
from . import _device_scan, _rans
from ._base import Change, Codec, Encoded, TensorEntry, run_tasks
from ._kernels import locate_chunk, scan_chunk
from ._streams import pack, unpack

CHUNK = 1 << 20
MAX_CHUNK = 1 << 26
KINDS = ("gap", "step")
_UINT_OF_WIDTH = {8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}
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

    def encode(self, old, new, names, progress=False, workers=None, chunk=None, keys=None):
        chunk = CHUNK if chunk is None else chunk
        if not 1 <= chunk <= MAX_CHUNK:
            raise ValueError(f"chunk must be in [1, {MAX_CHUNK}] elements, got {chunk}")
        names = sorted(names)
        hists = _Histograms()
        found: dict[str, list[tuple[int, _Scanned]]] = {name: [] for name in names}
        sums: dict[str, _sumhash.Sums] = {}
        on_device = [n for n in names if not _device.on_host(old[n])]
        self._scan_on_device(old, new, on_device, chunk, keys, found, sums, hists, workers, progress)
        with stage("scan"):  # the host scan hashes and counts symbols as it goes: all in this stage
            self._scan_on_host(old, new, [n for n in names if _device.on_host(old[n])], chunk, keys, found, sums,
                               hists, workers, progress)
        with stage("code"):
            models = _Models.build(hists.total())
            changed = [(name, k, f) for name in names for k, f in found[name]]
            words = run_tasks(self._coder(old, models), changed, workers, False, "")
        return self._encoded(old, names, found, words, chunk, sums if keys is not None else None, models)

    def _coder(self, old, models: _Models):
        """The task that rANS-codes one chunk (name, index, scanned) into its words."""

        def code(task: tuple[str, int, _Scanned]) -> np.ndarray:
            name, _, f = task
            width = old[name].element_size() * 8
            classes = self._field(old[name].dtype)[1] + 1
            out = np.empty(2 + 10 * f.count + (f.hi - f.lo + 1), np.uint16)
            n = _rans.encode_chunk(f.cls, f.gaps, f.steps, f.lo, f.hi, models.of(0, width, classes),
                                   models.of(1, width, classes), models.freq, models.cum, out)
            return out[out.size - n:].copy()

        return code

    @staticmethod
    def _encoded(old, names, found, words, chunk, sums, models: _Models) -> Encoded:
        """The table of changed tensors and the three streams, from each chunk's words."""
        entries = [TensorEntry(name, DTYPE_NAMES[old[name].dtype], tuple(old[name].shape), "sparse",
                               sum(f.count for _, f in found[name])) for name in names if found[name]]
        rows = [chunk]
        for (k, f), w in zip(((k, f) for name in names for k, f in found[name]), words):
            rows += [k, f.count, w.size, f.lo, f.hi]
        stream = np.concatenate(words).astype("<u2") if words else np.zeros(0, "<u2")
        blobs = {"models": pack(models.to_table()), "chunks": pack(np.asarray(rows, np.uint32)),
                 "words": stream.tobytes()}
        return Encoded(entries, {k: torch.frombuffer(bytearray(v), dtype=torch.uint8) if v else
                                 torch.empty(0, dtype=torch.uint8) for k, v in blobs.items()}, sums)

    def _scan_on_host(self, old, new, names, chunk, keys, found, sums, hists, workers, progress) -> None:
        """The compiled scan, one chunk per thread: changes, symbol counts and hash sums of `names`."""
        tasks = [(name, k) for name in names for k in range(_chunks_of(old[name].numel(), chunk))]
        flat = {name: (bits(old[name].detach()), bits(new[name].detach())) for name in names}
        hash_keys = {name: _sumhash.kernel_key(keys[name] if keys is not None else None) for name in names}

        def scan(task: tuple[str, int]) -> tuple[_Scanned, _sumhash.Sums]:
            name, k = task
            a, b = flat[name]
            shift, mask = self._field(old[name].dtype)
            lo, hi = k * chunk, min(a.size, (k + 1) * chunk)
            cls, gaps, steps = _SCRATCH.take(chunk, a.itemsize)
            m, cmin, cmax, h0, h1 = scan_chunk(a, b, lo, hi, a.dtype.type(shift), a.dtype.type(mask), cls, gaps,
                                               steps, hash_keys[name])
            f = _Scanned(m, cmin, cmax, cls[:m].copy(), gaps[:m].copy(), steps[:m].copy())
            if f.count:
                self._count(old[name].dtype, f, hists)
            return f, (int(h0), int(h1))

        for (name, k), (f, moved) in zip(tasks, run_tasks(scan, tasks, workers, progress, f"diff {self.name}")):
            if f.count:
                found[name].append((k, f))
                sums[name] = _sumhash.add(sums.get(name, _sumhash.ZERO), moved)

    def _scan_on_device(self, old, new, names, chunk, keys, found, sums, hists, workers, progress) -> None:
        """The whole-tensor scan (`_device_scan`) of `names`, group by group where they live; then the changes'
        symbols counted on host threads, chunk by chunk."""
        counted = []
        for group in tqdm(_device_scan.groups(old, names, chunk), desc=f"diff {self.name} on the device",
                          unit="group", disable=not progress or not names):
            shift, mask = self._field(old[group.names[0]].dtype)
            got = _device_scan.scan(old, new, group, shift, mask, keys)
            for t, k, first, end, lo, hi in got.chunks:
                f = _Scanned(end - first, lo, hi, got.cls[first:end], got.gaps[first:end], got.steps[first:end])
                found[group.names[t]].append((k, f))
                counted.append((old[group.names[t]].dtype, f))
            for name, moved, count in zip(group.names, got.sums or [None] * len(group.names), got.counts):
                if count and moved is not None:  # a tensor in parts: each part moves it
                    sums[name] = _sumhash.add(sums.get(name, _sumhash.ZERO), moved)
        with stage("code"):
            run_tasks(lambda task: self._count(task[0], task[1], hists), counted, workers, False, "")

    def _count(self, dtype: torch.dtype, f: _Scanned, hists: _Histograms) -> None:
        width = dtype.itemsize * 8
        gap_hist, step_hist = hists.of(width, classes_of_width(width) if self.context else 1)
        _rans.count_symbols(f.cls, f.gaps, f.steps, f.lo, f.hi, gap_hist, step_hist)

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

    def decode(self, entries, blobs, state, workers=None, keys=None):
        models, plan, words, chunk = self._parse(entries, blobs)
        parsed = dict(zip((e.name for e in entries), zip(entries, plan)))
        on_device = [e.name for e in entries if not _device.on_host(state[e.name])]
        changes = self._decode_on_device(on_device, parsed, models, words, chunk, state, workers, keys)
        changes.update(self._decode_on_host([e.name for e in entries if _device.on_host(state[e.name])], parsed,
                                            models, words, chunk, state, workers, keys))
        return [changes[e.name] for e in entries]

    def _decode_chunk(self, models: _Models, words: np.ndarray, e: TensorEntry, row: tuple, start: int, size: int,
                      cls: np.ndarray, ranks: np.ndarray, steps: np.ndarray) -> None:
        """rANS-decode one chunk (of `size` elements from `start`) of tensor `e` into class-major (cls, ranks,
        steps); raises on a bad stream."""
        _, count, w0, w1, lo, hi = row
        mask, width = self._field(DTYPES_BY_NAME[e.dtype])[1], layout_of(DTYPES_BY_NAME[e.dtype]).itemsize * 8
        err = _rans.decode_chunk(words[w0:w1], lo, hi, size, width, models.of(0, width, mask + 1),
                                 models.of(1, width, mask + 1), models.freq, models.cum, models.lut, count, cls, ranks,
                                 steps)
        if err:
            raise DeltaFormatError(f"chunk at element {start} does not decode: {_rans.DECODE_ERRORS[err]}",
                                   tensor=e.name)

    def _decode_on_host(self, names, parsed, models, words, chunk, state, workers, keys) -> dict[str, Change]:
        """Decode and locate chunk by chunk on host threads (compiled), hashing each change as it is placed."""
        changes, tasks = {}, []
        for name in names:
            e, chunks = parsed[name]
            a = bits(state[name])
            if e.changed * (8 + a.itemsize) > a.nbytes:
                # Positions and values would take more room than the tensor: build the new tensor instead (a
                # copy of the old one, each chunk's changes written into it), so no delta costs the reader
                # more than one copy of each tensor it changes.
                change = Change(name, None, a.copy())
            else:
                change = Change(name, np.empty(e.changed, np.int64), np.empty(e.changed, a.dtype))
            changes[name] = change
            key = _sumhash.kernel_key(keys[name] if keys is not None else None)
            offset = 0
            for row in chunks:
                tasks.append((e, a, row, change, offset, key))
                offset += row[1]

        def run(task: tuple) -> _sumhash.Sums:
            e, a, row, change, offset, key = task
            k, count = row[0], row[1]
            start, end = k * chunk, min(a.size, (k + 1) * chunk)
            shift, mask = self._field(DTYPES_BY_NAME[e.dtype])
            # Per change: its class, its rank in the chunk (< 2**26) and its step (fits the tensor's width).
            cls, ranks, steps = np.empty(count, np.uint16), np.empty(count, np.int32), np.empty(count, a.dtype)
            self._decode_chunk(models, words, e, row, start, end - start, cls, ranks, steps)
            if change.positions is None:
                positions = np.empty(count, np.int32 if a.size < 2**31 else np.int64)
                values = np.empty(count, a.dtype)
            else:
                positions, values = change.positions[offset:offset + count], change.values[offset:offset + count]
            err, h0, h1 = locate_chunk(a, start, end, a.dtype.type(shift), a.dtype.type(mask), cls, ranks, steps,
                                       positions, values, key)
            if not err and change.positions is None:
                _put(change.values, positions, values)
            del positions, values, cls, ranks, steps  # the error's traceback keeps this frame: not its scratch
            if err:
                raise DeltaFormatError(f"chunk at element {start} does not decode: {_rans.DECODE_ERRORS[err]}",
                                       tensor=e.name)
            return int(h0), int(h1)

        with stage("decode"):  # rANS, placing and hashing each change: one compiled pass per chunk
            moved = run_tasks(run, tasks, workers, False, "")
        if keys is not None:
            for (e, *_), d in zip(tasks, moved):
                changes[e.name].sums = _sumhash.add(changes[e.name].sums or _sumhash.ZERO, d)
        return changes

    def _decode_on_device(self, names, parsed, models, words, chunk, state, workers, keys) -> dict[str, Change]:
        """Decode the chunks on host threads into one array per group, then place them on the device
        (`_device_scan.locate`): positions and values stay there."""
        parts: dict[str, list[tuple[torch.Tensor, torch.Tensor, _sumhash.Sums | None]]] = defaultdict(list)
        for group in _device_scan.groups(state, names, chunk):
            members = []  # per member: its chunk rows
            for t, name in enumerate(group.names):
                first = group.first_chunk(t)
                last = first + -(-group.sizes[t] // chunk)
                members.append([row for row in parsed[name][1] if first <= row[0] < last])
            counts = [sum(row[1] for row in rows) for rows in members]
            width = state[group.names[0]].element_size() * 8
            total = sum(counts)
            cls, ranks = np.empty(total, np.uint16), np.empty(total, np.int32)
            steps, gchunk = np.empty(total, _UINT_OF_WIDTH[width]), np.empty(total, np.int64)
            tasks, at = [], 0
            for t, rows in enumerate(members):
                e = parsed[group.names[t]][0]
                for row in rows:
                    size = min(e.numel, (row[0] + 1) * chunk) - row[0] * chunk
                    tasks.append((e, row, row[0] * chunk, size, at))
                    gchunk[at:at + row[1]] = group.chunk_base[t] + row[0] - group.first_chunk(t)
                    at += row[1]

            def run(task: tuple) -> None:
                e, row, start, size, at = task
                n = row[1]
                self._decode_chunk(models, words, e, row, start, size, cls[at:at + n], ranks[at:at + n],
                                   steps[at:at + n])

            with stage("decode"):
                run_tasks(run, tasks, workers, False, "")
            shift, mask = self._field(state[group.names[0]].dtype)
            got = _device_scan.locate(state, group, shift, mask, cls, ranks, steps, gchunk, counts, keys)
            if got.bad is not None:
                raise DeltaFormatError(f"a chunk does not decode: {_rans.DECODE_ERRORS[8]}",
                                       tensor=group.names[got.bad])
            for t, name in enumerate(group.names):
                parts[name].append((got.positions[t], got.values[t], got.sums[t] if got.sums else None))
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



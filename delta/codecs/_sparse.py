"""Codecs `ctx` (the default) and `gap`: positions as gaps, values as ULP steps, entropy coded.

Values are stored relative to the old value the reader already holds: the difference of the two bit
patterns in float order (`order_key`), zigzag folded, so a one-ULP step is a small number.

`ctx` also conditions on the old value. After an AdamW step at RL learning rates a bf16 weight
changes only if the step exceeds half its ULP, which its exponent sets, so the exponent predicts
whether an element changes and by how many ULPs. Elements are split into classes by the exponent of
their old value; positions are coded as gaps between *ranks inside the class*, which the reader
recovers by scanning its own old tensor, and every (class, kind) gets its own adaptive model under
rANS. A class where most elements changed stores the unchanged ones instead.
`gap` codes plain position gaps under zstd: larger, but decoding touches only changed elements.

Streams (tensors in name order, classes ascending within a tensor):
  `table`     zstd uint64: per sparse tensor K, then K x (class, stored ranks, changed elements);
              stored < changed means the stored ranks are those of the unchanged elements
  gaps/steps  the entropy stage's streams (see `_entropy`): per class, gaps between stored ranks
              (first gap = first rank), and per changed element its zigzag ULP step minus one
  `dense{B}`  zstd uint{B} planes: per element of a dense-form tensor, its zigzag ULP step
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import torch
from tqdm import tqdm

from .._bits import DTYPE_NAMES, DTYPES_BY_NAME, bits, from_order_key, layout_of, order_key, unzigzag, zigzag
from .._device import scan
from .._kernels import Changes, class_sizes, locate, new_values
from ..errors import DeltaFormatError
from ..format import TensorEntry
from ._base import Change, Codec
from ._entropy import AnsContexts, Key, ZstdPlanes
from ._streams import pack, unpack

DENSE_CHECK_DENSITY = 0.3
UINT32_LIMIT = 2**32


def _step(old: np.ndarray, new: np.ndarray) -> np.ndarray:
    return zigzag(order_key(new) - order_key(old))


def _unstep(old: np.ndarray, z: np.ndarray) -> np.ndarray:
    return from_order_key(order_key(old) + unzigzag(z))


class SparseCodec(Codec):
    """Gap + ULP-step codec; `context=True` is `ctx` (ANS per exponent class), False is `gap` (zstd)."""

    def __init__(self, context: bool) -> None:
        self.context = context
        self.name = "ctx" if context else "gap"
        self.stage = AnsContexts() if context else ZstdPlanes()
        self.description = ("gaps of in-class ranks (class = old exponent) + ULP steps, rANS per class"
                            if context else "position gaps + ULP steps, byte planes, zstd")

    def _field(self, dtype: torch.dtype) -> tuple[int, int]:
        layout = layout_of(dtype)
        return (layout.shift, layout.mask) if self.context else (0, 0)

    # -- encode -----------------------------------------------------------------------------------

    def encode(self, old, new, names, progress=False):
        entries: list[TensorEntry] = []
        table: list[int] = []
        groups: dict[Key, list[np.ndarray]] = defaultdict(list)
        dense: dict[int, list[np.ndarray]] = defaultdict(list)
        for name in tqdm(sorted(names), desc=f"diff {self.name}", unit="tensor", disable=not progress):
            numel = old[name].numel()
            if numel >= UINT32_LIMIT:
                raise ValueError(f"tensor {name!r} has {numel} elements; codec {self.name!r} supports < 2**32")
            changes = scan(old[name], new[name], self.context)
            n_changed = changes.positions.size
            if n_changed == 0:
                continue
            width = old[name].element_size() * 8
            rows, gaps = self._sparse(changes)
            form = "sparse"
            if n_changed >= DENSE_CHECK_DENSITY * numel:
                full = _step(bits(old[name].cpu().contiguous()), bits(new[name].cpu().contiguous()))
                if len(pack(full)) < len(pack(np.concatenate(gaps))) + len(pack(changes.steps)):
                    form = "dense"
                    dense[width].append(full)
            if form == "sparse":
                table += [len(rows)] + [x for row in rows for x in row]
                bounds = np.concatenate([[0], np.cumsum(changes.class_changed)])
                for (c, _, _), gap in zip(rows, gaps):
                    groups[self.stage.merge(("gap", width, c))].append(gap)
                    groups[self.stage.merge(("step", width, c))].append(changes.steps[bounds[c]:bounds[c + 1]] - 1)
            entries.append(TensorEntry(name, DTYPE_NAMES[old[name].dtype], tuple(old[name].shape), form, n_changed))
        blobs = {"table": pack(np.asarray(table, np.uint64)), **self.stage.encode(groups)}
        for width, parts in dense.items():
            blobs[f"dense{width}"] = pack(np.concatenate(parts))
        return entries, {k: torch.frombuffer(bytearray(v), dtype=torch.uint8) if v else torch.empty(0, dtype=torch.uint8)
                         for k, v in blobs.items()}

    @staticmethod
    def _sparse(changes: Changes) -> tuple[list[tuple[int, int, int]], list[np.ndarray]]:
        """Class table rows (class, stored, changed) and rank gaps per class, classes ascending."""
        rows, gaps = [], []
        start = 0
        for c in np.flatnonzero(changes.class_changed).tolist():
            count, size = int(changes.class_changed[c]), int(changes.class_sizes[c])
            ranks = changes.ranks[start:start + count]
            start += count
            if 2 * count > size:  # store the unchanged ones instead
                keep = np.ones(size, bool)
                keep[ranks] = False
                ranks = np.flatnonzero(keep)
            rows.append((c, len(ranks), count))
            gaps.append(np.diff(ranks, prepend=-1) - 1)
        return rows, gaps

    # -- decode -----------------------------------------------------------------------------------

    def split(self, entries, blobs) -> list[_Piece]:
        """Decode the streams and cut them per tensor; checks every stream's length exactly.

        Needs no state: inspect and verify use it on a file alone.
        """
        for e in entries:
            if e.form not in ("sparse", "dense"):
                raise DeltaFormatError(f"form {e.form!r} is not one of this codec's", tensor=e.name)
            if e.dtype not in DTYPES_BY_NAME:
                raise DeltaFormatError(f"dtype {e.dtype!r} is not supported", tensor=e.name)
        raw = {k: v.numpy().tobytes() for k, v in blobs.items() if v.dtype == torch.uint8 and v.dim() == 1}
        if len(raw) != len(blobs):
            raise DeltaFormatError("every stream must be a 1-D uint8 tensor")
        max_rows = sum(1 + 3 * (self._field(DTYPES_BY_NAME[e.dtype])[1] + 1) for e in entries if e.form == "sparse")
        table = _Reader(unpack(raw.get("table", b""), np.uint64, None, "table", max_rows), "table")
        plan, counts, n_dense = [], defaultdict(int), defaultdict(int)
        for e in entries:
            width = layout_of(DTYPES_BY_NAME[e.dtype]).itemsize * 8
            if e.form == "dense":
                n_dense[width] += e.numel
                plan.append((e, width, None))
                continue
            k = int(table.take(1, e.name)[0])
            rows = table.take(3 * k, e.name).reshape(-1, 3).astype(np.int64)
            if int(rows[:, 2].sum()) != e.changed:
                raise DeltaFormatError(f"class table gives {int(rows[:, 2].sum())} changed elements, the header "
                                       f"says {e.changed}", tensor=e.name)
            for c, stored, changed in rows.tolist():
                counts[self.stage.merge(("gap", width, c))] += stored
                counts[self.stage.merge(("step", width, c))] += changed
            plan.append((e, width, rows))
        table.finish()
        expected = {"table"} | {f"dense{w}" for w in n_dense} | (self.stage.stream_names(counts) if counts else set())
        if set(raw) - expected:
            raise DeltaFormatError(f"unexpected streams {sorted(set(raw) - expected)}")
        streams = {k: _Reader(v, str(k)) for k, v in (self.stage.decode(raw, counts) if counts else {}).items()}
        dense = {w: _Reader(unpack(raw.get(f"dense{w}", b""), np.dtype(f"u{w // 8}"), n, f"dense{w}"), f"dense{w}")
                 for w, n in n_dense.items()}
        pieces = []
        for e, width, rows in plan:
            if rows is None:
                pieces.append(_Piece(e, None, None, dense[width].take(e.numel, e.name)))
                continue
            gaps = [_take(streams, self.stage.merge(("gap", width, c)), stored, e.name) for c, stored, _ in rows.tolist()]
            steps = [_take(streams, self.stage.merge(("step", width, c)), changed, e.name)
                     for c, _, changed in rows.tolist()]
            dtype = np.dtype(f"u{width // 8}")
            pieces.append(_Piece(e, rows, _cat(gaps, np.uint64),
                                 (_cat(steps, np.uint64) + np.uint64(1)).astype(dtype)))
        for reader in [*streams.values(), *dense.values()]:
            reader.finish()
        return pieces

    def decode(self, entries, blobs, state):
        changes = []
        for piece in self.split(entries, blobs):
            e = piece.entry
            a = bits(state[e.name])
            if piece.rows is None:
                new = _unstep(a, piece.steps)
                if int((new != a).sum()) != e.changed:
                    raise DeltaFormatError(f"dense form changes {int((new != a).sum())} elements, the header says "
                                           f"{e.changed}", tensor=e.name)
                changes.append(Change(e.name, None, new))
                continue
            positions, values = self._locate(a, e, piece.rows, piece.gaps, piece.steps, state[e.name].dtype)
            changes.append(Change(e.name, positions, values))
        return changes

    def tensor_bytes(self, entries, blobs):
        """Each tensor's share of the file's stream bytes, by the share of symbols it holds."""
        pieces = self.split(entries, blobs)
        stream_bytes = sum(v.numel() for v in blobs.values())
        symbols = {p.entry.name: (p.steps.size + (0 if p.gaps is None else p.gaps.size)) for p in pieces}
        total = sum(symbols.values()) or 1
        return {name: round(stream_bytes * n / total) for name, n in symbols.items()}

    def _locate(self, a: np.ndarray, e: TensorEntry, rows: np.ndarray, gap: np.ndarray, steps: np.ndarray,
                dtype: torch.dtype) -> tuple[np.ndarray, np.ndarray]:
        """Flat positions and new values of the changed elements of one tensor, in class then rank order."""
        shift, mask = self._field(dtype)
        classes, stored, changed = rows[:, 0], rows[:, 1], rows[:, 2]
        complement = stored != changed
        if len(classes) and (classes.min() < 0 or classes.max() > mask or (np.diff(classes) <= 0).any()):
            raise DeltaFormatError("class table is malformed", tensor=e.name)
        if (gap >= UINT32_LIMIT).any():
            raise DeltaFormatError("a position gap is out of range", tensor=e.name)
        # Ranks: cumulative gaps restarting at each class.
        csum = np.cumsum(gap.astype(np.int64) + 1)
        bounds = np.concatenate([[0], np.cumsum(stored)])
        before = np.concatenate([[0], csum])[bounds[:-1]]
        ranks = csum - np.repeat(before, stored) - 1
        hist = class_sizes(a, shift, mask) if self.context else np.array([[a.size]], np.int64)
        sizes = hist.sum(axis=0)[classes]
        nonempty = stored > 0
        if (stored > sizes).any() or (ranks[bounds[1:][nonempty] - 1] >= sizes[nonempty]).any():
            raise DeltaFormatError("positions out of range for the state this delta is applied to", tensor=e.name)
        if (complement & (sizes - stored != changed)).any() or (complement & (stored >= changed)).any():
            raise DeltaFormatError("class table does not fit the state's classes", tensor=e.name)
        if not self.context:
            if complement.any():
                keep = np.ones(a.size, bool)
                keep[ranks] = False
                ranks = np.flatnonzero(keep)
            return ranks, new_values(a, ranks, steps)
        nclass = mask + 1
        rank_off = np.zeros(nclass + 1, np.int64)
        out_off = np.zeros(nclass + 1, np.int64)
        comp = np.zeros(nclass, np.bool_)
        per_class_stored = np.zeros(nclass, np.int64)
        per_class_changed = np.zeros(nclass, np.int64)
        per_class_stored[classes] = stored
        per_class_changed[classes] = changed
        comp[classes] = complement
        np.cumsum(per_class_stored, out=rank_off[1:])
        np.cumsum(per_class_changed, out=out_off[1:])
        return locate(a, shift, mask, hist, ranks, rank_off, comp, out_off, steps)


@dataclass
class _Piece:
    """One tensor's share of the decompressed streams (`rows`/`gaps` None in dense form)."""

    entry: TensorEntry
    rows: np.ndarray | None
    gaps: np.ndarray | None
    steps: np.ndarray


class _Reader:
    """Sequential reader over a decoded stream that fails clearly when a stream is short or long."""

    def __init__(self, data: np.ndarray, what: str) -> None:
        self.data, self.at, self.what = data, 0, what

    def take(self, n: int, tensor: str) -> np.ndarray:
        if n < 0 or self.at + n > self.data.size:
            raise DeltaFormatError(f"stream {self.what!r} ends early", tensor=tensor)
        out = self.data[self.at:self.at + n]
        self.at += n
        return out

    def finish(self) -> None:
        if self.at != self.data.size:
            raise DeltaFormatError(f"stream {self.what!r} has {self.data.size - self.at} values left over")


def _take(streams: dict[Key, _Reader], key: Key, n: int, tensor: str) -> np.ndarray:
    """The next `n` values of context `key` (contexts with no values may be absent)."""
    if n == 0:
        return np.zeros(0, np.uint64)
    if key not in streams:
        raise DeltaFormatError(f"context {key} is missing", tensor=tensor)
    return streams[key].take(n, tensor)


def _cat(parts: list[np.ndarray], dtype) -> np.ndarray:
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)

"""Codecs `ctx` (the default) and `gap`: positions as gaps, values as ULP steps, byte planes, zstd.

Values are stored relative to the old value the reader already holds: the difference of the two bit
patterns in float order (`order_key`), zigzag folded, so a one-ULP step costs about one bit.

`ctx` also conditions positions on the old value. After an AdamW step at RL learning rates a bf16
weight changes only if the step exceeds half its ULP, which its exponent sets, so the exponent
predicts whether an element changes. Elements are split into classes by the exponent of their old
value; positions are coded as gaps between *ranks inside the class*, which the reader recovers by
scanning its own old tensor. A class where most elements changed stores the unchanged ones instead.
`gap` codes plain position gaps: a little larger, but decoding touches only the changed elements.

Streams (all byte planes under zstd, tensors in name order):
  `table`  per sparse tensor: K, then K x (class, stored ranks, complement flag)     (uint64)
  `pos`    per class, gaps between stored ranks (first gap = first rank)            (uint32)
  `val{B}` per changed element of a sparse B-bit tensor, zigzag ULP step            (uint{B})
  `dense{B}` per element of a dense-form B-bit tensor, zigzag ULP step              (uint{B})
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
from ._streams import pack, unpack

DENSE_CHECK_DENSITY = 0.3
UINT32_LIMIT = 2**32


def _step(old: np.ndarray, new: np.ndarray) -> np.ndarray:
    return zigzag(order_key(new) - order_key(old))


def _unstep(old: np.ndarray, z: np.ndarray) -> np.ndarray:
    return from_order_key(order_key(old) + unzigzag(z))


class PlaneCodec(Codec):
    """Byte-plane/zstd codec; `context=True` is `ctx`, `context=False` is `gap`."""

    def __init__(self, context: bool) -> None:
        self.context = context
        self.name = "ctx" if context else "gap"
        self.description = ("gaps of in-class ranks (class = old exponent) + ULP steps, byte planes, zstd"
                            if context else "position gaps + ULP steps, byte planes, zstd")

    def _field(self, dtype: torch.dtype) -> tuple[int, int]:
        layout = layout_of(dtype)
        return (layout.shift, layout.mask) if self.context else (0, 0)

    # -- encode -----------------------------------------------------------------------------------

    def encode(self, old, new, names, progress=False):
        entries: list[TensorEntry] = []
        table: list[int] = []
        gaps: list[np.ndarray] = []
        vals: dict[int, list[np.ndarray]] = defaultdict(list)
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
            table_rows, gap = self._sparse(changes)
            form = "sparse"
            if n_changed >= DENSE_CHECK_DENSITY * numel:
                full = _step(bits(old[name].cpu().contiguous()), bits(new[name].cpu().contiguous()))
                if len(pack(full)) < len(pack(gap)) + len(pack(changes.steps)):
                    form = "dense"
                    dense[width].append(full)
            if form == "sparse":
                table.extend(table_rows)
                gaps.append(gap)
                vals[width].append(changes.steps)
            entries.append(TensorEntry(name, DTYPE_NAMES[old[name].dtype], tuple(old[name].shape), form, n_changed))
        blobs = {"table": np.asarray(table, np.uint64), "pos": _cat(gaps, np.uint32)}
        for width, parts in vals.items():
            blobs[f"val{width}"] = _cat(parts, np.dtype(f"u{width // 8}"))
        for width, parts in dense.items():
            blobs[f"dense{width}"] = _cat(parts, np.dtype(f"u{width // 8}"))
        return entries, {k: torch.frombuffer(bytearray(pack(v)), dtype=torch.uint8) if len(v) else torch.empty(0, dtype=torch.uint8)
                         for k, v in blobs.items()}

    @staticmethod
    def _sparse(changes: Changes) -> tuple[list[int], np.ndarray]:
        """Class table rows and rank gaps for one tensor (classes ascending, ranks ascending)."""
        classes = np.flatnonzero(changes.class_changed)
        table = [len(classes)]
        gap_parts = []
        start = 0
        for c in classes.tolist():
            count, size = int(changes.class_changed[c]), int(changes.class_sizes[c])
            ranks = changes.ranks[start:start + count]
            start += count
            complement = 2 * count > size
            if complement:
                keep = np.ones(size, bool)
                keep[ranks] = False
                ranks = np.flatnonzero(keep)
            table += [c, len(ranks), int(complement)]
            gap_parts.append(np.diff(ranks, prepend=-1) - 1)
        return table, _cat(gap_parts, np.uint32)

    # -- decode -----------------------------------------------------------------------------------

    def split(self, entries, blobs) -> list[_Piece]:
        """Decompress the streams and cut them per tensor; checks every stream's length exactly."""
        for e in entries:
            if e.form not in ("sparse", "dense"):
                raise DeltaFormatError(f"form {e.form!r} is not one of this codec's", tensor=e.name)
            if e.dtype not in DTYPES_BY_NAME:
                raise DeltaFormatError(f"dtype {e.dtype!r} is not supported", tensor=e.name)
        max_rows = sum(1 + 3 * (self._field(DTYPES_BY_NAME[e.dtype])[1] + 1) for e in entries if e.form == "sparse")
        table = _Reader(self._stream(blobs, "table", np.uint64, None, max_rows), "table")
        # First pass over the table: how many gaps and steps each stream must hold.
        plan, n_gaps, n_steps, widths = [], 0, defaultdict(int), {}
        for e in entries:
            width = layout_of(DTYPES_BY_NAME[e.dtype]).itemsize * 8
            widths[f"dense{width}"] = widths[f"val{width}"] = width
            if e.form == "dense":
                n_steps[f"dense{width}"] += e.numel
                plan.append((e, f"dense{width}", None))
                continue
            k = int(table.take(1, e.name)[0])
            rows = table.take(3 * k, e.name).reshape(-1, 3).astype(np.int64)
            n_gaps += int(rows[:, 1].sum())
            n_steps[f"val{width}"] += e.changed
            plan.append((e, f"val{width}", rows))
        table.finish()
        extra = set(blobs) - {"table", "pos"} - set(n_steps)
        if extra:
            raise DeltaFormatError(f"unexpected streams {sorted(extra)}")
        gaps = _Reader(self._stream(blobs, "pos", np.uint32, n_gaps), "pos")
        steps = {key: _Reader(self._stream(blobs, key, np.dtype(f"u{widths[key] // 8}"), n), key)
                 for key, n in n_steps.items()}
        pieces = []
        for e, key, rows in plan:
            count = e.numel if rows is None else e.changed
            gap = None if rows is None else gaps.take(int(rows[:, 1].sum()), e.name)
            pieces.append(_Piece(e, rows, gap, steps[key].take(count, e.name)))
        for reader in [gaps, *steps.values()]:
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
        return {p.entry.name: sum(len(pack(x)) for x in (p.gaps, p.steps) if x is not None and len(x))
                for p in self.split(entries, blobs)}

    def _locate(self, a: np.ndarray, e: TensorEntry, rows: np.ndarray, gap: np.ndarray, steps: np.ndarray,
                dtype: torch.dtype) -> tuple[np.ndarray, np.ndarray]:
        """Flat positions and new values of the changed elements of one tensor, in class then rank order."""
        shift, mask = self._field(dtype)
        classes, stored, complement = rows[:, 0], rows[:, 1], rows[:, 2]
        if len(classes) and (classes.min() < 0 or classes.max() > mask or (np.diff(classes) <= 0).any()
                             or not np.isin(complement, (0, 1)).all()):
            raise DeltaFormatError("class table is malformed", tensor=e.name)
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
        changed = np.where(complement == 1, sizes - stored, stored)
        if int(changed.sum()) != e.changed:
            raise DeltaFormatError(f"class table gives {int(changed.sum())} changed elements, the header says "
                                   f"{e.changed}", tensor=e.name)
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
        comp[classes] = complement == 1
        np.cumsum(per_class_stored, out=rank_off[1:])
        np.cumsum(per_class_changed, out=out_off[1:])
        return locate(a, shift, mask, hist, ranks, rank_off, comp, out_off, steps)

    @staticmethod
    def _stream(blobs, key: str, dtype, count: int | None, max_count: int = 0) -> np.ndarray:
        blob = blobs.get(key)
        if blob is None:
            if count:
                raise DeltaFormatError(f"stream {key!r} is missing")
            return np.zeros(0, dtype)
        if blob.dtype != torch.uint8 or blob.dim() != 1:
            raise DeltaFormatError(f"stream {key!r} must be a 1-D uint8 tensor")
        return unpack(blob.numpy(), dtype, count, key, max_count)


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


def _cat(parts: list[np.ndarray], dtype) -> np.ndarray:
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)

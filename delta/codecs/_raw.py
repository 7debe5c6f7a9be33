"""Codec `raw`: the TRL blog layout, int32 flat positions and new values, uncompressed.

Kept for interoperability (files from TRL-style writers apply as they are) and as the baseline the
compact codecs are measured against: 4 + itemsize bytes per changed element.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from tqdm import tqdm

from ..errors import DeltaFormatError
from ..tensors._device import changed_positions, int_view
from ..tensors.bits import DTYPE_NAMES, bits
from ..tensors.hashing import change_sums
from ._base import Change, Codec, Encoded, TensorEntry

INT32_MAX = 2**31 - 1


class RawCodec(Codec):
    name = "raw"
    form = "indices"
    description = "int32 flat positions + new values, uncompressed (TRL blog layout)"

    def encode(self, old, new, names, progress=False, workers=None, chunk=None, keys=None):
        entries, blobs, sums = [], {}, {}
        for name in tqdm(names, desc="diff raw", unit="tensor", disable=not progress):
            if old[name].numel() > INT32_MAX:
                raise ValueError(f"tensor {name!r} has {old[name].numel()} elements; codec 'raw' stores int32 positions")
            positions = changed_positions(old[name], new[name])
            if positions.numel() == 0:
                continue
            values = new[name].reshape(-1)[positions.to(new[name].device)]
            if keys is not None:
                sums[name] = change_sums(keys[name], old[name], positions, int_view(values))
            blobs[f"{name}.indices"] = positions.to(torch.int32).cpu()
            blobs[f"{name}.values"] = values.cpu()
            entries.append(TensorEntry(name, DTYPE_NAMES[new[name].dtype], tuple(new[name].shape), "indices",
                                       positions.numel()))
        return Encoded(entries, blobs, sums if keys is not None else None)

    def stream_names(self, entries):
        return {f"{e.name}.{kind}" for e in entries
                for kind in (("values",) if e.form == "dense" else ("indices", "values"))}

    def check_streams(self, entries, blobs):
        for e in entries:
            idx, val = blobs[f"{e.name}.indices"], blobs[f"{e.name}.values"]
            if idx.dtype != torch.int32 or tuple(idx.shape) != (e.changed,):
                raise DeltaFormatError(f"indices are {idx.dtype} {tuple(idx.shape)}, the header needs int32 "
                                       f"({e.changed},)", tensor=e.name)
            if DTYPE_NAMES.get(val.dtype) != e.dtype or tuple(val.shape) != (e.changed,):
                raise DeltaFormatError(f"values are {val.dtype} {tuple(val.shape)}, the header needs {e.dtype} "
                                       f"({e.changed},)", tensor=e.name)

    def _streams(self, entry, blobs) -> tuple[np.ndarray | None, torch.Tensor]:
        """(positions as int64, values) of one entry, every count and dtype checked; positions None for `dense`."""
        val = blobs.get(f"{entry.name}.values")
        if entry.form == "dense":
            if val is None or DTYPE_NAMES.get(val.dtype) != entry.dtype or tuple(val.shape) != entry.shape:
                raise DeltaFormatError(f"the whole tensor must be stored as {entry.dtype} {entry.shape}",
                                       tensor=entry.name)
            return None, val
        idx = blobs.get(f"{entry.name}.indices")
        if idx is None or val is None:
            raise DeltaFormatError("indices or values missing", tensor=entry.name)
        if idx.dtype not in (torch.int32, torch.int64) or idx.dim() != 1:
            raise DeltaFormatError(f"indices must be a 1-D int32 tensor, got {idx.dtype} {tuple(idx.shape)}",
                                   tensor=entry.name)
        if DTYPE_NAMES.get(val.dtype) != entry.dtype or val.dim() != 1:
            raise DeltaFormatError(f"values are {val.dtype} {tuple(val.shape)}, the header says {entry.dtype}, 1-D",
                                   tensor=entry.name)
        if val.numel() != idx.numel() or idx.numel() != entry.changed:
            raise DeltaFormatError(f"{idx.numel()} indices and {val.numel()} values, the header says {entry.changed} "
                                   "changed elements", tensor=entry.name)
        pos = idx.numpy().astype(np.int64)
        if pos.size > 1 and not (np.diff(pos) > 0).all():
            raise DeltaFormatError("positions are not strictly increasing", tensor=entry.name)
        if pos.size and pos[0] < 0:
            raise DeltaFormatError("positions are negative", tensor=entry.name)
        return pos, val

    def _all_streams(self, entries, blobs) -> None:
        if set(blobs) != self.stream_names(entries):
            extra = sorted(set(blobs) - self.stream_names(entries))
            raise DeltaFormatError(f"streams not listed by the header: {extra[:5]}" if extra else "streams missing")

    def decode(self, entries, blobs: Mapping[str, torch.Tensor], state, workers=None, keys=None):
        self._all_streams(entries, blobs)
        changes = []
        for entry in entries:
            target = state[entry.name]
            if DTYPE_NAMES.get(target.dtype) != entry.dtype:
                raise DeltaFormatError(f"values are {entry.dtype}, the tensor is {target.dtype}", tensor=entry.name)
            pos, val = self._streams(entry, blobs)
            if pos is None:
                if tuple(target.shape) != entry.shape:
                    raise DeltaFormatError(f"the file holds {entry.shape}, the tensor is {tuple(target.shape)}",
                                           tensor=entry.name)
                changes.append(Change(entry.name, None, bits(val.contiguous()).reshape(-1).copy()))
                continue
            if pos.size and pos[-1] >= target.numel():
                raise DeltaFormatError(f"positions out of range [0, {target.numel()})", tensor=entry.name)
            changes.append(Change(entry.name, pos, bits(val.contiguous()).copy()))
        return changes

    def check(self, entries, blobs, workers=None, foreign=False):
        self._all_streams(entries, blobs)
        for entry in entries:
            pos, _ = self._streams(entry, blobs)
            if pos is not None and pos.size and not foreign and pos[-1] >= entry.numel:
                raise DeltaFormatError(f"positions out of range [0, {entry.numel})", tensor=entry.name)
        if entries and all(e.form == "dense" for e in entries):
            return f"{len(entries)} whole tensors, of the shapes and dtypes the file gives"
        where = "not negative (the file gives no shapes)" if foreign else "inside their tensor"
        return (f"{len(entries)} tensors, with positions strictly increasing and {where}, and one value of the "
                "table's dtype per position")

    def tensor_bytes(self, entries, blobs):
        self._all_streams(entries, blobs)
        sizes = {}
        for entry in entries:
            pos, val = self._streams(entry, blobs)
            sizes[entry.name] = val.numel() * val.element_size() + (0 if pos is None else
                                                                   blobs[f"{entry.name}.indices"].numel()
                                                                   * blobs[f"{entry.name}.indices"].element_size())
        return sizes

"""Codec `raw`: the TRL blog layout, int32 flat positions and new values, uncompressed.

Kept for interoperability (files from TRL-style writers apply as they are) and as the baseline the
compact codecs are measured against: 4 + itemsize bytes per changed element.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from tqdm import tqdm

from ..bits import DTYPE_NAMES, bits
from .._device import changed_positions
from ..errors import DeltaFormatError
from ..format import TensorEntry
from ._base import Change, Codec

INT32_MAX = 2**31 - 1


class RawCodec(Codec):
    name = "raw"
    description = "int32 flat positions + new values, uncompressed (TRL blog layout)"

    def encode(self, old, new, names, progress=False, workers=None, chunk=None):
        entries, blobs = [], {}
        for name in tqdm(names, desc="diff raw", unit="tensor", disable=not progress):
            if old[name].numel() > INT32_MAX:
                raise ValueError(f"tensor {name!r} has {old[name].numel()} elements; codec 'raw' stores int32 positions")
            positions = changed_positions(old[name], new[name])
            if positions.numel() == 0:
                continue
            blobs[f"{name}.indices"] = positions.to(torch.int32).cpu()
            blobs[f"{name}.values"] = new[name].reshape(-1)[positions.to(new[name].device)].cpu()
            entries.append(TensorEntry(name, DTYPE_NAMES[new[name].dtype], tuple(new[name].shape), "indices",
                                       positions.numel()))
        return entries, blobs

    def decode(self, entries, blobs: Mapping[str, torch.Tensor], state, workers=None):
        changes = []
        for entry in entries:
            idx, val = blobs.get(f"{entry.name}.indices"), blobs.get(f"{entry.name}.values")
            if idx is None or val is None:
                raise DeltaFormatError("indices or values missing", tensor=entry.name)
            target = state[entry.name]
            if idx.dtype not in (torch.int32, torch.int64) or idx.dim() != 1:
                raise DeltaFormatError(f"indices must be a 1-D int32 tensor, got {idx.dtype} {tuple(idx.shape)}",
                                       tensor=entry.name)
            if val.dtype != target.dtype:
                raise DeltaFormatError(f"values are {val.dtype}, the tensor is {target.dtype}", tensor=entry.name)
            if val.numel() != idx.numel():
                raise DeltaFormatError(f"{idx.numel()} indices but {val.numel()} values", tensor=entry.name)
            pos = idx.numpy().astype(np.int64)
            if pos.size > 1 and not (np.diff(pos) > 0).all():
                raise DeltaFormatError("positions are not strictly increasing", tensor=entry.name)
            if pos.size and (pos[0] < 0 or pos[-1] >= target.numel()):
                raise DeltaFormatError(f"positions out of range [0, {target.numel()})", tensor=entry.name)
            changes.append(Change(entry.name, pos, bits(val.contiguous()).copy()))
        return changes

    def tensor_bytes(self, entries, blobs):
        sizes = {}
        for entry in entries:
            parts = [blobs.get(f"{entry.name}.{kind}") for kind in ("indices", "values")]
            if any(p is None for p in parts):
                raise DeltaFormatError("indices or values missing", tensor=entry.name)
            sizes[entry.name] = sum(p.numel() * p.element_size() for p in parts)
        return sizes

"""Tensors of one dtype and device taken together, so that whole-tensor torch work launches a few kernels per group
instead of per tensor: small tensors concatenated up to `_device.GROUP` elements, a large one in parts of at
most `_device.SEGMENT` (temporaries stay bounded whatever a tensor's size). Used by the device path of the
codecs and by the state hash.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from . import _device

UINT: dict[int, type[np.unsignedinteger]] = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}


@dataclass(frozen=True)
class Group:
    """Ranges of tensors of one dtype scanned together: whole tensors in name order, or one chunk-aligned
    part of a tensor larger than `_device.SEGMENT` elements.

    Attributes:
        names: The tensor of each member.
        starts: Where each member starts in its tensor (a multiple of `chunk`; 0 for a whole tensor).
        sizes: Elements of each member.
        chunk: Elements per chunk (chunks restart at each tensor).
    """

    names: tuple[str, ...]
    starts: tuple[int, ...]
    sizes: tuple[int, ...]
    chunk: int

    @property
    def offsets(self) -> np.ndarray:
        """Where each member starts in the group."""
        return np.concatenate([[0], np.cumsum(self.sizes[:-1], dtype=np.int64)]).astype(np.int64)

    @property
    def chunk_base(self) -> np.ndarray:
        """The group-wide number of each member's first chunk."""
        counts = [max(1, -(-n // self.chunk)) for n in self.sizes]
        return np.concatenate([[0], np.cumsum(counts[:-1], dtype=np.int64)]).astype(np.int64)

    def first_chunk(self, member: int) -> int:
        """The member's first chunk, numbered in its tensor."""
        return self.starts[member] // self.chunk


def groups(tensors: Mapping[str, torch.Tensor], names: Sequence[str], chunk: int) -> list[Group]:
    """`names` (sorted) cut into groups: one dtype and device each, at most `_device.GROUP` elements; a tensor of
    more than `_device.SEGMENT` elements in chunk-aligned parts of at most that, one group each (so temporaries
    stay bounded whatever a tensor's size). Empty tensors are left out (nothing in them can change)."""
    out: list[Group] = []
    open_: dict[tuple, list[str]] = {}
    part = max(chunk, _device.SEGMENT // chunk * chunk)

    def close(key: tuple) -> None:
        members = open_.pop(key)
        out.append(Group(tuple(members), (0,) * len(members), tuple(tensors[n].numel() for n in members), chunk))

    for name in names:
        t = tensors[name]
        n = t.numel()
        if n == 0:
            continue
        if n > _device.SEGMENT:
            out.extend(Group((name,), (a,), (min(part, n - a),), chunk) for a in range(0, n, part))
            continue
        key = (t.dtype, t.device)
        held = sum(tensors[m].numel() for m in open_.get(key, ()))
        if key in open_ and held + n > _device.GROUP:
            close(key)
        open_.setdefault(key, []).append(name)
    for key in list(open_):
        close(key)
    return out


def flat(tensors: Mapping[str, torch.Tensor], group: Group) -> torch.Tensor:
    """The group's bits as one flat integer tensor: a view of a member alone, else one concatenation."""
    views = [
        _device.int_view(tensors[n].contiguous())[a : a + size]
        for n, a, size in zip(group.names, group.starts, group.sizes, strict=True)
    ]
    return views[0] if len(views) == 1 else torch.cat(views)


def owner(group: Group, values: torch.Tensor, starts: np.ndarray) -> torch.Tensor:
    """Index of the tensor each value belongs to, given the tensors' `starts` (group offsets or chunk bases)."""
    return torch.searchsorted(torch.from_numpy(starts).to(values.device), values, right=True) - 1

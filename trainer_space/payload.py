"""What a version would weigh in other layouts, for the "payload per step" curves.

The trainer knows the size of the delta file it published (the default codec). These give, from
the same header, the bytes the ``raw`` layout (TRL's: int32 positions + new values) would need and
the bytes of the dense model, without encoding anything again.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from delta import DeltaHeader

_POSITION_BYTES = 4  # int32


def _itemsize(dtype_name: str) -> int:
    return getattr(torch, dtype_name).itemsize  # a header's dtype names are torch's (`bfloat16`, ...)


def raw_bytes(header: DeltaHeader) -> int:
    """Tensor bytes of the same delta in the ``raw`` layout: per changed element an int32 position
    and the new value. The file adds its JSON header (a few hundred bytes per tensor) on top."""
    return sum(t.changed * (_POSITION_BYTES + _itemsize(t.dtype)) for t in header.tensors)


def dense_bytes(state: Mapping[str, torch.Tensor]) -> int:
    """Bytes of the whole state as a plain checkpoint (what shipping full weights costs per step)."""
    return sum(t.numel() * t.element_size() for t in state.values())

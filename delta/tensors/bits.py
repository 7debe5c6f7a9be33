"""Bit-level views of tensors: what "changed" means and what the reader can predict from an old value.

Public, for tools that read deltas and states at the bit level (dashboards, benchmarks).

Every comparison in `delta` is on bit patterns, never on float values, so -0/+0, NaN payloads and
subnormals are ordinary values. A tensor of any dtype is seen as unsigned integers of its width.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

_UINT_BY_SIZE: dict[int, type[np.unsignedinteger]] = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_TORCH_INT_BY_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}

# Exponent field (shift, mask) by dtype: the context the default codec conditions on.
_EXPONENT_FIELD: dict[torch.dtype, tuple[int, int]] = {
    torch.float16: (10, 0x1F),
    torch.bfloat16: (7, 0xFF),
    torch.float32: (23, 0xFF),
    torch.float64: (52, 0x7FF),
}
for _name, _field in {
    "float8_e4m3fn": (3, 0xF),
    "float8_e4m3fnuz": (3, 0xF),
    "float8_e5m2": (2, 0x1F),
    "float8_e5m2fnuz": (2, 0x1F),
}.items():
    if hasattr(torch, _name):
        _EXPONENT_FIELD[getattr(torch, _name)] = _field

DTYPE_NAMES: dict[torch.dtype, str] = {
    dtype: str(dtype).removeprefix("torch.")
    for dtype in [
        torch.bool,
        torch.uint8,
        torch.int8,
        torch.int16,
        torch.int32,
        torch.int64,
        torch.float16,
        torch.bfloat16,
        torch.float32,
        torch.float64,
        *_EXPONENT_FIELD,
    ]
}
DTYPES_BY_NAME: dict[str, torch.dtype] = {name: dtype for dtype, name in DTYPE_NAMES.items()}


@dataclass(frozen=True)
class BitLayout:
    """How to read one dtype as bits: width in bytes and the exponent field used as coding context."""

    itemsize: int
    shift: int
    mask: int

    @property
    def classes(self) -> int:
        """Number of context classes (1 for dtypes without an exponent)."""
        return self.mask + 1


@functools.cache
def layout_of(dtype: torch.dtype) -> BitLayout:
    """The bit layout of `dtype`; raises ValueError for dtypes `delta` cannot carry."""
    if dtype not in DTYPE_NAMES:
        raise ValueError(f"dtype {dtype} is not supported; supported: {sorted(DTYPES_BY_NAME)}")
    shift, mask = _EXPONENT_FIELD.get(dtype, (0, 0))
    return BitLayout(itemsize=dtype.itemsize, shift=shift, mask=mask)


def classes_of_width(width: int) -> int:
    """The most context classes any dtype of `width` bits has."""
    return max((layout_of(d).classes for d in DTYPE_NAMES if layout_of(d).itemsize * 8 == width), default=1)


def bits(tensor: torch.Tensor) -> np.ndarray:
    """A flat unsigned-integer numpy view sharing memory with a contiguous CPU tensor."""
    if not tensor.is_contiguous():
        raise ValueError("tensor must be contiguous to be viewed as bits")
    size = tensor.element_size()
    flat = tensor.reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.view(torch.uint8)
    elif flat.dtype != _TORCH_INT_BY_SIZE[size]:
        flat = flat.view(_TORCH_INT_BY_SIZE[size])
    return flat.numpy().view(_UINT_BY_SIZE[size])


def order_key(u: np.ndarray) -> np.ndarray:
    """Map float bit patterns to unsigned keys whose integer order follows the float order.

    A bijection on all bit patterns (-0 sits just below +0, NaNs at the ends), so differences of keys
    count ULP steps.
    """
    width = u.dtype.itemsize * 8
    sign = u.dtype.type(1 << (width - 1))
    negative = (u & sign) != 0
    return np.where(negative, ~u, u | sign)


def zigzag(d: np.ndarray) -> np.ndarray:
    """Fold a wrapped unsigned difference into small unsigned numbers: 0, -1, 1, -2 ... -> 0, 1, 2, 3."""
    width = d.dtype.itemsize * 8
    signed = d.view(np.dtype(f"i{d.dtype.itemsize}"))
    return ((signed << 1) ^ (signed >> (width - 1))).view(d.dtype)

"""Small states and deltas for the codec tests, built from raw bit patterns."""

from __future__ import annotations

import numpy as np
import torch

from delta.tensors.bits import DTYPES_BY_NAME

FLOAT_DTYPES = [d for name, d in DTYPES_BY_NAME.items() if d.is_floating_point]
ALL_DTYPES = list(DTYPES_BY_NAME.values())
_INT_OF = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def from_bits(raw: np.ndarray, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
    """A tensor of `dtype` whose bit patterns are `raw` (unsigned ints of the right width)."""
    size = torch.empty((), dtype=dtype).element_size()
    t = torch.from_numpy(raw.astype(f"u{size}").view(f"i{size}") if size > 1 else raw.astype(np.uint8))
    t = t.view(_INT_OF[size]) if size > 1 else t
    if dtype == torch.bool:
        return (t != 0).reshape(shape)
    return t.view(dtype).reshape(shape).clone()


def bit_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when both tensors have the same dtype, shape and bit patterns."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    size = a.element_size()
    if a.dtype == torch.bool:
        return torch.equal(a, b)
    return torch.equal(a.contiguous().view(_INT_OF[size]), b.contiguous().view(_INT_OF[size]))


def states_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(bit_equal(a[k], b[k]) for k in a)


def clone(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in state.items()}


def adam_like(seed: int = 0, n: int = 50_000, lr: float = 1e-4) -> tuple[dict, dict]:
    """A bf16 state and its update by one sign-of-gradient step (the first AdamW step's shape)."""
    g = torch.Generator().manual_seed(seed)
    old = {
        "layers.0.w": (torch.randn(n, generator=g) * 0.02).bfloat16().reshape(-1, 50),
        "layers.0.norm": torch.ones(50, dtype=torch.bfloat16),
        "head.fp32": torch.randn(1000, generator=g) * 0.02,
    }
    new = {}
    for k, v in old.items():
        step = lr * torch.sign(torch.randn(v.shape, generator=g))
        new[k] = (v.float() - step).to(v.dtype)
    return old, new

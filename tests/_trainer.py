"""A fake trainer for the publishing tests: small bf16 states moved by Adam-like sign steps."""

from __future__ import annotations

import torch

from delta.tensors.state import State


def initial_state(n: int = 100_000, seed: int = 0) -> State:
    """Three tensors, ~`n` bf16 elements in all plus a small fp32 one."""
    g = torch.Generator().manual_seed(seed)
    return {
        "layers.0.w": (torch.randn(n // 2, generator=g) * 0.02).bfloat16().reshape(-1, 100),
        "layers.1.w": (torch.randn(n // 2, generator=g) * 0.02).bfloat16().reshape(-1, 100),
        "head.fp32": torch.randn(1000, generator=g) * 0.02,
    }


def step(state: State, seed: int, lr: float = 3e-4) -> State:
    """A new state: every element moved by +-lr (most bf16 elements do not change)."""
    g = torch.Generator().manual_seed(seed)
    return {k: (v.float() - lr * torch.sign(torch.randn(v.shape, generator=g))).to(v.dtype) for k, v in state.items()}


def trajectory(count: int, n: int = 100_000) -> list[State]:
    """States 0..count: the initial state and `count` steps after it, reproducible."""
    states = [initial_state(n)]
    for i in range(count):
        states.append(step(states[-1], seed=1000 + i))
    return states

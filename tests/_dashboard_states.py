"""A Qwen3-shaped state (real tensor names, toy sizes) and real deltas of it, for the dashboard tests."""

from __future__ import annotations

import torch

import delta

HIDDEN, INTER, VOCAB, LAYERS = 8, 16, 32, 2


def qwen3_state(seed: int = 0) -> dict[str, torch.Tensor]:
    """Names and layout of a Qwen3 checkpoint with untied lm_head; bf16 random weights."""
    g = torch.Generator().manual_seed(seed)
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (VOCAB, HIDDEN)}
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        shapes |= {
            p + "self_attn.q_proj.weight": (HIDDEN, HIDDEN), p + "self_attn.k_proj.weight": (HIDDEN // 2, HIDDEN),
            p + "self_attn.v_proj.weight": (HIDDEN // 2, HIDDEN), p + "self_attn.o_proj.weight": (HIDDEN, HIDDEN),
            p + "self_attn.q_norm.weight": (4,), p + "self_attn.k_norm.weight": (4,),
            p + "input_layernorm.weight": (HIDDEN,), p + "post_attention_layernorm.weight": (HIDDEN,),
            p + "mlp.gate_proj.weight": (INTER, HIDDEN), p + "mlp.up_proj.weight": (INTER, HIDDEN),
            p + "mlp.down_proj.weight": (HIDDEN, INTER),
        }
    shapes |= {"model.norm.weight": (HIDDEN,), "lm_head.weight": (VOCAB, HIDDEN)}
    return {n: torch.randn(s, generator=g).to(torch.bfloat16) for n, s in shapes.items()}


def changed_copy(state: dict[str, torch.Tensor], changes: dict[str, int]) -> dict[str, torch.Tensor]:
    """A copy where the first ``changes[name]`` elements of each named tensor moved by one ULP."""
    new = {k: v.clone() for k, v in state.items()}
    for name, count in changes.items():
        flat = new[name].view(-1).view(torch.int16)
        flat[:count] += 1
    return new


def header_of(old: dict[str, torch.Tensor], new: dict[str, torch.Tensor], codec: str = delta.DEFAULT_CODEC,
              version: int = 2) -> delta.DeltaHeader:
    """The header of the real delta file ``delta.diff`` writes for old -> new."""
    header, _ = delta.read_delta(delta.diff(old, new, codec=codec, version=version, base_version=version - 1))
    return header

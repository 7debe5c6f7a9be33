"""Large synthetic states (Qwen3-8B and Qwen3-32B shapes) made one tensor at a time, so they never
have to fit in memory: the benchmark diffs and applies each (old, new) tensor pair, then drops it.

Each pair is two steps of the AdamW rule on fp32 master weights with synthetic gradients (standard
normal, fixed seed per tensor), published as bf16: `old` after step 1, `new` after step 2. The
update rule is real, the gradients are not. Rows are generated in blocks, so a tensor costs about
three bf16 copies of itself (old, new and the reader's copy) and a block of fp32 temporaries.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from ._adamw import BETAS, EPS, WEIGHT_DECAY
from ._synthetic import INIT_STD, _generator

# From the models' config.json files on the Hub (hidden, layers, heads, kv heads, head dim, MLP, vocab).
SHAPES = {
    "qwen3-8b": dict(hidden=4096, layers=36, heads=32, kv_heads=8, head_dim=128, mlp=12288, vocab=151936),
    "qwen3-32b": dict(hidden=5120, layers=64, heads=64, kv_heads=8, head_dim=128, mlp=25600, vocab=151936),
}
BLOCK_ELEMENTS = 1 << 24


def qwen3_shapes(model: str, layers: int | None = None) -> dict[str, tuple[int, ...]]:
    """Parameter names and shapes of a Qwen3 model (untied embeddings), optionally its first `layers` layers."""
    c = SHAPES[model]
    h, d = c["hidden"], c["head_dim"]
    shapes: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (c["vocab"], h)}
    for i in range(c["layers"] if layers is None else min(layers, c["layers"])):
        p = f"model.layers.{i}."
        shapes.update(
            {
                p + "input_layernorm.weight": (h,),
                p + "post_attention_layernorm.weight": (h,),
                p + "self_attn.q_proj.weight": (c["heads"] * d, h),
                p + "self_attn.k_proj.weight": (c["kv_heads"] * d, h),
                p + "self_attn.v_proj.weight": (c["kv_heads"] * d, h),
                p + "self_attn.o_proj.weight": (h, c["heads"] * d),
                p + "self_attn.q_norm.weight": (d,),
                p + "self_attn.k_norm.weight": (d,),
                p + "mlp.gate_proj.weight": (c["mlp"], h),
                p + "mlp.up_proj.weight": (c["mlp"], h),
                p + "mlp.down_proj.weight": (h, c["mlp"]),
            }
        )
    shapes["model.norm.weight"] = (h,)
    shapes["lm_head.weight"] = (c["vocab"], h)
    return shapes


def pairs(
    shapes: dict[str, tuple[int, ...]], lr: float, seed: int = 0, device: str = "cpu"
) -> Iterator[tuple[str, torch.Tensor, torch.Tensor]]:
    """(name, old, new) per tensor: bf16 states after AdamW steps 1 and 2 (see the module docstring), made on
    `device` (on a GPU in seconds where the host would take minutes; other draws than the CPU's)."""
    b1, b2 = BETAS
    for name, shape in shapes.items():
        numel = int(torch.Size(shape).numel())
        old = torch.empty(numel, dtype=torch.bfloat16, device=device)
        new = torch.empty(numel, dtype=torch.bfloat16, device=device)
        gens = [_generator(seed, name, k, device) for k in range(3)]
        for lo in range(0, numel, BLOCK_ELEMENTS):
            n = min(BLOCK_ELEMENTS, numel - lo)
            if name.endswith("norm.weight"):
                w = torch.ones(n, device=device)
            else:
                w = torch.randn(n, generator=gens[0], device=device).mul_(INIT_STD).bfloat16().float()
            m, v = torch.zeros(n, device=device), torch.zeros(n, device=device)
            for step, out in ((1, old), (2, new)):
                g = torch.randn(n, generator=gens[step], device=device)
                m.lerp_(g, 1 - b1)
                v.mul_(b2).addcmul_(g, g, value=1 - b2)
                w.mul_(1 - lr * WEIGHT_DECAY)
                w.addcdiv_(m, v.sqrt().div_((1 - b2**step) ** 0.5).add_(EPS), value=-lr / (1 - b1**step))
                out[lo : lo + n] = w.bfloat16()
        yield name, old.reshape(shape), new.reshape(shape)

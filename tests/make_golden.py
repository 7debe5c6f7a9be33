"""Write tests/data/golden_v<FORMAT_VERSION>.*: run only when the format version changes on purpose.

Files of older versions stay: the tests check that they are refused with a clear message.

    python -m tests.make_golden
"""

from __future__ import annotations

import os

import torch
from safetensors.torch import save_file

import delta
from delta.format import FORMAT_VERSION

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data")


def golden_states() -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A small fixed pair of states with specials: -0, NaN payloads, subnormals, fp32 and bf16."""
    g = torch.Generator().manual_seed(1234)
    old = {
        "a.bf16": (torch.randn(64, 32, generator=g) * 0.02).bfloat16(),
        "b.fp32": torch.randn(100, generator=g),
        "c.fp16": torch.tensor([0.0, -0.0, float("inf"), float("nan"), 6e-8, 1.0], dtype=torch.float16),
    }
    new = {k: v.clone() for k, v in old.items()}
    new["a.bf16"] = (old["a.bf16"].float() - 1e-4 * torch.sign(torch.randn(64, 32, generator=g))).bfloat16()
    new["b.fp32"][::7] += 1e-6
    new["c.fp16"].view(torch.int16)[[1, 3, 4]] ^= torch.tensor([-(1 << 15), 1, 1], dtype=torch.int16)
    return old, new


if __name__ == "__main__":
    old, new = golden_states()
    save_file(old, os.path.join(HERE, "golden_base.safetensors"))
    for codec in sorted(delta.CODECS):
        with open(os.path.join(HERE, f"golden_v{FORMAT_VERSION}.{codec}.delta"), "wb") as f:
            f.write(delta.diff(old, new, codec=codec, version=1, base_version=0))
    print(f"wrote golden files to {HERE}")

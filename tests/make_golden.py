"""Write tests/data/golden_v<FORMAT_VERSION>.*: run only when the format version changes on purpose.

Files of older versions stay (one each): the tests check that they are refused with a clear message.

    python -m tests.make_golden

`python -m tests.make_golden trl` writes tests/data/trl_*.safetensors instead: one file of each layout
TRL's delta branches wrote (`tests/_trl_writers.py`), made once and kept, so a change to our reader
cannot drift along with a change to the test writers.
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


TRL_FILES = {  # file -> (writer, arguments): states 0, 1, 2 of `trl_golden_states`
    "trl_earlier_anchor_v1": ("earlier_anchor", (1, 1)),
    "trl_earlier_patch_v2": ("earlier_patch", (1, 2, 2)),
    "trl_earlier_empty_v3": ("earlier_patch", (2, 2, 3)),
    "trl_middle_anchor_v1": ("middle_patch", (None, 1, 1)),
    "trl_middle_patch_v2": ("middle_patch", (1, 2, 2)),
    "trl_later_anchor_v1": ("later_patch", (None, 1, 1)),
    "trl_later_gap_v2": ("later_patch", (1, 2, 2, "gap_delta")),
    "trl_later_raw_v2": ("later_patch", (1, 2, 2, "raw")),
}


def trl_golden_states() -> list[dict[str, torch.Tensor]]:
    from ._trl_writers import trl_states

    return trl_states(seed=5, steps=2, mlp=3000)


def write_trl_golden() -> None:
    from . import _trl_writers

    states = trl_golden_states()
    save_file(states[0], os.path.join(HERE, "trl_base.safetensors"))
    for name, (writer, args) in TRL_FILES.items():
        if writer == "earlier_anchor":
            data = _trl_writers.earlier_anchor(states[args[0]], args[1])
        elif writer == "earlier_patch":
            data = _trl_writers.earlier_patch(states[args[0]], states[args[1]], args[2], anchor_step=1)
        else:
            prev = None if args[0] is None else states[args[0]]
            data = getattr(_trl_writers, writer)(prev, states[args[1]], *args[2:])
        with open(os.path.join(HERE, f"{name}.safetensors"), "wb") as f:
            f.write(data)
    print(f"wrote TRL golden files to {HERE}")


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["trl"]:
        write_trl_golden()
        raise SystemExit
    old, new = golden_states()
    save_file(old, os.path.join(HERE, "golden_base.safetensors"))
    for codec in sorted(delta.CODECS):
        with open(os.path.join(HERE, f"golden_v{FORMAT_VERSION}.{codec}.delta"), "wb") as f:
            f.write(delta.diff(old, new, codec=codec, version=1, base_version=0))
    print(f"wrote golden files to {HERE}")

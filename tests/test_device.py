"""The device (torch ops) chunk scan finds exactly what the compiled CPU scan finds."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import delta
from delta.bits import DTYPE_NAMES, bits, layout_of
from delta._device import scan_chunk_torch
from delta._kernels import scan_chunk

from ._states import ALL_DTYPES, adam_like

NARROW = [d for d in ALL_DTYPES if torch.empty((), dtype=d).element_size() <= 4]


@pytest.mark.parametrize("dtype", NARROW, ids=lambda d: DTYPE_NAMES[d])
@pytest.mark.parametrize("context", [True, False])
def test_torch_scan_matches_compiled_scan(dtype, context):
    rng = np.random.default_rng(5)
    size = torch.empty((), dtype=dtype).element_size()
    raw_old = rng.integers(0, 2 ** (8 * size), 300_000, dtype=np.uint64).astype(f"u{size}")
    raw_new = raw_old.copy()
    flip = rng.random(raw_old.size) < 0.05
    raw_new[flip] = rng.integers(0, 2 ** (8 * size), int(flip.sum()), dtype=np.uint64).astype(f"u{size}")
    if dtype == torch.bool:
        raw_old, raw_new = raw_old & 1, raw_new & 1
    old = torch.from_numpy(raw_old.view(f"i{size}") if size > 1 else raw_old)
    new = torch.from_numpy(raw_new.view(f"i{size}") if size > 1 else raw_new)
    old = (old != 0) if dtype == torch.bool else old.view(dtype)
    new = (new != 0) if dtype == torch.bool else new.view(dtype)
    layout = layout_of(dtype)
    shift, mask = (layout.shift, layout.mask) if context else (0, 0)
    a, b = bits(old), bits(new)
    for lo, hi in [(0, 1000), (1000, 131_072), (131_072, a.size)]:
        cls, gaps, steps = np.empty(hi - lo, np.uint16), np.empty(hi - lo, np.uint32), np.empty(hi - lo, np.uint64)
        m, cmin, cmax = scan_chunk(a, b, lo, hi, a.dtype.type(shift), a.dtype.type(mask), cls, gaps, steps)
        got = scan_chunk_torch(old[lo:hi], new[lo:hi], shift, mask)
        assert got[:3] == (m, cmin, cmax)
        for want, have in zip((cls[:m], gaps[:m], steps[:m]), got[3:]):
            assert np.array_equal(have, want)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_state_diffs_to_the_same_bytes():
    old, new = adam_like()
    on_device = delta.diff({k: v.cuda() for k, v in old.items()}, {k: v.cuda() for k, v in new.items()})
    assert on_device == delta.diff(old, new)

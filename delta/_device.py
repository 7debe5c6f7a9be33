"""The writer's scan in plain torch ops, so tensors on a GPU are diffed where they live.

Same result as `_kernels.find_changes` (a test checks them against each other on CPU); only the
changed elements (positions, ranks, steps) travel to the host. Ranks come from a stable sort of
the class of every element, which costs a few full-size int64 temporaries on the device.
"""

from __future__ import annotations

import torch

from ._bits import bits, layout_of
from ._kernels import Changes, find_changes

_INT_OF = {1: torch.uint8, 2: torch.int16, 4: torch.int32}


def _unsigned(t: torch.Tensor, width: int) -> torch.Tensor:
    """Bit patterns as non-negative int64 values."""
    flat = t.reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.view(torch.uint8)
    elif flat.dtype != _INT_OF[width // 8]:
        flat = flat.view(_INT_OF[width // 8])
    return flat.to(torch.int64) & ((1 << width) - 1)


def find_changes_torch(old: torch.Tensor, new: torch.Tensor, context: bool) -> Changes:
    """`find_changes` for tensors of up to 32 bits on any device; results as host numpy arrays.

    Args:
        old, new: Contiguous tensors of the same dtype and shape, on the same device.
        context: Rank inside the old value's exponent class (True) or use plain positions (False).
    """
    layout = layout_of(old.dtype)
    width = layout.itemsize * 8
    if width > 32:
        raise ValueError(f"device diff supports dtypes up to 32 bits, not {old.dtype}")
    shift, mask = (layout.shift, layout.mask) if context else (0, 0)
    a, b = _unsigned(old, width), _unsigned(new, width)
    pos = torch.nonzero(a != b).reshape(-1)
    sign, full = 1 << (width - 1), (1 << width) - 1
    ka = torch.where(a[pos] & sign != 0, ~a[pos] & full, a[pos] | sign)
    kb = torch.where(b[pos] & sign != 0, ~b[pos] & full, b[pos] | sign)
    d = (kb - ka) & full
    steps = torch.where(d < sign, 2 * d, 2 * (full - d) + 1)
    if mask == 0:
        ranks, cls = pos, torch.zeros_like(pos)
        sizes = torch.tensor([a.numel()], dtype=torch.int64)
    else:
        classes = (a >> shift) & mask
        sizes = torch.bincount(classes, minlength=mask + 1)
        starts = torch.cumsum(sizes, 0) - sizes
        order = torch.argsort(classes, stable=True)
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(order.numel(), device=order.device)
        cls = classes[pos]
        ranks = inverse[pos] - starts[cls]
        del classes, order, inverse
    group = torch.argsort(cls, stable=True)
    np_dtype = layout.uint
    return Changes(
        positions=pos[group].cpu().numpy(),
        ranks=ranks[group].cpu().numpy(),
        steps=steps[group].cpu().numpy().astype(np_dtype),
        class_changed=torch.bincount(cls, minlength=mask + 1).cpu().numpy(),
        class_sizes=sizes.cpu().numpy(),
    )


def scan(old: torch.Tensor, new: torch.Tensor, context: bool) -> Changes:
    """Changed elements of one tensor, scanned where the tensor lives.

    Tensors on an accelerator (up to 32 bits wide) are scanned there with torch ops; everything else
    with the compiled CPU scan.
    """
    if old.device.type != "cpu" and old.element_size() <= 4:
        return find_changes_torch(old.contiguous(), new.to(old.device).contiguous(), context)
    old, new = old.cpu().contiguous(), new.cpu().contiguous()
    layout = layout_of(old.dtype)
    shift, mask = (layout.shift, layout.mask) if context else (0, 0)
    return find_changes(bits(old), bits(new), shift, mask)

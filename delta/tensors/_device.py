"""Tensors on a device (a GPU): the writer's chunk scan in plain torch ops, the reader's writes (and their
compiled twin for host tensors, `scatter`), and the seam between host and device.

The scan gives the same result as `delta.codecs._kernels.scan_chunk` (a test checks them against each other on CPU).
It works on one chunk at a time, so its temporaries are chunk-sized whatever the tensor's size, and only
the changed elements (class, gap, step) travel to the host. None of this has run on a GPU yet: it is
the same torch code on any device, tested on CPU tensors.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import torch
from numba import njit

_INT_OF = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _unsigned(t: torch.Tensor, width: int) -> torch.Tensor:
    """Bit patterns as non-negative int64 values (up to 32 bits wide)."""
    flat = t.reshape(-1)
    if flat.dtype == torch.bool:
        flat = flat.view(torch.uint8)
    elif flat.dtype != _INT_OF[width // 8]:
        flat = flat.view(_INT_OF[width // 8])
    return flat.to(torch.int64) & ((1 << width) - 1)


def scan_chunk_torch(old: torch.Tensor, new: torch.Tensor, shift: int, mask: int
                     ) -> tuple[int, int, int, np.ndarray, np.ndarray, np.ndarray]:
    """`scan_chunk` of one chunk (flat tensors of up to 32 bits, on any device).

    Returns:
        (changed count, lowest class, highest class, classes, gaps, zigzag steps) with the arrays
        on the host, changed elements in position order.
    """
    width = old.element_size() * 8
    if width > 32:
        raise ValueError(f"the device scan supports dtypes up to 32 bits, not {old.dtype}")
    a, b = _unsigned(old, width), _unsigned(new, width)
    pos = torch.nonzero(a != b).reshape(-1)
    if pos.numel() == 0:
        return 0, mask + 1, -1, np.zeros(0, np.uint16), np.zeros(0, np.uint32), np.zeros(0, np.uint64)
    sign, full = 1 << (width - 1), (1 << width) - 1
    ka = torch.where(a[pos] & sign != 0, ~a[pos] & full, a[pos] | sign)
    kb = torch.where(b[pos] & sign != 0, ~b[pos] & full, b[pos] | sign)
    d = (kb - ka) & full
    steps = torch.where(d < sign, 2 * d, 2 * (full - d) + 1)
    if mask == 0:
        cls, ranks = torch.zeros_like(pos), pos
    else:
        classes = (a >> shift) & mask
        order = torch.argsort(classes, stable=True)
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(order.numel(), device=order.device)
        sizes = torch.bincount(classes, minlength=mask + 1)
        cls = classes[pos]
        ranks = inverse[pos] - (torch.cumsum(sizes, 0) - sizes)[cls]
        del classes, order, inverse
    group = torch.argsort(cls, stable=True)  # by class, position order within a class
    r, c = ranks[group], cls[group]
    prev = torch.full_like(r, -1)
    prev[1:] = torch.where(c[1:] == c[:-1], r[:-1], -1)
    gaps = torch.empty_like(r)
    gaps[group] = r - prev - 1
    return (pos.numel(), int(cls.min()), int(cls.max()), cls.cpu().numpy().astype(np.uint16),
            gaps.cpu().numpy().astype(np.uint32), steps.cpu().numpy().astype(np.uint64))


def changed_positions(old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """Flat positions (int64) where the bit patterns differ, computed where `old` lives."""
    width = old.element_size() * 8
    if width > 32 and old.device.type != "cpu":
        old, new = old.cpu(), new.cpu()
    flat_old = old.detach().contiguous().reshape(-1)
    flat_new = new.detach().to(old.device).contiguous().reshape(-1)
    if flat_old.dtype == torch.bool:
        flat_old, flat_new = flat_old.view(torch.uint8), flat_new.view(torch.uint8)
    elif flat_old.is_floating_point():
        flat_old, flat_new = flat_old.view(_INT_OF[width // 8]), flat_new.view(_INT_OF[width // 8])
    return torch.nonzero(flat_old != flat_new).reshape(-1)


# -- where a state lives: the seam between host and device ---------------------------------------------
# The publisher and the reader ask `on_host` which path a tensor takes and copy device tensors to the host
# only through `to_host`, so the device path runs (and is counted) on CPU tensors in tests by answering
# `on_host` with False.


def on_host(t: torch.Tensor) -> bool:
    """Whether `t` is in host memory, where numpy views and the compiled kernels work on it in place."""
    return t.device.type == "cpu"


def to_host(t: torch.Tensor) -> torch.Tensor:
    """A host copy of `t` (always a copy, never a view): every device-to-host copy of the publisher and
    the reader goes through here."""
    return t.detach().to("cpu", copy=True)


def host_view(state: Mapping[str, torch.Tensor], names: Iterable[str]) -> dict[str, torch.Tensor]:
    """`names` of `state` readable on the host: host tensors as they are, device tensors copied."""
    return {n: state[n] if on_host(state[n]) else to_host(state[n]) for n in names}


def synchronize(tensors: Iterable[torch.Tensor]) -> None:
    """Wait until the work queued on the devices holding `tensors` is done (copies are launched
    asynchronously on a GPU: a timer stopped before this measures only the launch)."""
    for device in {t.device for t in tensors if not on_host(t)}:
        if device.type == "cpu":
            continue
        sync = getattr(getattr(torch, "accelerator", None), "synchronize", None)
        (sync or getattr(torch, device.type).synchronize)(device)


def write_at(t: torch.Tensor, positions: np.ndarray | None, values: np.ndarray) -> torch.Tensor:
    """Write the bit patterns `values` at flat `positions` of `t` (None: all of it) with torch ops, where
    `t` lives; returns the values that were there, on `t`'s device (for `restore_at`)."""
    flat = t.view(-1).view(_INT_OF[t.element_size()]) if t.dtype != torch.bool else t.view(-1).view(torch.uint8)
    new = torch.from_numpy(values.view(_NP_INT_OF[values.itemsize])).to(t.device)
    if positions is None:
        old = flat.clone()
        flat.copy_(new)
        return old
    index = torch.from_numpy(positions.astype(np.int64, copy=False)).to(t.device)
    old = flat.index_select(0, index)
    flat.index_copy_(0, index, new)
    return old


def restore_at(t: torch.Tensor, positions: np.ndarray | None, old: torch.Tensor) -> None:
    """Put back what `write_at` returned."""
    flat = t.view(-1).view(old.dtype)
    if positions is None:
        flat.copy_(old)
    else:
        flat.index_copy_(0, torch.from_numpy(positions.astype(np.int64, copy=False)).to(t.device), old)


_NP_INT_OF = {1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}


@njit(nogil=True, cache=True)
def _scatter(flat, positions, values, saved):  # pragma: no cover - compiled
    for j in range(positions.size):
        saved[j] = flat[positions[j]]
        flat[positions[j]] = values[j]


def scatter(flat: np.ndarray, positions: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Write `values` at `positions` of `flat` in place; returns the values that were there (for undo).

    Positions must be unique and in range (the codecs check this before anything is written).
    """
    saved = np.empty(positions.size, flat.dtype)
    _scatter(flat, positions, values, saved)
    return saved

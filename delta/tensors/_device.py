"""The seam between host and device tensors: which path a tensor takes, and every copy across.

Tensors in host memory take the compiled host path (numpy views, numba kernels, one chunk per thread).
Tensors anywhere else (a GPU) take the device path: whole-tensor torch ops on the device, with only the
changed elements crossing to the host (`delta.codecs._device_scan`, `hashing`). `DELTA_DEVICE_PATH=1`
sends host tensors down the device path too, so that the tests and `bench.codec` run it on machines
without a GPU: the same torch code, on CPU tensors.

Every copy between host and device goes through `to_host`, `to_host_all` or `to_device`, so that tests
can count them (host round trips) by replacing these functions. Host memory for those copies comes from
`POOL` through a `Staging`: pinning memory costs about as much as the copy it speeds up (docs/benchmarks.md),
so buffers are kept between calls.
"""

from __future__ import annotations

import os
import threading
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import torch
from numba import njit

#: Read once: `DELTA_DEVICE_PATH=1` (or any value but 0 and empty) runs the device path on host tensors.
DEVICE_PATH = os.environ.get("DELTA_DEVICE_PATH", "") not in ("", "0")
#: Elements per slice when a whole tensor is hashed on the device (bounds its int64 temporaries).
SEGMENT = 1 << 26
#: Elements scanned together on the device: small tensors of one dtype are concatenated up to this, a
#: larger tensor is scanned alone (its temporaries, ~16 bytes per element, are bounded by its own size).
GROUP = 1 << 24

_INT_OF = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


#: Bytes of idle staging buffers `POOL` keeps between calls (more is freed as it comes back).
POOL_BYTES = 2 << 30
_SMALLEST = 1 << 16


class PinnedPool:
    """Host buffers for copies to and from a device, reused by size class (powers of two): taken by a `Staging`,
    given back when it closes, at most `limit` bytes kept idle. Pinned (page-locked) where a GPU is the other
    side, ordinary memory for the device path on CPU tensors. Thread safe."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._free: dict[tuple[int, bool], list[torch.Tensor]] = defaultdict(list)
        self._idle = 0
        self._lock = threading.Lock()
        self.made = 0  # buffers allocated so far (the tests read it: reuse keeps it flat)

    def take(self, nbytes: int, pinned: bool) -> torch.Tensor:
        """A uint8 buffer of at least `nbytes`."""
        size = max(_SMALLEST, 1 << max(0, nbytes - 1).bit_length())
        with self._lock:
            free = self._free[(size, pinned)]
            if free:
                self._idle -= size
                return free.pop()
            self.made += 1
        return torch.empty(size, dtype=torch.uint8, pin_memory=pinned)

    def give(self, buf: torch.Tensor) -> None:
        """Take back a buffer from `take` (its last copy must be complete)."""
        size = buf.numel()
        with self._lock:
            if self._idle + size <= self.limit:
                self._free[(size, buf.is_pinned())].append(buf)
                self._idle += size

    def clear(self) -> None:
        """Free every idle buffer."""
        with self._lock:
            self._free.clear()
            self._idle = 0


POOL = PinnedPool(POOL_BYTES)


class Staging:
    """The staging buffers of one diff or apply (or one group of it): taken from `POOL` as needed, all given back
    by `close` (or the end of a `with` block), once the copies that use them are complete."""

    def __init__(self, pool: PinnedPool | None = None) -> None:
        self.pool = pool or POOL
        self._held: list[torch.Tensor] = []

    def tensor(self, shape: Sequence[int], dtype: torch.dtype, pinned: bool) -> torch.Tensor:
        """An uninitialised host tensor in a staging buffer."""
        count = 1
        for n in shape:
            count *= n
        nbytes = count * torch.empty((), dtype=dtype).element_size()
        buf = self.pool.take(nbytes, pinned)
        self._held.append(buf)
        return buf[:nbytes].view(dtype).reshape(tuple(shape))

    def empty(self, count: int, dtype: type[np.generic] | np.dtype, pinned: bool) -> np.ndarray:
        """An uninitialised flat numpy array in a staging buffer."""
        dtype = np.dtype(dtype)
        buf = self.tensor((count * dtype.itemsize,), torch.uint8, pinned)
        return buf.numpy().view(dtype)

    def close(self) -> None:
        for buf in self._held:
            self.pool.give(buf)
        self._held.clear()

    def __enter__(self) -> Staging:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def on_host(t: torch.Tensor) -> bool:
    """Whether `t` takes the host path: in host memory, and the device path not forced."""
    return t.device.type == "cpu" and not DEVICE_PATH


def int_view(t: torch.Tensor) -> torch.Tensor:
    """A flat view of a contiguous tensor's bits as a signed integer dtype of its width (uint8 for 1 byte)."""
    flat = t.detach().reshape(-1)
    if flat.dtype == torch.bool:
        return flat.view(torch.uint8)
    want = _INT_OF[flat.element_size()]
    return flat if flat.dtype == want else flat.view(want)


def to_host(t: torch.Tensor) -> torch.Tensor:
    """A host copy of `t` (always a copy, never a view)."""
    return t.detach().to("cpu", copy=True)


def to_host_all(tensors: Sequence[torch.Tensor], staging: Staging | None = None) -> list[np.ndarray]:
    """Host copies of several device tensors, as numpy arrays, in one round trip: copied into pinned
    memory without waiting, then one wait (on a CPU device: plain copies). With `staging`, the copies live in
    its buffers (valid until it closes); without, in fresh memory."""
    out = []
    for t in tensors:
        cpu = t.device.type == "cpu"
        if staging is not None:
            host = staging.tensor(t.shape, t.dtype, pinned=not cpu)
        elif cpu:
            out.append(t.detach().clone())
            continue
        else:
            host = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
        host.copy_(t.detach(), non_blocking=not cpu)
        out.append(host)
    synchronize(tensors)
    return [t.numpy() for t in out]


def to_device(arrays: Sequence[np.ndarray], device: torch.device) -> list[torch.Tensor]:
    """Device copies of host arrays (one upload each, not waited for: later ops on the device queue after it)."""
    out = []
    for a in arrays:
        t = torch.from_numpy(np.ascontiguousarray(a))
        if device.type == "cpu":
            out.append(t.clone())
        else:  # staged arrays are pinned already: `pin_memory` returns them as they are
            out.append(t.pin_memory().to(device, non_blocking=True))
    return out


def host_view(state: Mapping[str, torch.Tensor], names: Iterable[str]) -> dict[str, torch.Tensor]:
    """`names` of `state` readable on the host: host tensors as they are, device tensors copied."""
    return {n: state[n] if state[n].device.type == "cpu" else to_host(state[n]) for n in names}


def synchronize(tensors: Iterable[torch.Tensor]) -> None:
    """Wait until the work queued on the devices holding `tensors` is done (copies are launched
    asynchronously on a GPU: a timer stopped before this measures only the launch)."""
    for device in {t.device for t in tensors}:
        if device.type == "cpu":
            continue
        sync = getattr(getattr(torch, "accelerator", None), "synchronize", None)
        (sync or getattr(torch, device.type).synchronize)(device)


# -- writes: in place, undoable ------------------------------------------------------------------------


def write_at(t: torch.Tensor, positions: torch.Tensor | None, values: torch.Tensor) -> torch.Tensor:
    """Write bit patterns `values` (an integer tensor of `t`'s width) at flat `positions` of `t` (None: all of
    it) with torch ops where `t` lives; returns what was there (for `restore_at`)."""
    flat = int_view(t)
    new = values.to(t.device).view(flat.dtype)
    if positions is None:
        old = flat.clone()
        flat.copy_(new)
        return old
    index = positions.to(t.device)
    old = flat.index_select(0, index)
    flat.index_copy_(0, index, new)
    return old


def restore_at(t: torch.Tensor, positions: torch.Tensor | None, old: torch.Tensor) -> None:
    """Put back what `write_at` returned."""
    flat = int_view(t)
    if positions is None:
        flat.copy_(old)
    else:
        flat.index_copy_(0, positions.to(t.device), old)


@njit(nogil=True, cache=True)
def _scatter(flat, positions, values, saved):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled: numba types it
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

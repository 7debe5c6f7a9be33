"""The element-sum state hash (`sum128`): one hash per element, summed, so that it can be updated from the
changes alone, computed where the tensors live, and split across ranks however they are cut.

Element `i` (its flat index in the full tensor) holding bit pattern `v` hashes, in each of two lanes, to

    mix(((i ^ seed) * K) ^ v)          mod 2**64, `mix` = murmur3's 64-bit finaliser (a bijection)

with the lane's `seed` taken from the tensor's name, dtype and full shape (`TensorKey.seeds`). A tensor's
two sums (`Sums`) are the lanes' sums mod 2**64, so:

- changing elements moves the sums by sum(h(i, new)) - sum(h(i, old)) over the changed elements alone;
- a tensor cut into pieces (ranks' shards, along any dimension) sums to the same as the whole tensor, as
  long as every piece hashes its elements at their index in the full tensor (`TensorKey.base/block/skip`);
- the same arithmetic runs in compiled host code (numba, uint64) and in torch integer ops on any device
  (int64, which wraps the same way), bit for bit; sums of int64 tensors are taken as two 32-bit halves so
  that no reduction relies on overflow.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
import xxhash
from numba import njit

from .._cores import in_threads, slices, typed

MASK = (1 << 64) - 1
K = 0x9E3779B97F4A7C15
C1 = 0xFF51AFD7ED558CCD
C2 = 0xC4CEB9FE1A85EC53
_NO_BLOCK = 1 << 62  # `block` of a tensor with no skips: every index is below it

#: Two lanes' sums mod 2**64.
Sums = tuple[int, int]
ZERO: Sums = (0, 0)


def add(a: Sums, b: Sums) -> Sums:
    return (a[0] + b[0]) & MASK, (a[1] + b[1]) & MASK


def sub(a: Sums, b: Sums) -> Sums:
    return (a[0] - b[0]) & MASK, (a[1] - b[1]) & MASK


@dataclass(frozen=True)
class TensorKey:
    """What a tensor's elements hash under: the full tensor it is (part of) and where its elements sit in it.

    Element `j` of this tensor (flat, row-major) is element `base + j + (j // block) * skip` of the full
    tensor: a whole tensor has base 0 and no block; a piece cut along dimension `d` from `start` has
    `base = start * inner`, `block = length * inner` and `skip = (full_d - length) * inner`, where `inner`
    is the product of the dimensions after `d`.

    Attributes:
        name: The full tensor's name.
        dtype: Its dtype name.
        shape: Its full shape.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    base: int = 0
    block: int = 0
    skip: int = 0
    seeds: tuple[int, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        digest = xxhash.xxh3_128_intdigest(f"{self.name}\0{self.dtype}\0{self.shape}".encode())
        object.__setattr__(self, "seeds", (digest >> 64, digest & MASK))

    @classmethod
    def piece(cls, name: str, dtype: str, shape: tuple[int, ...], dim: int, start: int, stop: int) -> TensorKey:
        """The key of the range [start, stop) along `dim` of the full tensor `name` of `shape`."""
        inner = 1
        for n in shape[dim + 1 :]:
            inner *= n
        length = stop - start
        return cls(name, dtype, tuple(shape), start * inner, length * inner, (shape[dim] - length) * inner)

    @property
    def _block(self) -> int:
        return self.block if self.block > 0 else _NO_BLOCK


# -- host: compiled ------------------------------------------------------------------------------------

_K, _C1, _C2 = np.uint64(K), np.uint64(C1), np.uint64(C2)
_S33 = np.uint64(33)


@njit(inline="always")
def _mix(x):  # pragma: no cover - compiled
    x ^= x >> _S33
    x *= _C1
    x ^= x >> _S33
    x *= _C2
    x ^= x >> _S33
    return x


@njit(inline="always")
def element_hash(g, v, seed):  # pragma: no cover - compiled
    """One lane's hash of the element at full index `g` (uint64) with bits `v` (uint64)."""
    return _mix(((g ^ seed) * _K) ^ v)


@njit(inline="always")
def _index(j, base, block, skip):  # pragma: no cover - compiled
    return np.uint64(base + j + (j // block) * skip)


@njit(nogil=True, cache=True)
def _sum_run(a, lo, hi, offset, s0, s1):  # pragma: no cover - compiled
    """Sums of a[lo:hi], element i at full index offset + i."""
    t0, t1 = np.uint64(0), np.uint64(0)
    for i in range(lo, hi):
        g = np.uint64(offset + i)
        v = np.uint64(a[i])
        t0 += element_hash(g, v, s0)
        t1 += element_hash(g, v, s1)
    return t0, t1


@njit(nogil=True, cache=True)
def _sum_range(a, lo, hi, base, block, skip, s0, s1):  # pragma: no cover - compiled
    t0, t1 = np.uint64(0), np.uint64(0)
    j = np.int64(lo)
    while j < hi:  # run by run of consecutive full indices: one division per run, none per element
        q = j // block
        end = min(np.int64(hi), (q + 1) * block)
        r0, r1 = _sum_run(a, j, end, base + q * skip, s0, s1)
        t0 += r0
        t1 += r1
        j = end
    return t0, t1


@njit(nogil=True, cache=True)
def _sum_changes(positions, old, new, base, block, skip, s0, s1):  # pragma: no cover - compiled
    """sum(h(new)) - sum(h(old)) over `positions` (flat indices of this tensor), per lane, mod 2**64."""
    t0, t1 = np.uint64(0), np.uint64(0)
    for j in range(positions.size):
        g = _index(np.int64(positions[j]), base, block, skip)
        a, b = np.uint64(old[j]), np.uint64(new[j])
        t0 += element_hash(g, b, s0) - element_hash(g, a, s0)
        t1 += element_hash(g, b, s1) - element_hash(g, a, s1)
    return t0, t1


HOST_SEGMENT = 1 << 22  # elements per row when host tensors are summed on several threads


@njit(nogil=True, cache=True)
def _sum_rows(arrays, rows, ikeys, seeds, out):  # pragma: no cover - compiled
    """Sums of rows (tensor, lo, hi) of `arrays` into `out` (one row each)."""
    for r in range(rows.shape[0]):
        t = rows[r, 0]
        out[r, 0], out[r, 1] = _sum_range(
            arrays[t], rows[r, 1], rows[r, 2], ikeys[t, 0], ikeys[t, 1], ikeys[t, 2], seeds[t, 0], seeds[t, 1]
        )


def host_sums(pairs: Sequence[tuple[TensorKey, np.ndarray]], threads: int) -> list[Sums]:
    """The sums of several tensors' flat unsigned bit views: segments of every tensor of one dtype cut into one
    slice per thread, one compiled call each."""
    totals = [ZERO] * len(pairs)
    by_dtype: dict[np.dtype, list[int]] = {}
    for t, (_, flat) in enumerate(pairs):
        if flat.size:
            by_dtype.setdefault(flat.dtype, []).append(t)
    for members in by_dtype.values():
        sizes = np.array([pairs[t][1].size for t in members], np.int64)
        counts = -(-sizes // HOST_SEGMENT)
        member = np.repeat(np.arange(len(members)), counts)
        lo = (np.arange(member.size) - np.repeat(np.cumsum(counts) - counts, counts)) * HOST_SEGMENT
        rows = np.stack([member, lo, np.minimum(lo + HOST_SEGMENT, sizes[member])], axis=1)
        keys = [pairs[t][0] for t in members]
        ikeys = np.array([[k.base, k._block, k.skip] for k in keys], np.int64)
        seeds = np.array([k.seeds for k in keys], np.uint64)
        arrays = typed([pairs[t][1] for t in members])
        out = np.zeros((len(rows), 2), np.uint64)

        def span(a: int, b: int, arrays=arrays, rows=rows, ikeys=ikeys, seeds=seeds, out=out) -> None:
            _sum_rows(arrays, rows[a:b], ikeys, seeds, out[a:b])

        in_threads(span, slices(rows[:, 2] - rows[:, 1], threads), threads)
        for m, t in enumerate(members):
            mine = out[member == m]
            totals[t] = (int(mine[:, 0].sum(dtype=np.uint64)), int(mine[:, 1].sum(dtype=np.uint64)))
    return totals


def host_change_sums(key: TensorKey, positions: np.ndarray, old: np.ndarray, new: np.ndarray) -> Sums:
    """How the sums move when the bits at `positions` go from `old` to `new` (host arrays)."""
    s0, s1 = _sum_changes(
        positions, old, new, key.base, key._block, key.skip, np.uint64(key.seeds[0]), np.uint64(key.seeds[1])
    )
    return int(s0), int(s1)


# -- any device: torch integer ops --------------------------------------------------------------------

_INT_OF = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_LOW31 = (1 << 31) - 1
_LOW32 = (1 << 32) - 1


def _signed(u: int) -> int:
    return u - (1 << 64) if u >= 1 << 63 else u


def as_int64(t: torch.Tensor, width: int) -> torch.Tensor:
    """Bit patterns of a flat tensor as int64 values, zero-extended from `width` bits."""
    if t.dtype == torch.bool:
        t = t.view(torch.uint8)
    elif t.dtype != _INT_OF[width // 8]:
        t = t.view(_INT_OF[width // 8])
    out = t.to(torch.int64)
    if width < 64:
        out &= (1 << width) - 1
    return out


def device_hashes(g: torch.Tensor, v: torch.Tensor, seeds: torch.Tensor | int) -> torch.Tensor:
    """One lane's element hashes (int64, new tensor) of full indices `g` and zero-extended bits `v`; `seeds`
    is the lane's seed (a Python int, or an int64 tensor of one seed per element)."""
    x = torch.bitwise_xor(g, _signed(seeds) if isinstance(seeds, int) else seeds)
    x.mul_(_signed(K)).bitwise_xor_(v)
    for c in (C1, C2):
        x.bitwise_xor_((x >> 33) & _LOW31)
        x.mul_(_signed(c))
    return x.bitwise_xor_((x >> 33) & _LOW31)


def halves(x: torch.Tensor) -> torch.Tensor:
    """(n, 2) int64: the low and high 32 bits of each value (summing these never overflows below 2**31 rows)."""
    return torch.stack([x & _LOW32, (x >> 32) & _LOW32], dim=1)


def from_halves(lo: int, hi: int) -> int:
    """A sum mod 2**64 from the sums of its halves."""
    return (int(lo) + (int(hi) << 32)) & MASK


def device_index(
    j: torch.Tensor, base: torch.Tensor | int, block: torch.Tensor | int, skip: torch.Tensor | int
) -> torch.Tensor:
    """Full indices of flat indices `j` (int64) of tensors keyed by (base, block, skip), per element or shared."""
    return j + (j // block) * skip + base


def key_table(keys: Sequence[TensorKey], device: torch.device) -> torch.Tensor:
    """(n, 5) int64 on `device`: base, block, skip and the two seeds of each key, for per-element gathers."""
    rows = [[k.base, k._block, k.skip, _signed(k.seeds[0]), _signed(k.seeds[1])] for k in keys]
    return torch.tensor(rows, dtype=torch.int64).reshape(-1, 5).to(device)


def device_lane_halves(
    j: torch.Tensor, owner: torch.Tensor, table: torch.Tensor, old: torch.Tensor | None, new: torch.Tensor
) -> torch.Tensor:
    """(n, 4) int64 halves of each element's (lane 0, lane 1) hash of `new`, minus that of `old` if given.

    Args:
        j: Flat indices in their tensors (int64).
        owner: Row of `table` (`key_table`) of each element's tensor.
        old, new: Zero-extended bits (int64; `as_int64`).
    """
    rows = table.index_select(0, owner)
    g = device_index(j, rows[:, 0], rows[:, 1], rows[:, 2])
    lanes = []
    for lane in (3, 4):
        h = device_hashes(g, new, rows[:, lane])
        if old is not None:
            h -= device_hashes(g, old, rows[:, lane])
        lanes.append(halves(h))
    return torch.cat(lanes, dim=1)


def sums_of_halves(rows: Sequence[int]) -> Sums:
    """Sums from one (lane 0 low, lane 0 high, lane 1 low, lane 1 high) row of summed halves."""
    return from_halves(rows[0], rows[1]), from_halves(rows[2], rows[3])


def sums_of_halves_array(rows: np.ndarray) -> np.ndarray:
    """`sums_of_halves` of every row of an (n, 4) int64 array, as (n, 2) uint64 (wrapping like the lanes)."""
    halves_ = rows.astype(np.uint64).reshape(-1, 2, 2)
    return halves_[:, :, 0] + (halves_[:, :, 1] << np.uint64(32))


def kernel_key(key: TensorKey | None) -> tuple:
    """A key as the compiled scans take it: (base, block, skip, seed 0, seed 1); None hashes under zeros (the
    caller ignores the result)."""
    if key is None:
        return np.int64(0), np.int64(_NO_BLOCK), np.int64(0), np.uint64(0), np.uint64(0)
    return (
        np.int64(key.base),
        np.int64(key._block),
        np.int64(key.skip),
        np.uint64(key.seeds[0]),
        np.uint64(key.seeds[1]),
    )

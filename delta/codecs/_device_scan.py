"""The chunked codecs' scans as whole-tensor torch work on the device that holds the state.

Where the host path (`_kernels`) walks each chunk in compiled code, here every step is one op over a whole group of
tensors (one tensor, or small tensors of one dtype up to `_device.GROUP` elements), whatever the number of chunks:

- writer (`scan`): compare, `nonzero`, the class of every element, one stable sort of the classes; a changed element's
  rank in its (chunk, class) is its place in the sorted order minus where its class's run enters its chunk (binary
  search). Only the changes (ordered by chunk, class, rank, with gaps and ULP steps) cross to the host, which codes
  them exactly as the host scan's table (`_found.Found`): the bytes are the same.
- reader (`locate`): the same sort of the old tensor's classes places the r-th change of class c at (where c's run
  enters the chunk) + r; new values are computed and the hash moved before anything is written.

Plain torch: on CPU tensors (`DELTA_DEVICE_PATH=1`) it is the same code, tested bit for bit against the host path."""

from __future__ import annotations

import contextvars
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch
from tqdm import tqdm

from .._cores import in_threads, slices
from .._stages import stage
from ..tensors import _device, _groups, _sumhash
from ..tensors._groups import UINT, Group, flat, owner
from ..tensors._sumhash import Sums, TensorKey
from . import _found
from ._found import Found
from ._models import Counts


def _class_runs(a: torch.Tensor, shift: int, mask: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(classes of every element, sorted keys): the keys `class * N + position` of every element in
    ascending order (one stable sort of the classes), N the group's size."""
    classes = (a >> shift) & mask
    ordered, order = torch.sort(classes, stable=True)
    order.add_(ordered, alpha=a.numel())  # in place: the sorted keys, no second int64 buffer
    return classes, order


def _steps(av: torch.Tensor, bv: torch.Tensor, width: int) -> torch.Tensor:
    """Zigzag ULP steps from old to new bits (int64, zero-extended `width`-bit patterns): the host scan's
    `_step`, as int64 arithmetic that wraps like uint64."""
    sign, full = (1 << (width - 1)), (1 << width) - 1
    if width == 64:
        sign, full = -(1 << 63), -1
    ka = torch.where(av & sign != 0, ~av & full, av | sign)
    kb = torch.where(bv & sign != 0, ~bv & full, bv | sign)
    d = (kb - ka) & full
    if width < 64:
        d = (d << (64 - width)) >> (64 - width)  # sign-extend the width-bit difference
    return (d << 1) ^ (d >> 63)


def _unstep(av: torch.Tensor, steps: torch.Tensor, width: int) -> torch.Tensor:
    """New bits from old bits and zigzag steps (inverse of `_steps`; int64)."""
    sign, full = (1 << (width - 1)), (1 << width) - 1
    if width == 64:
        sign, full = -(1 << 63), -1
    half = (steps >> 1) & ((1 << 63) - 1)
    d = torch.where(steps & 1 != 0, full - half, half)  # -(half + 1) mod 2**width, or half
    k = (torch.where(av & sign != 0, ~av & full, av | sign) + d) & full
    return torch.where(k & sign != 0, k & ~sign & full, ~k & full)


def _narrow(v: torch.Tensor, dtype: torch.dtype, width: int) -> torch.Tensor:
    """Zero-extended `width`-bit patterns (int64) back in the integer dtype of that width, bit for bit."""
    if dtype != torch.uint8 and width < 64:
        v = (v << (64 - width)) >> (64 - width)  # the signed value of those bits: converts exactly
    return v.to(dtype)


def scan(
    old: Mapping[str, torch.Tensor],
    new: Mapping[str, torch.Tensor],
    group: Group,
    shift: int,
    mask: int,
    keys: Mapping[str, TensorKey] | None,
    staging: _device.Staging | None = None,
) -> tuple[Found, np.ndarray | None]:
    """The writer's scan of one group on its device: a bounded number of torch ops and one copy to the host
    (into `staging`'s buffers when given), of 2 + 4 + the element size bytes per change and a few per chunk.

    Returns the group's changes on the host, ordered (member, chunk, class, rank), as a `Found` whose TENSOR
    column holds the member of the group; with `keys`, also per member how its tensor's element sums move
    ((members, 2) uint64).
    """
    with stage("scan"):
        a, b = flat(old, group), flat(new, group)
        width = a.element_size() * 8
        device = a.device
        offsets, chunk_base = group.offsets, group.chunk_base
        pos = torch.nonzero(a != b).reshape(-1)
        tid = owner(group, pos, offsets)
        off = torch.from_numpy(offsets).to(device)
        local = pos - off[tid]
        k = local // group.chunk
        gchunk = torch.from_numpy(chunk_base).to(device)[tid] + k
        if mask:
            classes, keys_sorted = _class_runs(a, shift, mask)
            c = classes[pos].to(torch.int64)
            del classes
            n = a.numel()
            rank = torch.searchsorted(keys_sorted, c * n + pos) - torch.searchsorted(
                keys_sorted, c * n + (pos - local + k * group.chunk)
            )
            del keys_sorted
            order = torch.argsort(gchunk * (mask + 1) + c, stable=True)  # (chunk, class), position order within
            pos, tid, local, gchunk, c, rank = (x[order] for x in (pos, tid, local, gchunk, c, rank))
            same = (gchunk[1:] == gchunk[:-1]) & (c[1:] == c[:-1])
        else:
            c = torch.zeros_like(pos)
            rank = local - k * group.chunk
            same = gchunk[1:] == gchunk[:-1]
        previous = torch.full_like(rank, -1)
        previous[1:] = torch.where(same, rank[:-1], -1)
        gaps = rank - previous - 1
        av, bv = _sumhash.as_int64(a[pos], width), _sumhash.as_int64(b[pos], width)
        steps = _steps(av, bv, width)
        # Per chunk with changes: its number, its changes, its lowest and highest class (classes ascend in a chunk).
        ids, per = torch.unique_consecutive(gchunk, return_counts=True)
        ends = torch.cumsum(per, 0)
        lo_hi = torch.stack([c[ends - per], c[ends - 1]], dim=1) if pos.numel() else per.new_zeros((0, 2))
        crossing = [c.to(torch.int16), gaps.to(torch.int32), _narrow(steps, a.dtype, width), ids, per, lo_hi]
    if keys is not None:
        with stage("hash"):
            table = _sumhash.key_table([keys[n] for n in group.names], device)
            per_tensor = torch.zeros(len(group.names), 4, dtype=torch.int64, device=device)
            index = local + torch.tensor(group.starts, dtype=torch.int64).to(device)[tid]  # in the tensor
            per_tensor.index_add_(0, tid, _sumhash.device_lane_halves(index, tid, table, av, bv))
            crossing.append(per_tensor)
    with stage("transfer"):
        host = _device.to_host_all(crossing, staging)
    cls, gaps_h, steps_h = host[0].view(np.uint16), host[1].view(np.uint32), host[2].view(UINT[a.element_size()])
    sums = _sumhash.sums_of_halves_array(host[6]) if keys is not None else None
    return Found(cls, gaps_h, steps_h, _chunk_rows(group, host[3], host[4], host[5]), width), sums


def _chunk_rows(group: Group, ids: np.ndarray, per: np.ndarray, lo_hi: np.ndarray) -> np.ndarray:
    """`Found.rows` of the chunks with changes (TENSOR: the member), from their group-wide numbers `ids`
    (ascending), changes `per` chunk and lowest and highest class."""
    chunk_base = group.chunk_base
    rows = np.empty((len(ids), 6), np.int64)
    rows[:, _found.TENSOR] = np.searchsorted(chunk_base, ids, side="right") - 1
    member = rows[:, _found.TENSOR]
    rows[:, _found.CHUNK] = ids - chunk_base[member] + np.asarray(group.starts, np.int64)[member] // group.chunk
    rows[:, _found.STOP] = np.cumsum(per)
    rows[:, _found.FIRST] = rows[:, _found.STOP] - per
    rows[:, _found.CLASS_LO], rows[:, _found.CLASS_HI] = lo_hi[:, 0], lo_hi[:, 1]
    return rows


def scan_on_device(
    old: Mapping[str, torch.Tensor],
    new: Mapping[str, torch.Tensor],
    names: list[str],
    keys: Mapping[str, TensorKey] | None,
    counts: Counts,
    moved: np.ndarray,
    workers: int,
    staging: _device.Staging,
    progress: str | None,
) -> list[Found]:
    """`scan` of the device tensors among `names` (the diff's tensors, in name order), group by group where they
    live, each group's symbols counted into `counts` on host threads while the device scans the next group; each
    tensor's hash moves added to its row of `moved`; the changes' host copies in `staging` (live until coded);
    `progress`: a bar of that title."""
    index = {n: i for i, n in enumerate(names)}
    found = []
    pending = None

    def count(got: Found) -> None:
        with stage("code"):
            spans = slices(got.rows[:, _found.STOP] - got.rows[:, _found.FIRST], workers)
            in_threads(lambda lo, hi: _count_rows(got, lo, hi, counts), spans, workers)

    on_device = [n for n in names if not _device.on_host(old[n])]
    with ThreadPoolExecutor(1, thread_name_prefix="delta-count") as host_stage:
        for group in tqdm(
            _groups.groups(old, on_device, counts.chunk),
            desc=progress,
            unit="group",
            disable=progress is None or not on_device,
        ):
            shift, mask = counts.classing.field(old[group.names[0]].dtype)
            got, sums = scan(old, new, group, shift, mask, keys, staging)
            tensor = np.array([index[n] for n in group.names], np.int64)
            if sums is not None:
                moved += _found.sum_by(tensor, sums, len(names))
            got.rows[:, _found.TENSOR] = tensor[got.rows[:, _found.TENSOR]]
            found.append(got)
            if pending is not None:
                pending.result()
            pending = host_stage.submit(contextvars.copy_context().run, count, got)
        if pending is not None:
            pending.result()
    return found


def _count_rows(got: Found, lo: int, hi: int, counts: Counts) -> None:
    with counts.borrowed(got.width) as (gap, step, tally):
        _found.count_rows(got.cls, got.gaps, got.steps, got.rows[lo:hi], gap, step, tally)


@dataclass
class Located:
    """One group's decoded changes on the device, per tensor of the group (in its order).

    Attributes:
        positions: Per member: flat positions in its tensor (int64), class by class within each chunk.
        values: New bit patterns (the tensor's integer view dtype).
        sums: Per member, how its tensor's element sums move (when keys were given).
        bad: The first member with a rank beyond its class in the old state (then the rest is empty: the delta
            is for another state).
    """

    positions: list[torch.Tensor]
    values: list[torch.Tensor]
    sums: list[Sums] | None
    bad: int | None = None


@dataclass
class Decoded:
    """One group's changes as the host decoded them (`_decode.decode_rows`), in staging memory.

    Attributes:
        cls, ranks, steps: Per change, per member of the group in order, per chunk ascending, class by class with
            ranks ascending within a class; steps in the tensors' own width.
        chunk_ids, chunk_counts: Per chunk with changes, in that order: its group-wide number and its changes.
        counts: Changes per member.
    """

    cls: np.ndarray
    ranks: np.ndarray
    steps: np.ndarray
    chunk_ids: np.ndarray
    chunk_counts: np.ndarray
    counts: list[int]


def locate(
    old: Mapping[str, torch.Tensor],
    group: Group,
    shift: int,
    mask: int,
    decoded: Decoded,
    keys: Mapping[str, TensorKey] | None,
) -> Located:
    """The reader's inverse of `scan` for one group, on the device holding `old` (read only).

    Returns:
        The changes; `bad` says which tensor has a rank beyond its class in `old` (nothing else then).
    """
    cls, ranks, steps, counts = decoded.cls, decoded.ranks, decoded.steps, decoded.counts
    a = flat(old, group)
    width = a.element_size() * 8
    device = a.device
    offsets, chunk_base = group.offsets, group.chunk_base
    with stage("transfer"):  # as they are: widened on the device
        c, r, z, ids, per = _device.to_device(
            [
                cls.view(np.int16),
                ranks,
                steps.view(steps.dtype.str.replace("u", "i")),
                decoded.chunk_ids.astype(np.int64),
                decoded.chunk_counts.astype(np.int64),
            ],
            device,
        )
    with stage("locate"):
        c = c.to(torch.int64) & 0xFFFF
        r = r.to(torch.int64)
        z = _sumhash.as_int64(z, width)
        within = torch.arange(int(cls.size), dtype=torch.int64, device=device)
        g = ids[torch.searchsorted(torch.cumsum(per, 0), within, right=True)]  # each change's chunk
        tid = owner(group, g, chunk_base)
        off, size = torch.from_numpy(offsets).to(device), torch.tensor(group.sizes, dtype=torch.int64).to(device)
        start = off[tid] + (g - torch.from_numpy(chunk_base).to(device)[tid]) * group.chunk
        end = torch.minimum(start + group.chunk, off[tid] + size[tid])
        if mask:
            _, keys_sorted = _class_runs(a, shift, mask)
            n = a.numel()
            first = torch.searchsorted(keys_sorted, c * n + start)
            bad = r >= torch.searchsorted(keys_sorted, c * n + end) - first
            pos = (keys_sorted[(first + r).clamp_(max=n - 1)] - c * n).clamp_(0, n - 1)  # in range even where bad
            del keys_sorted
        else:
            pos = start + r
            bad = pos >= end
            pos = pos.clamp_(max=a.numel() - 1)
        av = _sumhash.as_int64(a[pos], width)
        bv = _unstep(av, z, width)
        local = pos - off[tid] + torch.tensor(group.starts, dtype=torch.int64).to(device)[tid]  # in the tensor
        crossing = [torch.zeros(len(group.names), dtype=torch.int64, device=device).index_add_(0, tid, bad.long())]
    if keys is not None:
        with stage("hash"):
            table = _sumhash.key_table([keys[n] for n in group.names], device)
            per_tensor = torch.zeros(len(group.names), 4, dtype=torch.int64, device=device)
            per_tensor.index_add_(0, tid, _sumhash.device_lane_halves(local, tid, table, av, bv))
            crossing.append(per_tensor)
    with stage("transfer"):
        host = _device.to_host_all(crossing)
    if host[0].any():
        return Located([], [], None, int(np.flatnonzero(host[0])[0]))
    values = _narrow(bv, a.dtype, width)
    sums = None
    if keys is not None:
        lanes = _sumhash.sums_of_halves_array(host[1])
        sums = [(int(x), int(y)) for x, y in lanes.tolist()]
    return Located(list(torch.split(local, list(counts))), list(torch.split(values, list(counts))), sums)

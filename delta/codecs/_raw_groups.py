"""Codec `raw`'s work a group of tensors at a time, where the tensors live: a few torch ops and one host round
trip per group (`delta.tensors._groups`), however many tensors the group holds.

Tensor by tensor, a GPU diff made small launches and a wait for the hash moves per tensor, and copied each tensor's
changes to unpinned memory on its own: for a model of hundreds of tensors, slower than the scan itself
(docs/benchmarks.md). Here the writer compares a whole group, hashes its changes with one kernel sequence and copies
positions, values, counts and sums across in one wait; the reader sends a group's positions and values up in one
copy each and proves their hash moves in one pass.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import pairwise

import numpy as np
import torch

from .._stages import stage
from ..tensors import _device, _groups, _sumhash
from ..tensors._sumhash import TensorKey


def groups(tensors: Mapping[str, torch.Tensor], names: Sequence[str]) -> list[_groups.Group]:
    """`names` in groups of one dtype and device (chunks play no part in `raw`)."""
    return _groups.groups(tensors, names, 1)


def _hash_moves(
    group: _groups.Group,
    keys: Mapping[str, TensorKey],
    local: torch.Tensor,
    tid: torch.Tensor,
    old: torch.Tensor,
    new: torch.Tensor,
) -> torch.Tensor:
    """(members, 4) int64 halves of each member's hash moves (`_sumhash.device_lane_halves`)."""
    table = _sumhash.key_table([keys[n] for n in group.names], local.device)
    per_tensor = torch.zeros(len(group.names), 4, dtype=torch.int64, device=local.device)
    return per_tensor.index_add_(0, tid, _sumhash.device_lane_halves(local, tid, table, old, new))


def scan(
    old: Mapping[str, torch.Tensor],
    new: Mapping[str, torch.Tensor],
    group: _groups.Group,
    keys: Mapping[str, TensorKey] | None,
    staging: _device.Staging,
) -> tuple[list[np.ndarray], list[np.ndarray], np.ndarray | None]:
    """The changes of one group: per member its positions in its tensor (int32, ascending) and new bits, and
    per member its hash moves ((members, 2) uint64; with keys). Host arrays live in `staging`'s buffers."""
    with stage("scan"):
        a, b = _groups.flat(old, group), _groups.flat(new, group)
        width = a.element_size() * 8
        device = a.device
        pos = torch.nonzero(a != b).reshape(-1)
        tid = _groups.owner(group, pos, group.offsets)
        starts = torch.tensor(group.starts, dtype=torch.int64).to(device)
        local = pos - torch.from_numpy(group.offsets).to(device)[tid] + starts[tid]
        values = b[pos]
        counts = torch.bincount(tid, minlength=len(group.names))
        crossing = [local.to(torch.int32), values, counts]
    if keys is not None:
        with stage("hash"):
            crossing.append(
                _hash_moves(group, keys, local, tid, _sumhash.as_int64(a[pos], width), _sumhash.as_int64(values, width))
            )
    with stage("transfer"):
        host = _device.to_host_all(crossing, staging)
    bounds = np.concatenate([[0], np.cumsum(host[2])])
    split = [slice(int(lo), int(hi)) for lo, hi in pairwise(bounds)]
    sums = _sumhash.sums_of_halves_array(host[3]) if keys is not None else None
    return [host[0][s] for s in split], [host[1][s] for s in split], sums


def place(
    state: Mapping[str, torch.Tensor],
    group: _groups.Group,
    positions: Sequence[np.ndarray],
    values: Sequence[np.ndarray],
    keys: Mapping[str, TensorKey] | None,
) -> tuple[list[torch.Tensor], list[torch.Tensor], np.ndarray | None]:
    """The reader's side for one group: each member's positions (int64, checked in range) and new bits sent to
    the device in one copy each; with keys, the members' hash moves from the old bits there ((members, 2) uint64)."""
    a = _groups.flat(state, group)
    width = a.element_size() * 8
    device = a.device
    counts = [p.size for p in positions]
    with stage("transfer"):
        pos, val = _device.to_device(
            [np.concatenate(positions).astype(np.int64), np.concatenate(values).view(_groups.UINT[a.element_size()])],
            device,
        )
        val = val.view(a.dtype) if val.dtype != a.dtype else val
    local = list(torch.split(pos, counts))
    new = list(torch.split(val, counts))
    if keys is None:
        return local, new, None
    with stage("hash"):
        tid = torch.repeat_interleave(
            torch.arange(len(counts), device=device),
            torch.tensor(counts, dtype=torch.int64).to(device),
            output_size=int(pos.numel()),
        )
        starts = torch.tensor(group.starts, dtype=torch.int64).to(device)
        at = pos - starts[tid] + torch.from_numpy(group.offsets).to(device)[tid]  # in the group
        moves = _hash_moves(group, keys, pos, tid, _sumhash.as_int64(a[at], width), _sumhash.as_int64(val, width))
    with stage("transfer"):
        host = _device.to_host_all([moves])
    return local, new, _sumhash.sums_of_halves_array(host[0])

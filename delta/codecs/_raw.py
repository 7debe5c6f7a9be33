"""Codec `raw`: the TRL blog layout, int32 flat positions and new values, uncompressed.

Kept for interoperability (files from TRL-style writers apply as they are) and as the baseline the
compact codecs are measured against: 4 + itemsize bytes per changed element. Its writer lists the changes of
host tensors a range of chunks per compiled call (`changes_rows`, on the chunks to scan of `_found`), ranges
taken by `workers` threads as the other codecs' scans are; those of device tensors a group at a time where they
live (`_raw_groups`).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Mapping

import numpy as np
import torch
from numba import njit
from tqdm import tqdm

from .._cores import PerThread, in_threads, resolve_workers, slices
from ..errors import DeltaFormatError
from ..tensors import _device, _sumhash
from ..tensors._sumhash import Sums, TensorKey
from ..tensors.bits import DTYPE_NAMES, bits
from . import _raw_groups
from ._base import Change, Codec, Encoded, TensorEntry
from ._found import HI, LO, MEMBER, by_dtype, chunk_size, chunks_of, key_tables, sum_by
from ._kernels import changes_chunk
from ._workspace import Workspace

INT32_MAX = 2**31 - 1


@njit(nogil=True, cache=True)
def changes_rows(a_list, b_list, chunks, ikeys, seeds):  # type: ignore[no-untyped-def]  # pragma: no cover - compiled: numba types it by its arguments
    """The changes of `chunks` (`_found`'s columns MEMBER..HI; tensors of one dtype in `a_list`/`b_list`): their
    positions in their tensor (int32, ascending) and new bits, chunk after chunk, and per chunk its number of
    changes and its hash moves. The outputs have room for every element to change (address space: only the
    pages the changes fill are touched)."""
    n = chunks.shape[0]
    room = 0
    for r in range(n):
        room += chunks[r, HI] - chunks[r, LO]
    positions = np.empty(room, np.int32)
    values = np.empty(room, a_list[0].dtype)
    counts = np.empty(n, np.int64)
    moved = np.empty((n, 2), np.uint64)
    used = 0
    for r in range(n):
        t = chunks[r, MEMBER]
        key = (ikeys[t, 0], ikeys[t, 1], ikeys[t, 2], seeds[t, 0], seeds[t, 1])
        m, moved[r, 0], moved[r, 1] = changes_chunk(
            a_list[t], b_list[t], chunks[r, LO], chunks[r, HI], positions[used:], values[used:], key
        )
        counts[r] = m
        used += m
    return positions[:used], values[:used], counts, moved


def _host_changes(
    old: Mapping[str, torch.Tensor],
    new: Mapping[str, torch.Tensor],
    members: list[str],
    chunk: int,
    keys: Mapping[str, TensorKey] | None,
    workers: int,
) -> Iterator[tuple[str, np.ndarray, np.ndarray, Sums]]:
    """(name, positions, new bits, hash moves) of each changed tensor among `members` (host tensors of one dtype),
    found by one compiled call per range of chunks on `workers` threads."""
    a_bits, b_bits = [bits(old[n].detach()) for n in members], [bits(new[n].detach()) for n in members]
    per_thread = PerThread(a_bits, b_bits)
    chunks = chunks_of(np.array([a.size for a in a_bits], np.int64), chunk)
    ikeys, seeds = key_tables(keys, members)

    def scan(lo: int, hi: int) -> tuple:
        a_list, b_list = per_thread.lists()
        return changes_rows(a_list, b_list, chunks[lo:hi], ikeys, seeds)

    found = in_threads(scan, slices(chunks[:, HI] - chunks[:, LO], workers), workers)
    positions, values, counts, moved = (np.concatenate([f[i] for f in found]) for i in range(4))
    ends = np.cumsum(np.bincount(chunks[:, MEMBER], weights=counts, minlength=len(members)).astype(np.int64))
    sums = sum_by(chunks[:, MEMBER], moved, len(members))
    for t, name in enumerate(members):
        start = int(ends[t - 1]) if t else 0
        if ends[t] > start:
            yield name, positions[start : ends[t]], values[start : ends[t]], (int(sums[t, 0]), int(sums[t, 1]))


class RawCodec(Codec):
    name = "raw"
    form = "indices"
    description = "int32 flat positions + new values, uncompressed (TRL blog layout)"

    def encode(
        self,
        old: Mapping[str, torch.Tensor],
        new: Mapping[str, torch.Tensor],
        names: list[str],
        progress: bool = False,
        workers: int | None = None,
        chunk: int | None = None,
        keys: Mapping[str, TensorKey] | None = None,
        workspace: Workspace | None = None,
    ) -> Encoded:
        """See `Codec.encode`; nothing is kept between calls (`workspace` goes unused)."""
        for name in names:
            if old[name].numel() > INT32_MAX:
                raise ValueError(
                    f"tensor {name!r} has {old[name].numel()} elements; codec 'raw' stores int32 positions"
                )
        chunk = chunk_size(chunk)
        parts: dict[str, list[tuple[np.ndarray, np.ndarray]]] = defaultdict(list)
        moved: dict[str, Sums] = {}
        host = [n for n in names if _device.on_host(old[n])]
        if host:
            workers = resolve_workers(workers)
            for members in by_dtype(old, host).values():
                for name, positions, values, sums in _host_changes(old, new, members, chunk, keys, workers):
                    parts[name].append((positions, values))
                    moved[name] = sums
        on_device = [n for n in names if not _device.on_host(old[n])]
        with _device.Staging() as staging:
            for group in tqdm(
                _raw_groups.groups(old, on_device), desc="diff raw", unit="group", disable=not progress or not on_device
            ):
                found_positions, found_values, found_sums = _raw_groups.scan(old, new, group, keys, staging)
                for t, name in enumerate(group.names):
                    if found_positions[t].size:  # copied out of the staging buffers, which go back to the pool
                        parts[name].append((found_positions[t].copy(), found_values[t].copy()))
                        if found_sums is not None:  # a tensor in parts: each part's moves add up
                            part = (int(found_sums[t, 0]), int(found_sums[t, 1]))
                            moved[name] = _sumhash.add(moved[name], part) if name in moved else part
        entries: list[TensorEntry] = []
        blobs: dict[str, torch.Tensor] = {}
        for name in sorted(parts):
            pieces = parts[name]
            positions, values = (
                pieces[0]
                if len(pieces) == 1
                else (np.concatenate([p for p, _ in pieces]), np.concatenate([v for _, v in pieces]))
            )
            blobs[f"{name}.indices"] = torch.from_numpy(positions)
            blobs[f"{name}.values"] = torch.from_numpy(values).view(new[name].dtype)
            entries.append(
                TensorEntry(name, DTYPE_NAMES[new[name].dtype], tuple(new[name].shape), "indices", positions.size)
            )
        return Encoded(entries, blobs, moved if keys is not None else None)

    def stream_names(self, entries: tuple[TensorEntry, ...]) -> set[str]:
        return {
            f"{e.name}.{kind}"
            for e in entries
            for kind in (("values",) if e.form == "dense" else ("indices", "values"))
        }

    def check_streams(self, entries: tuple[TensorEntry, ...], blobs: Mapping[str, torch.Tensor]) -> None:
        for e in entries:
            idx, val = blobs[f"{e.name}.indices"], blobs[f"{e.name}.values"]
            if idx.dtype != torch.int32 or tuple(idx.shape) != (e.changed,):
                raise DeltaFormatError(
                    f"indices are {idx.dtype} {tuple(idx.shape)}, the header needs int32 ({e.changed},)", tensor=e.name
                )
            if DTYPE_NAMES.get(val.dtype) != e.dtype or tuple(val.shape) != (e.changed,):
                raise DeltaFormatError(
                    f"values are {val.dtype} {tuple(val.shape)}, the header needs {e.dtype} ({e.changed},)",
                    tensor=e.name,
                )

    def _streams(self, entry: TensorEntry, blobs: Mapping[str, torch.Tensor]) -> tuple[np.ndarray | None, torch.Tensor]:
        """(positions as int64, values) of one entry, every count and dtype checked; positions None for `dense`."""
        val = blobs.get(f"{entry.name}.values")
        if entry.form == "dense":
            if val is None or DTYPE_NAMES.get(val.dtype) != entry.dtype or tuple(val.shape) != entry.shape:
                raise DeltaFormatError(
                    f"the whole tensor must be stored as {entry.dtype} {entry.shape}", tensor=entry.name
                )
            return None, val
        idx = blobs.get(f"{entry.name}.indices")
        if idx is None or val is None:
            raise DeltaFormatError("indices or values missing", tensor=entry.name)
        if idx.dtype not in (torch.int32, torch.int64) or idx.dim() != 1:
            raise DeltaFormatError(
                f"indices must be a 1-D int32 tensor, got {idx.dtype} {tuple(idx.shape)}", tensor=entry.name
            )
        if DTYPE_NAMES.get(val.dtype) != entry.dtype or val.dim() != 1:
            raise DeltaFormatError(
                f"values are {val.dtype} {tuple(val.shape)}, the header says {entry.dtype}, 1-D", tensor=entry.name
            )
        if val.numel() != idx.numel() or idx.numel() != entry.changed:
            raise DeltaFormatError(
                f"{idx.numel()} indices and {val.numel()} values, the header says {entry.changed} changed elements",
                tensor=entry.name,
            )
        pos = idx.numpy().astype(np.int64)
        if pos.size > 1 and not (np.diff(pos) > 0).all():
            raise DeltaFormatError("positions are not strictly increasing", tensor=entry.name)
        if pos.size and pos[0] < 0:
            raise DeltaFormatError("positions are negative", tensor=entry.name)
        return pos, val

    def _all_streams(self, entries: tuple[TensorEntry, ...], blobs: Mapping[str, torch.Tensor]) -> None:
        if set(blobs) != self.stream_names(entries):
            extra = sorted(set(blobs) - self.stream_names(entries))
            raise DeltaFormatError(f"streams not listed by the header: {extra[:5]}" if extra else "streams missing")

    def decode(
        self,
        entries: tuple[TensorEntry, ...],
        blobs: Mapping[str, torch.Tensor],
        state: Mapping[str, torch.Tensor],
        workers: int | None = None,
        keys: Mapping[str, TensorKey] | None = None,
        workspace: Workspace | None = None,
    ) -> list[Change]:
        """See `Codec.decode`: copies on the calling thread alone, whatever `workers` (checked); nothing kept."""
        resolve_workers(workers)
        self._all_streams(entries, blobs)
        changes: dict[str, Change] = {}
        on_device: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for entry in entries:
            target = state[entry.name]
            if DTYPE_NAMES.get(target.dtype) != entry.dtype:
                raise DeltaFormatError(f"values are {entry.dtype}, the tensor is {target.dtype}", tensor=entry.name)
            pos, val = self._streams(entry, blobs)
            if pos is None:
                if tuple(target.shape) != entry.shape:
                    raise DeltaFormatError(
                        f"the file holds {entry.shape}, the tensor is {tuple(target.shape)}", tensor=entry.name
                    )
                changes[entry.name] = Change(entry.name, None, bits(val.contiguous()).reshape(-1).copy())
                continue
            if pos.size and pos[-1] >= target.numel():
                raise DeltaFormatError(f"positions out of range [0, {target.numel()})", tensor=entry.name)
            if _device.on_host(target):
                changes[entry.name] = Change(entry.name, pos, bits(val.contiguous()).copy())
            else:
                on_device[entry.name] = (pos, bits(val.contiguous()))
        if on_device:
            changes.update(self._place_on_device(state, on_device, keys))
        return [changes[e.name] for e in entries]

    @staticmethod
    def _place_on_device(
        state: Mapping[str, torch.Tensor],
        found: dict[str, tuple[np.ndarray, np.ndarray]],
        keys: Mapping[str, TensorKey] | None,
    ) -> dict[str, Change]:
        """Send the changes of device tensors up a group at a time, their hash moves proven there (with keys)."""
        parts: dict[str, list[tuple[torch.Tensor, torch.Tensor, Sums | None]]] = defaultdict(list)
        for group in _raw_groups.groups(state, sorted(found)):
            member_positions: list[np.ndarray] = []
            member_values: list[np.ndarray] = []
            for name, start, size in zip(group.names, group.starts, group.sizes, strict=True):  # its part of the tensor
                pos, val = found[name]
                lo, hi = np.searchsorted(pos, [start, start + size])
                member_positions.append(pos[lo:hi])
                member_values.append(val[lo:hi])
            local, new, group_sums = _raw_groups.place(state, group, member_positions, member_values, keys)
            for t, name in enumerate(group.names):
                parts[name].append(
                    (local[t], new[t], None if group_sums is None else (int(group_sums[t, 0]), int(group_sums[t, 1])))
                )
        changes = {}
        for name, pieces in parts.items():
            sums = None
            if keys is not None:
                sums = pieces[0][2]
                for _, _, moved in pieces[1:]:
                    assert sums is not None and moved is not None  # with keys, every part carries its sums
                    sums = _sumhash.add(sums, moved)
            positions, values = (
                (pieces[0][0], pieces[0][1])
                if len(pieces) == 1
                else (torch.cat([p for p, _, _ in pieces]), torch.cat([v for _, v, _ in pieces]))
            )
            changes[name] = Change(name, positions, values, sums)
        return changes

    def check(
        self,
        entries: tuple[TensorEntry, ...],
        blobs: Mapping[str, torch.Tensor],
        workers: int | None = None,
        foreign: bool = False,
    ) -> str:
        self._all_streams(entries, blobs)
        for entry in entries:
            pos, _ = self._streams(entry, blobs)
            if pos is not None and pos.size and not foreign and pos[-1] >= entry.numel:
                raise DeltaFormatError(f"positions out of range [0, {entry.numel})", tensor=entry.name)
        if entries and all(e.form == "dense" for e in entries):
            return f"{len(entries)} whole tensors, of the shapes and dtypes the file gives"
        where = "not negative (the file gives no shapes)" if foreign else "inside their tensor"
        return (
            f"{len(entries)} tensors, with positions strictly increasing and {where}, and one value of the "
            "table's dtype per position"
        )

    def tensor_bytes(self, entries: tuple[TensorEntry, ...], blobs: Mapping[str, torch.Tensor]) -> dict[str, int]:
        self._all_streams(entries, blobs)
        sizes = {}
        for entry in entries:
            pos, val = self._streams(entry, blobs)
            sizes[entry.name] = val.numel() * val.element_size() + (
                0
                if pos is None
                else blobs[f"{entry.name}.indices"].numel() * blobs[f"{entry.name}.indices"].element_size()
            )
        return sizes

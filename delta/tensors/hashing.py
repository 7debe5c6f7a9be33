"""Hashes of whole model states, cheap enough to check on every apply, computed where the state lives.

The state hash (`sum128:<32 hex>`) sums one hash per element (`_sumhash`): after a sparse change only the changed
elements are hashed again (old and new value), on the device that holds them, and a tensor cut into ranks' pieces
hashes as the whole tensor does. A state's hash is XXH3-128 over its tensors' names, dtypes, full shapes and two
64-bit element sums, in name order (docs/delta.md, "The state hash"). It proves bit-identity against accidents
(corruption, a wrong base, a bug, a file applied twice or out of order), not against someone who chooses the values to
collide (files in a bucket get SHA-256 separately).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np
import torch
import xxhash

from .._cores import resolve_workers
from ..errors import DeltaFormatError
from . import _device, _groups, _sumhash
from ._sumhash import Sums, TensorKey
from .bits import DTYPE_NAMES, DTYPES_BY_NAME, bits

HASH_PREFIX = "sum128:"


def whole_key(name: str, tensor: torch.Tensor) -> TensorKey:
    """The key of a tensor that is its own full tensor."""
    return TensorKey(name, DTYPE_NAMES[tensor.dtype], tuple(tensor.shape))


@dataclass(frozen=True)
class _Part:
    key: TensorKey
    sums: Sums


class StateDigest:
    """A state's hash with what it is made of, kept so that later versions hash from their changes alone: per tensor,
    its key (`_sumhash.TensorKey`) and its two element sums. Immutable: every method returns a new one. Keys are the
    names the state's files use (a piece of a sharded tensor under its piece name)."""

    def __init__(self, parts: Mapping[str, _Part]) -> None:
        self._parts = dict(parts)

    @property
    def names(self) -> frozenset[str]:
        """The tensor names it covers."""
        return frozenset(self._parts)

    def subset(self, names: Iterable[str]) -> StateDigest:
        """The digest of the part of the state holding `names`."""
        return StateDigest({n: self._parts[n] for n in names})

    def merged(self, other: StateDigest) -> StateDigest:
        """This digest with `other`'s tensors added or replacing its own."""
        return StateDigest({**self._parts, **other._parts})

    def __eq__(self, other: object) -> bool:
        return isinstance(other, StateDigest) and self._parts == other._parts

    __hash__ = None  # type: ignore[assignment]  # compare, do not key by it

    @property
    def hexdigest(self) -> str:
        """The state hash, as written in delta headers and manifests."""
        whole: dict[str, tuple[str, tuple[int, ...], Sums]] = {}
        for part in self._parts.values():  # pieces of one tensor add up to the whole tensor's sums
            k = part.key
            _, _, sums = whole.get(k.name, (k.dtype, k.shape, _sumhash.ZERO))
            whole[k.name] = (k.dtype, k.shape, _sumhash.add(sums, part.sums))
        h = xxhash.xxh3_128(b"sum128\n")
        for name in sorted(whole):
            dtype, shape, (s0, s1) = whole[name]
            h.update(f"{name}\0{dtype}\0{list(shape)}\0{s0:016x}{s1:016x}\n".encode())
        return HASH_PREFIX + h.hexdigest()

    @property
    def keys(self) -> dict[str, TensorKey]:
        """Key per tensor name."""
        return {n: p.key for n, p in self._parts.items()}

    def sums(self, name: str) -> Sums:
        return self._parts[name].sums

    def moved(self, deltas: Mapping[str, Sums]) -> StateDigest:
        """The digest after changes that move each named tensor's sums by `deltas[name]`."""
        parts = dict(self._parts)
        for name, d in deltas.items():
            parts[name] = _Part(parts[name].key, _sumhash.add(parts[name].sums, d))
        return StateDigest(parts)

    def to_json(self) -> dict[str, list]:
        """Per tensor: [full name, dtype, full shape, base, block, skip, sum 0, sum 1] (a rank's record)."""
        return {
            n: [p.key.name, p.key.dtype, list(p.key.shape), p.key.base, p.key.block, p.key.skip, *p.sums]
            for n, p in sorted(self._parts.items())
        }

    @classmethod
    def from_json(cls, body: object) -> StateDigest:
        """Inverse of `to_json`, every field checked (a rank's record is read back from the bucket).

        Raises:
            DeltaFormatError: a field of another type or out of range.
        """
        if not isinstance(body, dict):
            raise DeltaFormatError(f"a digest record is a {type(body).__name__}, not an object")
        parts = {}
        for name, row in body.items():
            if not (
                isinstance(name, str)
                and isinstance(row, list)
                and len(row) == 8
                and isinstance(row[0], str)
                and row[1] in DTYPES_BY_NAME
                and isinstance(row[2], list)
                and all(type(d) is int and 0 <= d < 1 << 63 for d in row[2])
                and all(type(v) is int and 0 <= v < 1 << 63 for v in row[3:6])
                and all(type(v) is int and 0 <= v <= _sumhash.MASK for v in row[6:])
            ):
                raise DeltaFormatError(f"the digest record of {name!r:.80} is malformed")
            full, dtype, shape, base, block, skip, s0, s1 = row
            parts[name] = _Part(TensorKey(full, dtype, tuple(shape), base, block, skip), (s0, s1))
        return cls(parts)


# -- computing digests -----------------------------------------------------------------------------------


def tensor_sums(key: TensorKey, tensor: torch.Tensor, workers: int | None = None) -> Sums:
    """The element sums of one tensor, where it lives (compiled host code on `workers` threads, or torch ops on
    its device)."""
    return _state_sums({"t": key}, {"t": tensor}, workers)["t"]


def _state_sums(
    keys: Mapping[str, TensorKey], state: Mapping[str, torch.Tensor], workers: int | None
) -> dict[str, Sums]:
    """Element sums of every tensor: host tensors together on `workers` host threads, device tensors a group at a
    time on their device (`_groups`: a few kernels per group, whatever its number of tensors), one wait for all."""
    host = [n for n in keys if _device.on_host(state[n])]
    sums = dict(
        zip(
            host,
            _sumhash.host_sums(
                [(keys[n], bits(state[n].detach().contiguous())) for n in host], resolve_workers(workers)
            ),
            strict=True,
        )
    )
    on_device = sorted(n for n in keys if n not in sums)
    flat = {n: state[n].detach().contiguous().reshape(-1) for n in on_device}
    found = [(group, _group_sums(group, flat, keys)) for group in _groups.groups(flat, on_device, 1)]
    halves = {n: [0, 0, 0, 0] for n in on_device}  # an empty tensor is in no group: its sums are zero
    for (group, _), rows in zip(found, _device.to_host_all([t for _, t in found]) if found else [], strict=True):
        for n, row in zip(group.names, rows.tolist(), strict=True):  # a tensor in parts: each part adds its halves
            halves[n] = [a + b for a, b in zip(halves[n], row, strict=True)]
    sums.update((n, _sumhash.sums_of_halves(row)) for n, row in halves.items())
    return sums


def _group_sums(group: _groups.Group, flat: Mapping[str, torch.Tensor], keys: Mapping[str, TensorKey]) -> torch.Tensor:
    """(members, 4) int64: each member's summed halves (`_sumhash.sums_of_halves`), left on the device (not
    waited for). One member (a large tensor, or a part of one) is hashed under its key alone; several, under
    each element's key gathered by member."""
    first = flat[group.names[0]]
    device, width = first.device, first.element_size() * 8
    parts = [flat[n][a : a + k] for n, a, k in zip(group.names, group.starts, group.sizes, strict=True)]
    v = _sumhash.as_int64(torch.cat(parts) if len(parts) > 1 else parts[0], width)
    if len(parts) == 1:
        key, start = keys[group.names[0]], group.starts[0]
        j = torch.arange(start, start + v.numel(), dtype=torch.int64, device=device)
        g = _sumhash.device_index(j, key.base, key._block, key.skip)
        lanes = [_sumhash.halves(_sumhash.device_hashes(g, v, seed)).sum(0) for seed in key.seeds]
        return torch.cat(lanes).reshape(1, 4)
    where = torch.tensor([group.sizes, group.offsets.tolist(), group.starts], dtype=torch.int64).to(device)
    owner = torch.repeat_interleave(torch.arange(len(parts), device=device), where[0], output_size=v.numel())
    j = torch.arange(v.numel(), dtype=torch.int64, device=device) + (where[2] - where[1]).index_select(0, owner)
    table = _sumhash.key_table([keys[n] for n in group.names], device)
    out = torch.zeros(len(parts), 4, dtype=torch.int64, device=device)
    return out.index_add_(0, owner, _sumhash.device_lane_halves(j, owner, table, None, v))


def moved_sums(
    key: TensorKey,
    positions: np.ndarray | torch.Tensor | None,
    old: np.ndarray | torch.Tensor,
    new: np.ndarray | torch.Tensor,
    workers: int | None = None,
) -> Sums:
    """How a tensor's sums move when the bits `old` at flat `positions` become `new` (None: `old` and `new` are
    the whole tensor), computed where the values are: numpy arrays on `workers` host threads, torch tensors with
    torch ops on their device."""
    if isinstance(new, np.ndarray) and isinstance(old, np.ndarray):
        if positions is None:
            whole = _sumhash.host_sums([(key, new), (key, old.view(new.dtype))], resolve_workers(workers))
            return _sumhash.sub(*whole)
        return _sumhash.host_change_sums(key, np.asarray(positions), old, new.view(old.dtype))
    if isinstance(old, np.ndarray) or isinstance(new, np.ndarray):
        device = (
            new.device
            if isinstance(new, torch.Tensor)
            else old.device
            if isinstance(old, torch.Tensor)
            else torch.device("cpu")
        )
        old, new = (x if isinstance(x, torch.Tensor) else _device.to_device([x], device)[0] for x in (old, new))
    width = old.element_size() * 8
    old_v, new_v = _sumhash.as_int64(old.reshape(-1), width), _sumhash.as_int64(new.reshape(-1), width)
    if positions is None:
        j = torch.arange(old_v.numel(), dtype=torch.int64, device=old_v.device)
    elif isinstance(positions, np.ndarray):
        j = _device.to_device([positions.astype(np.int64)], old_v.device)[0]
    else:
        j = positions.to(dtype=torch.int64)
    g = _sumhash.device_index(j, key.base, key._block, key.skip)
    rows = [
        _sumhash.halves(
            _sumhash.device_hashes(g, new_v, key.seeds[lane]) - _sumhash.device_hashes(g, old_v, key.seeds[lane])
        ).sum(0)
        for lane in (0, 1)
    ]
    return _sumhash.sums_of_halves(_device.to_host_all([torch.cat(rows)])[0].tolist())


def change_sums(
    key: TensorKey,
    tensor: torch.Tensor,
    positions: np.ndarray | torch.Tensor | None,
    new: np.ndarray | torch.Tensor,
    workers: int | None = None,
) -> Sums:
    """How `tensor`'s sums move when the bits at flat `positions` (None: all) become `new`; reads the old bits
    from `tensor` (not modified) where it lives; `workers`: host threads for a whole tensor."""
    if isinstance(new, np.ndarray) and tensor.device.type == "cpu":
        flat = bits(tensor)
        return moved_sums(key, positions, flat if positions is None else flat[np.asarray(positions)], new, workers)
    ints = _device.int_view(tensor)
    if positions is None:
        return moved_sums(key, None, ints, new)
    index = (
        positions
        if isinstance(positions, torch.Tensor)
        else _device.to_device([np.asarray(positions, np.int64)], ints.device)[0]
    )
    return moved_sums(key, index, ints.index_select(0, index.to(ints.device)), new)


def state_digest(
    state: Mapping[str, torch.Tensor], keys: Mapping[str, TensorKey] | None = None, workers: int | None = None
) -> StateDigest:
    """Hash every tensor of `state` (only read), where each lives; `keys` for pieces of sharded tensors
    (`delta.pieces`), else each tensor is its own full tensor; host tensors on `workers` threads (None: one per
    core)."""
    keys = keys or {}
    key_of = {n: keys.get(n) or whole_key(n, state[n]) for n in sorted(state)}
    sums = _state_sums(key_of, state, workers)
    return StateDigest({n: _Part(key_of[n], sums[n]) for n in key_of})

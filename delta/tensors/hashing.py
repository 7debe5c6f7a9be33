"""Hashes of whole model states, cheap enough to check on every apply, computed where the state lives.

The state hash (`sum128:<32 hex>`, format version 3) sums one hash per element (`_sumhash`): after a
sparse change only the changed elements are hashed again (old and new value), on the device that holds
them, and a tensor cut into ranks' pieces hashes as the whole tensor does. A state's hash is XXH3-128
over its tensors' names, dtypes, full shapes and two 64-bit element sums, in name order (docs/delta.md,
"The state hash"). It proves bit-identity against accidents (corruption, a wrong base, a bug, a file
applied twice or out of order), not against someone who chooses the values to collide (files in a
bucket get SHA-256 separately).

Files of format version 2 carry the earlier hash (`xxh3-128:`, XXH3-128 of each tensor's bytes, then of
the list of them): `LegacyDigest` reads it, so old files keep verifying.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import xxhash

if TYPE_CHECKING:
    from typing import Self  # Python 3.11; the library runs on 3.10 too

from .._cores import resolve_workers
from ..errors import DeltaFormatError
from . import _device, _groups, _sumhash
from ._sumhash import Sums, TensorKey
from .bits import DTYPE_NAMES, DTYPES_BY_NAME, bits

SCHEME = "sum128"
HASH_PREFIX = SCHEME + ":"
LEGACY_SCHEME = "xxh3-128"
LEGACY_PREFIX = LEGACY_SCHEME + ":"


def scheme_of(state_hash: str) -> str:
    """The scheme a state hash string is written in (`sum128` or `xxh3-128`; '' for anything else)."""
    head = state_hash.partition(":")[0]
    return head if head in (SCHEME, LEGACY_SCHEME) else ""


def whole_key(name: str, tensor: torch.Tensor) -> TensorKey:
    """The key of a tensor that is its own full tensor."""
    return TensorKey(name, DTYPE_NAMES[tensor.dtype], tuple(tensor.shape))


class StateDigest(ABC):
    """A state's hash with what it is made of, kept so that later versions hash from their changes alone.

    Digests are immutable: every method returns a new one. Keys are the names the state's files use
    (a piece of a sharded tensor under its piece name).
    """

    scheme: str

    @abstractmethod
    def __init__(self, items: Mapping[str, Any]) -> None:
        """The digest of what `items` holds per tensor name, as `_items` returns it."""

    @property
    @abstractmethod
    def hexdigest(self) -> str:
        """The state hash, as written in delta headers and manifests."""

    @abstractmethod
    def _items(self) -> dict[str, Any]:
        """What it is made of, per tensor name: what the subclass's constructor takes back."""

    @property
    def names(self) -> frozenset[str]:
        """The tensor names it covers."""
        return frozenset(self._items())

    def subset(self, names: Iterable[str]) -> Self:
        """The digest of the part of the state holding `names`."""
        items = self._items()
        return type(self)({n: items[n] for n in names})

    def merged(self, other: StateDigest) -> Self:
        """This digest with `other`'s tensors added or replacing its own (same scheme)."""
        if type(other) is not type(self):
            raise TypeError(f"cannot merge a {other.scheme} digest into a {self.scheme} one")
        return type(self)({**self._items(), **other._items()})

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self._items() == other._items()

    __hash__ = None  # type: ignore[assignment]  # mutable-looking: compare, do not key by it


@dataclass(frozen=True)
class _Part:
    key: TensorKey
    sums: Sums


class SumDigest(StateDigest):
    """The `sum128` digest: per tensor, its key (`_sumhash.TensorKey`) and its two element sums."""

    scheme = SCHEME

    def __init__(self, parts: Mapping[str, _Part]) -> None:
        self._parts = dict(parts)

    @property
    def hexdigest(self) -> str:
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

    def _items(self) -> dict:
        return self._parts

    @property
    def keys(self) -> dict[str, TensorKey]:
        """Key per tensor name."""
        return {n: p.key for n, p in self._parts.items()}

    def sums(self, name: str) -> Sums:
        return self._parts[name].sums

    def moved(self, deltas: Mapping[str, Sums]) -> SumDigest:
        """The digest after changes that move each named tensor's sums by `deltas[name]`."""
        parts = dict(self._parts)
        for name, d in deltas.items():
            parts[name] = _Part(parts[name].key, _sumhash.add(parts[name].sums, d))
        return SumDigest(parts)

    def with_sums(self, sums: Mapping[str, Sums]) -> SumDigest:
        """The digest with the named tensors' sums replaced (a tensor written whole)."""
        return SumDigest({**self._parts, **{n: _Part(self._parts[n].key, s) for n, s in sums.items()}})

    def to_json(self) -> dict[str, list]:
        """Per tensor: [full name, dtype, full shape, base, block, skip, sum 0, sum 1] (a rank's record)."""
        return {
            n: [p.key.name, p.key.dtype, list(p.key.shape), p.key.base, p.key.block, p.key.skip, *p.sums]
            for n, p in sorted(self._parts.items())
        }

    @classmethod
    def from_json(cls, body: object) -> SumDigest:
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


class LegacyDigest(StateDigest):
    """The `xxh3-128` digest of format version 2: XXH3-128 per tensor's bytes, then of their list."""

    scheme = LEGACY_SCHEME

    def __init__(self, tensors: Mapping[str, str]) -> None:
        self.tensors = dict(tensors)

    @property
    def hexdigest(self) -> str:
        h = xxhash.xxh3_128()
        for name in sorted(self.tensors):
            h.update(f"{name}\0{self.tensors[name]}\n".encode())
        return LEGACY_PREFIX + h.hexdigest()

    def _items(self) -> dict:
        return self.tensors


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
) -> SumDigest:
    """Hash every tensor of `state` (only read), where each lives; `keys` for pieces of sharded tensors
    (`delta.pieces`), else each tensor is its own full tensor; host tensors on `workers` threads (None: one per
    core)."""
    keys = keys or {}
    key_of = {n: keys.get(n) or whole_key(n, state[n]) for n in sorted(state)}
    sums = _state_sums(key_of, state, workers)
    return SumDigest({n: _Part(key_of[n], sums[n]) for n in key_of})


def legacy_state_digest(state: Mapping[str, torch.Tensor], workers: int | None = None) -> LegacyDigest:
    """The format-2 digest of `state` (host copies of device tensors), a tensor per thread on up to 4 of
    `workers` threads."""
    names = sorted(state)
    threads = min(4, resolve_workers(workers), len(names))
    if threads <= 1:
        return LegacyDigest({n: legacy_tensor_digest(n, state[n]) for n in names})
    with ThreadPoolExecutor(max_workers=threads) as pool:
        return LegacyDigest(dict(zip(names, pool.map(lambda n: legacy_tensor_digest(n, state[n]), names), strict=True)))


def digest_like(
    state_hash: str,
    state: Mapping[str, torch.Tensor],
    keys: Mapping[str, TensorKey] | None = None,
    workers: int | None = None,
) -> StateDigest:
    """The digest of `state` in the scheme `state_hash` is written in (the current one for anything else), on
    `workers` host threads."""
    if scheme_of(state_hash) == LEGACY_SCHEME:
        return legacy_state_digest(state, workers)
    return state_digest(state, keys, workers)


def _legacy_hasher(name: str, tensor: torch.Tensor) -> xxhash.xxh3_128:
    h = xxhash.xxh3_128()
    h.update(f"{name}\0{DTYPE_NAMES[tensor.dtype]}\0{tuple(tensor.shape)}\0".encode())
    return h


def legacy_tensor_digest(name: str, tensor: torch.Tensor) -> str:
    """Format 2's digest of one tensor: its name, dtype, shape and bytes."""
    h = _legacy_hasher(name, tensor)
    h.update(bits(_device.host_view({name: tensor}, [name])[name].detach().contiguous()).data.cast("B"))
    return h.hexdigest()


LEGACY_CHUNK = 1 << 22


def legacy_digest_with_changes(
    name: str, tensor: torch.Tensor, positions: np.ndarray | None, values: np.ndarray
) -> str:
    """Format 2's digest `tensor` (on the host) would have with `values` written at ascending `positions`
    (None: `values` is the whole tensor), without writing anything; copies one chunk at a time."""
    h = _legacy_hasher(name, tensor)
    if positions is None:
        h.update(values.data.cast("B"))
        return h.hexdigest()
    flat = bits(tensor)
    bounds = np.searchsorted(positions, np.arange(0, flat.size + LEGACY_CHUNK, LEGACY_CHUNK))
    for k, lo in enumerate(range(0, flat.size, LEGACY_CHUNK)):
        chunk = flat[lo : lo + LEGACY_CHUNK]
        a, b = bounds[k], bounds[k + 1]
        if a < b:
            chunk = chunk.copy()
            chunk[positions[a:b] - lo] = values[a:b]
        h.update(chunk.data.cast("B"))
    return h.hexdigest()

"""Hashes of whole model states, cheap enough to check on every apply.

A state hash must prove bit-identity of a multi-GB state at memory speed, so it is XXH3-128 (not a
cryptographic hash; files in a bucket get SHA-256 separately). The state hash combines per-tensor
digests, so after a sparse apply only the changed tensors need hashing again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import torch
import xxhash

from .bits import DTYPE_NAMES, bits

HASH_PREFIX = "xxh3-128:"


def _hasher(name: str, tensor: torch.Tensor) -> xxhash.xxh3_128:
    h = xxhash.xxh3_128()
    h.update(f"{name}\0{DTYPE_NAMES[tensor.dtype]}\0{tuple(tensor.shape)}\0".encode())
    return h


def tensor_digest(name: str, tensor: torch.Tensor) -> str:
    """Digest of one tensor: its name, dtype, shape and bytes."""
    h = _hasher(name, tensor)
    h.update(memoryview(bits(tensor.detach().cpu().contiguous())).cast("B"))
    return h.hexdigest()


HASH_CHUNK = 1 << 22


def digest_with_changes(name: str, tensor: torch.Tensor, positions: np.ndarray | None, values: np.ndarray) -> str:
    """Digest `tensor` would have with `values` written at `positions`, without writing anything.

    Lets a reader prove a delta's result before touching its state. Positions must be ascending;
    None means `values` is the whole new tensor. Copies one chunk of the tensor at a time.
    """
    h = _hasher(name, tensor)
    if positions is None:
        h.update(memoryview(values).cast("B"))
        return h.hexdigest()
    flat = bits(tensor)
    bounds = np.searchsorted(positions, np.arange(0, flat.size + HASH_CHUNK, HASH_CHUNK))
    for k, lo in enumerate(range(0, flat.size, HASH_CHUNK)):
        chunk = flat[lo:lo + HASH_CHUNK]
        a, b = bounds[k], bounds[k + 1]
        if a < b:
            chunk = chunk.copy()
            chunk[positions[a:b] - lo] = values[a:b]
        h.update(memoryview(chunk).cast("B"))
    return h.hexdigest()


@dataclass
class StateDigest:
    """Per-tensor digests of a state and their combination, kept so partial updates stay cheap.

    Attributes:
        tensors: Digest per tensor name.
    """

    tensors: dict[str, str] = field(default_factory=dict)

    @property
    def hexdigest(self) -> str:
        """The state hash, as written in delta headers and manifests (`xxh3-128:<hex>`)."""
        h = xxhash.xxh3_128()
        for name in sorted(self.tensors):
            h.update(f"{name}\0{self.tensors[name]}\n".encode())
        return HASH_PREFIX + h.hexdigest()

    def updated(self, state: Mapping[str, torch.Tensor], names: Iterable[str]) -> StateDigest:
        """A new digest with the given tensors of `state` hashed again; self is not modified."""
        fresh = dict(self.tensors)
        fresh.update(_digests(state, list(names)))
        return StateDigest(fresh)


def _digests(state: Mapping[str, torch.Tensor], names: list[str]) -> dict[str, str]:
    if len(names) <= 1:
        return {name: tensor_digest(name, state[name]) for name in names}
    with ThreadPoolExecutor(max_workers=min(4, len(names))) as pool:
        return dict(zip(names, pool.map(lambda n: tensor_digest(n, state[n]), names)))


def state_digest(state: Mapping[str, torch.Tensor]) -> StateDigest:
    """Hash every tensor of `state` (threads; the state is only read)."""
    return StateDigest(_digests(state, sorted(state)))

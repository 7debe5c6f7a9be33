"""Writer side: the delta between two states, as the bytes of one safetensors file."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from .._stages import stage
from ..codecs import DEFAULT_CODEC, Workspace, get_codec
from ..format import DeltaHeader, write_delta
from ..tensors._sumhash import TensorKey
from ..tensors.hashing import StateDigest, state_digest
from ..tensors.state import check_same_layout


def _contiguous(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Detached contiguous tensors where they live (a copy only where a tensor is strided)."""
    return {k: v.detach().contiguous() for k, v in state.items()}


def diff(
    old: Mapping[str, torch.Tensor],
    new: Mapping[str, torch.Tensor],
    *,
    codec: str = DEFAULT_CODEC,
    version: int | None = None,
    base_version: int | None = None,
    old_digest: StateDigest | None = None,
    progress: bool = False,
    workers: int | None = None,
    chunk: int | None = None,
    workspace: Workspace | None = None,
) -> bytes:
    """Encode what changed from `old` to `new` (bit patterns, element by element) as a delta file.

    Both states must hold the same tensor names, shapes and dtypes. Neither is modified. Tensors on
    a GPU are compared and scanned on the device; only the changed elements are copied to the host.
    The target hash comes from the base's hash moved by the changed elements alone.

    Args:
        old: The state the reader holds (the base).
        new: The state the reader should end with.
        codec: `ctx` (default, smallest), `gap` (faster to decode) or `raw` (TRL layout).
        version, base_version: Model versions written into the header.
        old_digest: The hash of `old` when the caller already has it (`state_digest`; saves a pass over it).
        progress: Show a progress bar on stderr.
        workers: Threads that scan, code and hash (None: one per core).
        chunk: Elements per independently coded chunk (None: 1 Mi); readers take any size.
        workspace: Memory kept from this caller's previous diff (one call at a time; None: fresh memory). The
            bytes returned are never in it.

    Returns:
        The bytes of a safetensors file (see docs/delta.md, "The delta format").

    Raises:
        StateMismatchError: the states do not have the same layout.
    """
    return encode_delta(
        old,
        new,
        codec=codec,
        version=version,
        base_version=base_version,
        old_digest=old_digest,
        progress=progress,
        workers=workers,
        chunk=chunk,
        workspace=workspace,
    )[0]


def encode_delta(
    old: Mapping[str, torch.Tensor],
    new: Mapping[str, torch.Tensor],
    *,
    codec: str = DEFAULT_CODEC,
    version: int | None = None,
    base_version: int | None = None,
    old_digest: StateDigest | None = None,
    keys: Mapping[str, TensorKey] | None = None,
    progress: bool = False,
    workers: int | None = None,
    chunk: int | None = None,
    workspace: Workspace | None = None,
) -> tuple[bytes, StateDigest]:
    """`diff`, also returning the digest of `new` (the publisher keeps it for the next version).

    Args:
        keys: State-hash keys of pieces of sharded tensors (`delta.pieces`), when `old_digest` is not given.
    """
    check_same_layout(old, new)
    old, new = _contiguous(old), _contiguous(new)
    if not isinstance(old_digest, StateDigest) or old_digest.names != set(old):
        old_digest = state_digest(old, keys, workers)
    chosen = get_codec(codec)
    encoded = chosen.encode(
        old,
        new,
        sorted(old),
        progress=progress,
        workers=workers,
        chunk=chunk,
        keys=old_digest.keys,
        workspace=workspace,
    )
    assert encoded.sums is not None  # asked for with the keys
    new_digest = old_digest.moved(encoded.sums)
    header = DeltaHeader(
        codec=chosen.name,
        version=version,
        base_version=base_version,
        changed=sum(e.changed for e in encoded.entries),
        total=sum(t.numel() for t in new.values()),
        base_hash=old_digest.hexdigest,
        target_hash=new_digest.hexdigest,
        tensors=tuple(encoded.entries),
    )
    with stage("write"):
        return write_delta(header, encoded.blobs), new_digest

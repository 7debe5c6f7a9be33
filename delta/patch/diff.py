"""Writer side: the delta between two states, as the bytes of one safetensors file."""

from __future__ import annotations

from collections.abc import Mapping

import torch

from ..codecs import DEFAULT_CODEC, get_codec
from ..format import DeltaHeader, write_delta
from ..tensors.hashing import StateDigest, state_digest
from ..tensors.state import check_same_layout


def _contiguous(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Detached contiguous tensors where they live (a copy only where a tensor is strided)."""
    return {k: v.detach().contiguous() for k, v in state.items()}


def diff(old: Mapping[str, torch.Tensor], new: Mapping[str, torch.Tensor], *, codec: str = DEFAULT_CODEC,
         version: int | None = None, base_version: int | None = None, old_digest: StateDigest | None = None,
         new_digest: StateDigest | None = None, progress: bool = False, workers: int | None = None,
         chunk: int | None = None) -> bytes:
    """Encode what changed from `old` to `new` (bit patterns, element by element) as a delta file.

    Both states must hold the same tensor names, shapes and dtypes. Neither is modified. Tensors on
    a GPU are compared on the device; only the changed elements are copied to the host.

    Args:
        old: The state the reader holds (the base).
        new: The state the reader should end with.
        codec: `ctx` (default, smallest), `gap` (faster to decode) or `raw` (TRL layout).
        version, base_version: Model versions written into the header.
        old_digest, new_digest: Hashes of the states when the caller already has them (saves a pass).
        progress: Show a progress bar on stderr.
        workers: Threads that scan and code chunks (None: one per core).
        chunk: Elements per independently coded chunk (None: 1 Mi); readers take any size.

    Returns:
        The bytes of a safetensors file (see docs/delta.md, "The delta format").

    Raises:
        StateMismatchError: the states do not have the same layout.
    """
    check_same_layout(old, new)
    old, new = _contiguous(old), _contiguous(new)
    chosen = get_codec(codec)
    entries, blobs = chosen.encode(old, new, sorted(old), progress=progress, workers=workers, chunk=chunk)
    header = DeltaHeader(
        codec=chosen.name, version=version, base_version=base_version,
        changed=sum(e.changed for e in entries), total=sum(t.numel() for t in new.values()),
        base_hash=(old_digest or state_digest(old)).hexdigest,
        target_hash=(new_digest or state_digest(new)).hexdigest,
        tensors=tuple(entries))
    return write_delta(header, blobs)

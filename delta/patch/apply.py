"""Reader side: apply a delta file to a state in place, all or nothing."""

from __future__ import annotations

from collections.abc import MutableMapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import torch

from ..codecs import Change, get_codec
from ..errors import DeltaFormatError, IntegrityError, StateMismatchError
from ..format import DeltaHeader, header_limit, prove_checksum, read_delta
from ..tensors import _device
from ..tensors.bits import DTYPE_NAMES, bits
from ..tensors.hashing import StateDigest, digest_with_changes, state_digest


@dataclass(frozen=True)
class ApplyResult:
    """What an apply did.

    Attributes:
        header: The delta's header.
        digest: Digest of the state after applying (pass it to the next apply to skip hashing).
        changed: Elements written.
    """

    header: DeltaHeader
    digest: StateDigest
    changed: int


def _check_entries(header: DeltaHeader, state: MutableMapping[str, torch.Tensor]) -> None:
    for entry in header.tensors:
        if entry.name not in state:
            raise StateMismatchError("is in the delta but not in the state", tensor=entry.name)
        t = state[entry.name]
        if DTYPE_NAMES.get(t.dtype) != entry.dtype:
            raise StateMismatchError(f"the delta holds {entry.dtype}, the state {t.dtype}", tensor=entry.name)
        if not header.foreign and tuple(t.shape) != entry.shape:
            raise StateMismatchError(f"the delta's shape is {entry.shape}, the state's {tuple(t.shape)}",
                                     tensor=entry.name)
        if not t.is_contiguous():
            raise StateMismatchError("apply works on contiguous tensors", tensor=entry.name)
    if not header.foreign:
        total = sum(t.numel() for t in state.values())
        if total != header.total:
            raise StateMismatchError(f"the state has {total} elements, the delta was made for {header.total}")


def decode(data: bytes | memoryview, state: MutableMapping[str, torch.Tensor], *, path: str | None = None,
           digest: StateDigest | None = None, workers: int | None = None
           ) -> tuple[DeltaHeader, list[Change], StateDigest | None]:
    """Parse and validate a delta against `state` without writing anything.

    This is the slow half of an apply (it can run in a background thread while the state is still
    being read; it must not be written meanwhile); `write_changes` is the fast half. The target hash
    is proven here, on the decoded result, before anything is written: each change carries the
    digest its tensor will have.

    Args:
        workers: Threads that decode chunks (None: one per core).

    Returns:
        (header, decoded changes, digest of `state` before applying — None for foreign files).

    Raises:
        IntegrityError: the decoded result does not hash to the header's target (for a TRL file with a
            `checksum_sha256`: does not match it).
        DeltaFormatError, StateMismatchError: see `apply`.
    """
    header, blobs = read_delta(data, path, max_header=header_limit(state))
    _check_entries(header, state)
    if not header.foreign:
        digest = digest or state_digest(state)
        if digest.hexdigest != header.base_hash:
            raise StateMismatchError(
                f"the state's hash is {digest.hexdigest}, this delta applies to {header.base_hash} "
                f"(version {header.base_version}); apply the deltas in order, or start from an anchor")
    try:
        codec = get_codec(header.codec)
    except ValueError as e:
        raise DeltaFormatError(str(e), path=path) from e
    host = _device.host_view(state, [e.name for e in header.tensors])  # a device state: its delta's tensors, copied
    try:
        changes = codec.decode(header.tensors, blobs, host, workers)
    except DeltaFormatError as e:
        raise e.at(path) from None
    if len({c.name for c in changes}) != len(changes):  # the header check makes names unique; never write one twice
        raise DeltaFormatError("a tensor is changed twice", path=path)
    if not header.foreign:
        _prove_target(header, changes, host, digest)
    elif header.checksum:
        prove_checksum(header, changes, _device.host_view(state, state), path)  # TRL hashes the whole state
    return header, changes, digest


def _prove_target(header: DeltaHeader, changes: list[Change], state: MutableMapping[str, torch.Tensor],
                  before: StateDigest) -> None:
    """Hash every changed tensor as it will be (nothing written) and compare with the target hash."""
    def prove(change: Change) -> str:
        return digest_with_changes(change.name, state[change.name], change.positions, change.values)

    with ThreadPoolExecutor(max_workers=2) as pool:
        for change, digest in zip(changes, pool.map(prove, changes)):
            change.digest = digest
    after = StateDigest({**before.tensors, **{c.name: c.digest for c in changes}})
    if after.hexdigest != header.target_hash:
        raise IntegrityError(f"version {header.version} decodes to a state other than the delta's target; nothing "
                             "was written", expected=header.target_hash, actual=after.hexdigest)


class Rollback:
    """The old values of every element a write overwrote, so that a failed apply (one file, or the files
    of several ranks that make one version) can be undone exactly."""

    def __init__(self) -> None:
        self._saved: list[tuple[torch.Tensor, np.ndarray | None, np.ndarray | torch.Tensor]] = []

    def write(self, tensor: torch.Tensor, positions: np.ndarray | None, values: np.ndarray) -> None:
        """Write the bit patterns `values` at flat `positions` of `tensor` (None: all of it), where it
        lives, keeping what was there."""
        if not _device.on_host(tensor):  # a GPU: torch's indexing on the device
            self._saved.append((tensor, positions, _device.write_at(tensor, positions, values)))
            return
        flat = bits(tensor)
        if positions is None:
            self._saved.append((tensor, None, flat.copy()))
            flat[:] = values
        else:
            self._saved.append((tensor, positions, _device.scatter(flat, positions, values)))

    def restore(self) -> None:
        """Put every overwritten element back, newest write first; a second call does nothing."""
        for tensor, positions, old in reversed(self._saved):
            if isinstance(old, torch.Tensor):
                _device.restore_at(tensor, positions, old)
            elif positions is None:
                bits(tensor)[:] = old
            else:
                _device.scatter(bits(tensor), positions, old)
        self._saved.clear()


def write_changes(header: DeltaHeader, changes: list[Change], state: MutableMapping[str, torch.Tensor],
                  digest: StateDigest | None, rollback: Rollback | None = None) -> ApplyResult:
    """Write decoded changes into `state` in place, check the target hash, roll back on mismatch.

    The check uses the digests `decode` proved (no re-hashing: the pause is the write alone);
    changes without them are hashed after writing.

    Args:
        rollback: Records the writes (pass one to undo several files' writes together); on a mismatch
            everything it recorded is restored, earlier files' writes included.

    Raises:
        IntegrityError: the result does not hash to the header's target (the state is restored).
    """
    rollback = rollback if rollback is not None else Rollback()
    for change in changes:
        rollback.write(state[change.name], change.positions, change.values)
    changed = sum(e.changed for e in header.tensors)
    if header.foreign:
        return ApplyResult(header, state_digest(state), changed)
    proven = {c.name: c.digest for c in changes if c.digest is not None}
    after = StateDigest({**digest.tensors, **proven}).updated(state, [c.name for c in changes if c.digest is None])
    if after.hexdigest != header.target_hash:
        rollback.restore()
        raise IntegrityError(f"state after applying version {header.version} does not match the delta's target "
                             "hash; the state was restored", expected=header.target_hash, actual=after.hexdigest)
    return ApplyResult(header, after, changed)


def apply(state: MutableMapping[str, torch.Tensor], delta: bytes | memoryview | str, *,
          digest: StateDigest | None = None, workers: int | None = None) -> ApplyResult:
    """Apply a delta to `state` in place: everything is validated before the first write.

    Checks names, shapes, dtypes, the base hash, stream lengths, positions (in range, sorted) and
    the target hash of the decoded result; then writes. On any error the state is exactly as before.

    Args:
        state: The reader's tensors (contiguous, on the CPU or a GPU); modified in place on success. A GPU
            state's tensors named in the delta are copied to the host to decode and prove the result
            (the codecs condition on the old values), then written on the device.
        delta: File bytes or a path to a delta file.
        digest: The state's digest if the caller has it (e.g. from the previous apply); computed if None.
        workers: Threads that decode chunks (None: one per core).

    Returns:
        ApplyResult with the new digest.

    Raises:
        DeltaFormatError: the file is not a valid delta (corrupt, truncated, unknown format version).
        StateMismatchError: the delta is for another state (names, shapes, dtypes, base hash).
        IntegrityError: the result would not match the target hash (nothing written).
    """
    path = None
    if isinstance(delta, str):
        path = delta
        with open(delta, "rb") as f:
            delta = f.read()
    header, changes, before = decode(delta, state, path=path, digest=digest, workers=workers)
    return write_changes(header, changes, state, before)

"""Reader side: apply a delta file to a state in place, all or nothing."""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass

import numpy as np
import torch

from .._stages import stage
from ..codecs import Change, Codec, Workspace, get_codec
from ..errors import DeltaFormatError, IntegrityError, StateMismatchError
from ..format import DeltaHeader, header_limit, prove_checksum, read_delta
from ..tensors import _device
from ..tensors._sumhash import TensorKey
from ..tensors.bits import DTYPE_NAMES, bits
from ..tensors.hashing import StateDigest, change_sums, moved_sums, state_digest


@dataclass(frozen=True)
class ApplyResult:
    """What an apply did: the delta's `header`, the state's `digest` after it (pass it to the next apply), and the
    elements `changed`."""

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
            raise StateMismatchError(
                f"the delta's shape is {entry.shape}, the state's {tuple(t.shape)}", tensor=entry.name
            )
        if not t.is_contiguous():
            raise StateMismatchError("apply works on contiguous tensors", tensor=entry.name)
    if not header.foreign:
        total = sum(t.numel() for t in state.values())
        if total != header.total:
            raise StateMismatchError(f"the state has {total} elements, the delta was made for {header.total}")


def decode(
    data: bytes | memoryview,
    state: MutableMapping[str, torch.Tensor],
    *,
    path: str | None = None,
    digest: StateDigest | None = None,
    workers: int | None = None,
    workspace: Workspace | None = None,
) -> tuple[DeltaHeader, list[Change], StateDigest | None]:
    """Parse and validate a delta against `state` without writing anything: the slow half of an apply (`write_changes`
    is the fast half), which may run while the state is read. The target hash is proven here, on the decoded result:
    each change carries how it moves the state hash (`Change.sums`). A state on a device is decoded there.

    Args:
        digest: The state's digest if the caller has it (otherwise computed).
        workers: Threads that decode and hash (None: one per core).
        workspace: Memory kept from this caller's previous decode (None: fresh memory); the changes are never in it.

    Returns:
        (header, decoded changes, digest of `state` before applying — None for foreign files).

    Raises:
        IntegrityError: the decoded result does not hash to the header's target (or a TRL file's checksum).
        DeltaFormatError, StateMismatchError: see `apply`.
    """
    with stage("read"):
        header, blobs = read_delta(data, path, max_header=header_limit(state))
    _check_entries(header, state)
    try:
        codec = get_codec(header.codec)
    except ValueError as e:
        raise DeltaFormatError(str(e), path=path) from e
    names = [e.name for e in header.tensors]
    if header.foreign:
        changes = _decoded(codec, header, blobs, _device.host_view(state, names), workers, None, path, workspace)
        if header.checksum:
            prove_checksum(header, changes, _device.host_view(state, state), path)  # TRL hashes the whole state
        return header, changes, None
    before = digest if digest is not None else state_digest(state, workers=workers)
    if before.hexdigest != header.base_hash:
        raise StateMismatchError(
            f"the state's hash is {before.hexdigest}, this delta applies to {header.base_hash} "
            f"(version {header.base_version}); apply the deltas in order, or start from an anchor"
        )
    changes = _decoded(codec, header, blobs, state, workers, before.keys, path, workspace)
    sums: dict[str, tuple[int, int]] = {}
    with stage("hash"):
        for c in changes:
            if c.sums is None:  # decoded without the old values at hand (`raw`)
                c.sums = change_sums(before.keys[c.name], state[c.name], c.positions, c.values, workers)
            sums[c.name] = c.sums
    after = before.moved(sums)
    if after.hexdigest != header.target_hash:
        raise IntegrityError(
            f"version {header.version} decodes to a state other than the delta's target; nothing was written",
            expected=header.target_hash,
            actual=after.hexdigest,
        )
    return header, changes, before


def _decoded(
    codec: Codec,
    header: DeltaHeader,
    blobs: Mapping[str, torch.Tensor],
    state: Mapping[str, torch.Tensor],
    workers: int | None,
    keys: Mapping[str, TensorKey] | None,
    path: str | None,
    workspace: Workspace | None,
) -> list[Change]:
    try:
        changes = codec.decode(header.tensors, blobs, state, workers, keys=keys, workspace=workspace)
    except DeltaFormatError as e:
        raise e.at(path) from None
    if len({c.name for c in changes}) != len(changes):  # the header check makes names unique; never write one twice
        raise DeltaFormatError("a tensor is changed twice", path=path)
    return changes


class Rollback:
    """The old values of every element a write overwrote, so that a failed apply (one file, or the files
    of several ranks that make one version) can be undone exactly."""

    def __init__(self) -> None:
        self._saved: list[tuple[torch.Tensor, np.ndarray | torch.Tensor | None, np.ndarray | torch.Tensor]] = []

    def write(
        self, tensor: torch.Tensor, positions: np.ndarray | torch.Tensor | None, values: np.ndarray | torch.Tensor
    ) -> np.ndarray | torch.Tensor:
        """Write the bit patterns `values` at flat `positions` of `tensor` (None: all of it), where it
        lives, keeping what was there; returns what was there."""
        if tensor.device.type == "cpu" and isinstance(values, np.ndarray) and not isinstance(positions, torch.Tensor):
            flat = bits(tensor)  # host arrays into host memory: compiled, without the GIL
            old: np.ndarray | torch.Tensor
            if positions is None:
                old = flat.copy()
                flat[:] = values
            else:
                old = _device.scatter(flat, positions, values.view(flat.dtype))
            self._saved.append((tensor, positions, old))
            return old
        if isinstance(positions, np.ndarray):
            positions = torch.from_numpy(positions.astype(np.int64, copy=False))
        if isinstance(values, np.ndarray):
            values = torch.from_numpy(values)
        old = _device.write_at(tensor, positions, values)
        self._saved.append((tensor, positions, old))
        return old

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


def write_changes(
    header: DeltaHeader,
    changes: list[Change],
    state: MutableMapping[str, torch.Tensor],
    digest: StateDigest | None,
    rollback: Rollback | None = None,
    *,
    workers: int | None = None,
) -> ApplyResult:
    """Write decoded changes into `state` in place and check the target hash: the new digest is the old one moved by
    what `decode` proved (a change without a proof is hashed from what it overwrote and wrote).

    Args:
        digest: The state's digest before the write, as `decode` returned it.
        rollback: Records the writes; on a mismatch everything it recorded is restored (several files together).
        workers: Threads that hash what no proof covers (None: one per core).

    Raises:
        IntegrityError: the result does not hash to the header's target (the state is restored).
    """
    rollback = rollback if rollback is not None else Rollback()
    with stage("write"):
        written = [(change, rollback.write(state[change.name], change.positions, change.values)) for change in changes]
    changed = sum(e.changed for e in header.tensors)
    if header.foreign:
        return ApplyResult(header, state_digest(state, workers=workers), changed)
    assert digest is not None, "write_changes takes the digest decode returned"
    after = digest.moved(
        {
            c.name: c.sums
            if c.sums is not None
            else moved_sums(digest.keys[c.name], c.positions, old, c.values, workers)
            for c, old in written
        }
    )
    if after.hexdigest != header.target_hash:
        rollback.restore()
        raise IntegrityError(
            f"state after applying version {header.version} does not match the delta's target "
            "hash; the state was restored",
            expected=header.target_hash,
            actual=after.hexdigest,
        )
    return ApplyResult(header, after, changed)


def apply(
    state: MutableMapping[str, torch.Tensor],
    delta: bytes | memoryview | str,
    *,
    digest: StateDigest | None = None,
    workers: int | None = None,
    workspace: Workspace | None = None,
) -> ApplyResult:
    """Apply a delta to `state` in place, everything validated before the first write (names, shapes, dtypes, base hash,
    streams, positions, the target hash); on any error the state is exactly as before.

    Args:
        state: The reader's tensors (contiguous, CPU or GPU: a GPU state is decoded and written on the device).
        delta: File bytes or a path to a delta file.
        digest: The state's digest if the caller has it (e.g. from the previous apply); computed if None.
        workers: Threads that decode and hash (None: one per core).
        workspace: Memory kept from this caller's previous apply (see `decode`).

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
    header, changes, before = decode(delta, state, path=path, digest=digest, workers=workers, workspace=workspace)
    return write_changes(header, changes, state, before, workers=workers)

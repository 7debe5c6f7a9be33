"""What every codec does: turn (old, new) tensors into file blobs listed as `TensorEntry` rows of the
delta's table, and blobs back into changes."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from ..tensors._sumhash import TensorKey
from ._workspace import Workspace


@dataclass(frozen=True)
class TensorEntry:
    """One changed tensor as the header lists it.

    Attributes:
        name: Tensor name in the state.
        dtype: Dtype name (`bfloat16`, `float32`, ...).
        shape: Shape of the full tensor.
        form: How the codec stored it: `sparse` (ctx, gap), `indices` (raw: positions and values),
            `dense` (the whole new tensor: a foreign anchor).
        changed: Number of elements whose bits changed.
    """

    name: str
    dtype: str
    shape: tuple[int, ...]
    form: str
    changed: int

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass
class Change:
    """The decoded change of one tensor, ready to write: validated, nothing applied yet.

    Attributes:
        name: Tensor name.
        positions: Flat positions of the changed elements (int64), or None when `values` is the
            whole tensor (dense form): numpy arrays from the host path, tensors on the state's device from
            the device path.
        values: New bit patterns (an integer view of the tensor's dtype), one per position.
        sums: How the tensor's state-hash sums move (`delta.tensors._sumhash`) once the change is written,
            as `delta.decode` proved it from the old values at the positions and the new ones (None: not
            proven; `delta.write_changes` computes it from what it overwrites).
        digest: For a file of format version 2 (`xxh3-128` hashes): the tensor's digest after the change, as
            `delta.decode` proved it.
    """

    name: str
    positions: np.ndarray | torch.Tensor | None
    values: np.ndarray | torch.Tensor
    sums: tuple[int, int] | None = None
    digest: str | None = None


@dataclass
class Encoded:
    """What a codec wrote for a delta.

    Attributes:
        entries: The changed tensors, as the header lists them.
        blobs: The streams to store in the file.
        sums: Per changed tensor, how its state-hash sums moved (when the encoder was given keys).
    """

    entries: list[TensorEntry]
    blobs: dict[str, torch.Tensor]
    sums: dict[str, tuple[int, int]] | None = None


class Codec(ABC):
    """A way of storing the changed elements of tensors.

    State and threads: a codec holds its settings and nothing else, so one object serves any number of threads at
    once. What a call keeps for the next one is in the `Workspace` its caller passes (one call at a time each;
    none given: fresh memory for that call). A call runs on `workers` threads, the calling thread among them
    (`delta._cores`), all joined before it returns, and returns memory of its own, which no later call touches.
    """

    name: str
    description: str
    form: str  # the `form` of every table entry this codec writes

    @abstractmethod
    def stream_names(self, entries: tuple[TensorEntry, ...]) -> set[str]:
        """The names of exactly the streams a file of these entries holds (checked before loading them)."""

    @abstractmethod
    def check_streams(self, entries: tuple[TensorEntry, ...], blobs: Mapping[str, torch.Tensor]) -> None:
        """Check the streams' dtypes and shapes against the entries; decodes nothing.

        Raises:
            DeltaFormatError: a stream of another dtype, shape or length than the entries need.
        """

    @abstractmethod
    def check(
        self,
        entries: tuple[TensorEntry, ...],
        blobs: Mapping[str, torch.Tensor],
        workers: int | None = None,
        foreign: bool = False,
    ) -> str:
        """Check everything that can be checked without the reader's state; returns what that was (the
        words `python -m delta verify` prints without `--base`). `foreign`: a file with no shapes.

        Raises:
            DeltaFormatError: as `decode` would, for what it checks.
        """

    @abstractmethod
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
        """Encode the changes of `names` (same shape and dtype in both states), where the tensors live.

        Unchanged tensors are left out of the entries. Reads both states, modifies neither. `workers`:
        threads (None: one per core); `chunk`: elements per independently coded chunk, the unit of work the
        threads share (None: the codec's default); `keys`: hash the changes too (state-hash key per name), into
        `Encoded.sums`; `workspace`: memory kept from the caller's previous call.
        """

    @abstractmethod
    def decode(
        self,
        entries: tuple[TensorEntry, ...],
        blobs: Mapping[str, torch.Tensor],
        state: Mapping[str, torch.Tensor],
        workers: int | None = None,
        keys: Mapping[str, TensorKey] | None = None,
        workspace: Workspace | None = None,
    ) -> list[Change]:
        """Decode and validate every change against the reader's `state` (read only), where it lives.

        `keys`: also compute how each tensor's state-hash sums move (`Change.sums`), from the old values
        read at the changed positions and the new ones; `workspace`: as for `encode`.

        Raises:
            DeltaFormatError: a stream is malformed, or positions are out of range or unsorted.
        """

    @abstractmethod
    def tensor_bytes(self, entries: tuple[TensorEntry, ...], blobs: Mapping[str, torch.Tensor]) -> dict[str, int]:
        """Bytes each tensor costs on its own (streams shared by tensors are re-coded per tensor).

        Checks the streams' structure like `decode` does, without needing the reader's state.
        """

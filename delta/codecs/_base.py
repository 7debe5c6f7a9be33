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
    """One changed tensor as the header lists it: name, dtype name, full shape, `form` (`sparse`: ctx and gap streams;
    `indices`: positions and values; `dense`: the whole new tensor, a foreign anchor) and elements `changed`."""

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
    """The decoded change of one tensor, validated, nothing applied yet: flat `positions` (None: `values` is the whole
    tensor), the new bit patterns, and `sums`, how the tensor's state-hash sums move once written (None: not proven).
    Numpy arrays from the host path, tensors on the state's device from the device path."""

    name: str
    positions: np.ndarray | torch.Tensor | None
    values: np.ndarray | torch.Tensor
    sums: tuple[int, int] | None = None


@dataclass
class Encoded:
    """What a codec wrote for a delta: the header's `entries`, the `blobs` to store, and the `sums` per changed tensor
    (when the encoder was given keys)."""

    entries: list[TensorEntry]
    blobs: dict[str, torch.Tensor]
    sums: dict[str, tuple[int, int]] | None = None


class Codec(ABC):
    """A way of storing the changed elements of tensors. A codec holds its settings only, so one object serves any
    number of threads; what a call keeps for the next is in the caller's `Workspace`. A call runs on `workers`
    threads (`delta._cores`), joined before it returns."""

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
        """Check what can be checked without the reader's state; returns what that was (`python -m delta verify` prints
        it). `foreign`: a file with no shapes.

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
        """Encode the changes of `names` (same shape and dtype in both states), where the tensors live; unchanged
        tensors are left out. `chunk`: elements per independently coded chunk (None: the codec's default); `keys`: hash
        the changes too, into `Encoded.sums`."""

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
        """Decode and validate every change against the reader's `state` (read only), where it lives; with `keys`, also
        how each tensor's state-hash sums move (`Change.sums`).

        Raises:
            DeltaFormatError: a stream is malformed, or positions are out of range or unsorted.
        """

    @abstractmethod
    def tensor_bytes(self, entries: tuple[TensorEntry, ...], blobs: Mapping[str, torch.Tensor]) -> dict[str, int]:
        """Bytes each tensor costs on its own (shared streams re-coded per tensor), checked as `decode` does."""

"""What every codec does: turn (old, new) tensors into file blobs, and blobs back into changes."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch

from ..format import TensorEntry


@dataclass
class Change:
    """The decoded change of one tensor, ready to write: validated, nothing applied yet.

    Attributes:
        name: Tensor name.
        positions: Flat positions of the changed elements (int64), or None when `values` is the
            whole tensor (dense form).
        values: New bit patterns (unsigned view of the tensor's dtype), one per position.
        digest: The tensor's digest after the change, once `delta.decode` has proven it.
    """

    name: str
    positions: np.ndarray | None
    values: np.ndarray
    digest: str | None = None


class Codec(ABC):
    """A way of storing the changed elements of tensors. Stateless; safe to share between threads."""

    name: str
    description: str

    @abstractmethod
    def encode(self, old: Mapping[str, torch.Tensor], new: Mapping[str, torch.Tensor],
               names: list[str], progress: bool = False) -> tuple[list[TensorEntry], dict[str, torch.Tensor]]:
        """Encode the changes of `names` (same shape and dtype in both states).

        Returns the entries of tensors that changed (unchanged ones are left out) and the blobs to
        store in the file. Reads both states, modifies neither.
        """

    @abstractmethod
    def decode(self, entries: tuple[TensorEntry, ...], blobs: Mapping[str, torch.Tensor],
               state: Mapping[str, torch.Tensor]) -> list[Change]:
        """Decode and validate every change against the reader's `state` (read only).

        Raises:
            DeltaFormatError: a stream is malformed, or positions are out of range or unsorted.
        """

    @abstractmethod
    def tensor_bytes(self, entries: tuple[TensorEntry, ...], blobs: Mapping[str, torch.Tensor]) -> dict[str, int]:
        """Bytes each tensor costs on its own (streams shared by tensors are re-coded per tensor).

        Checks the streams' structure like `decode` does, without needing the reader's state.
        """

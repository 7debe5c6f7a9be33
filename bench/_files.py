"""Writing bf16 states as safetensors files, whole or streamed tensor by tensor, always atomically."""

import json
import struct
from collections.abc import Mapping
from types import TracebackType
from typing import BinaryIO

import torch
from safetensors.torch import save_file

from delta.atomic import atomic_path

#: `format: pt` lets a step file stand in for a model folder's model.safetensors.
FILE_METADATA = {"format": "pt"}
_DTYPE_NAMES = {torch.bfloat16: "BF16", torch.float16: "F16", torch.float32: "F32"}


def step_file_name(step: int) -> str:
    """File name of the published state after `step` optimizer steps (0 = initial state)."""
    return f"step_{step:04d}.safetensors"


def save_state(state: Mapping[str, torch.Tensor], path: str) -> None:
    """Write a whole state with safetensors; a crash leaves no file at `path`, never a torn one."""
    with atomic_path(path) as tmp:
        save_file({name: t.contiguous() for name, t in state.items()}, str(tmp), metadata=FILE_METADATA)


class StreamingWriter:
    """Writes one safetensors file tensor by tensor, so a state larger than memory can be produced.

    The header is computed from the shapes up front; tensors must then be written in `shapes` order.
    Use it as a context manager: data goes to a temporary file (`delta.atomic.atomic_path`) that replaces
    `path` on a clean exit once every tensor arrived, and is deleted if the block raises.
    """

    def __init__(self, path: str, shapes: Mapping[str, tuple[int, ...]], dtype: torch.dtype) -> None:
        self.path = path
        self._dtype = dtype
        self._shapes = {name: tuple(shape) for name, shape in shapes.items()}
        self._order = list(self._shapes)
        self._next = 0
        header: dict[str, object] = {"__metadata__": FILE_METADATA}
        offset = 0
        for name, shape in shapes.items():
            size = dtype.itemsize * int(torch.Size(shape).numel())
            header[name] = {"dtype": _DTYPE_NAMES[dtype], "shape": list(shape), "data_offsets": [offset, offset + size]}
            offset += size
        encoded = json.dumps(header, separators=(",", ":")).encode("utf-8")
        encoded += b" " * (-len(encoded) % 8)  # the data section starts 8-byte aligned
        self._atomic = atomic_path(path)
        self._file: BinaryIO = open(self._atomic.__enter__(), "wb")  # noqa: SIM115 - closed on leaving the writer's block
        self._file.write(struct.pack("<Q", len(encoded)) + encoded)

    def write(self, name: str, tensor: torch.Tensor) -> None:
        """Append the next tensor; it must be the one `shapes` lists next, with that shape and dtype."""
        expected = self._order[self._next] if self._next < len(self._order) else None
        if name != expected or tensor.dtype != self._dtype or tuple(tensor.shape) != self._shapes[name]:
            raise ValueError(
                f"{self.path}: expected tensor {expected!r} {self._shapes.get(expected or '')} in {self._dtype}, "
                f"got {name!r} {tuple(tensor.shape)} in {tensor.dtype}"
            )
        self._file.write(tensor.contiguous().view(torch.uint8).numpy().data)
        self._next += 1

    def __enter__(self) -> "StreamingWriter":
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._file.close()
        if exc_type is None and self._next < len(self._order):
            exc = ValueError(f"{self.path}: {len(self._order) - self._next} tensors were never written")
            self._atomic.__exit__(ValueError, exc, None)  # removes the temporary file
            raise exc
        self._atomic.__exit__(exc_type, exc, tb)  # replaces `path` only when nothing failed

"""The codecs a delta can be written with; `ctx` is the default.

A codec turns the changed elements of each tensor into streams (`_raw`: positions and values; `_chunked`:
rANS-coded (`_rans`) gaps and steps from compiled chunk scans (`_kernels`), a thread's share of the
chunks in one compiled call, stage by stage: `_found`, `_models`, `_plan` to write, `_parsed`, `_decode` to
read) and back; on a device, whole groups of tensors at once (`_device_scan`, `_raw_groups`). Memory kept
between calls is the caller's `Workspace`. It knows nothing of the file around them (`delta.format`).
"""

from __future__ import annotations

from .._cores import default_workers
from ._base import Change, Codec, TensorEntry
from ._chunked import ChunkedCodec
from ._raw import RawCodec
from ._workspace import Workspace

CODECS: dict[str, Codec] = {c.name: c for c in (ChunkedCodec(context=True), ChunkedCodec(context=False), RawCodec())}
DEFAULT_CODEC = "ctx"


def get_codec(name: str) -> Codec:
    """The codec called `name`; ValueError listing the known ones otherwise."""
    try:
        return CODECS[name]
    except KeyError:
        raise ValueError(f"unknown codec {name!r}; choose one of {sorted(CODECS)}") from None


__all__ = ["CODECS", "DEFAULT_CODEC", "Change", "Codec", "TensorEntry", "Workspace", "default_workers", "get_codec"]

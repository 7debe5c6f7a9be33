"""One delta file as bytes: write ours, read ours or another program's (`_foreign`), streams checked by
their codec before anything is decoded (docs/delta.md, "The delta format")."""

from __future__ import annotations

import json
import struct

import torch

from ..codecs import CODECS
from ..errors import DeltaFormatError
from ..tensors.bits import bits
from . import _foreign
from .header import (
    FORMAT_NAME,
    FORMAT_VERSION,
    MAX_HEADER_BYTES,
    DeltaHeader,
    load_tensors,
    own_header,
    read_header_json,
    shown,
)

_ST_DTYPES = {
    torch.bool: "BOOL",
    torch.uint8: "U8",
    torch.int8: "I8",
    torch.int16: "I16",
    torch.int32: "I32",
    torch.int64: "I64",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float32: "F32",
    torch.float64: "F64",
    torch.float8_e4m3fn: "F8_E4M3",
    torch.float8_e4m3fnuz: "F8_E4M3FNUZ",
    torch.float8_e5m2: "F8_E5M2",
    torch.float8_e5m2fnuz: "F8_E5M2FNUZ",
}


def _opt_int(value: int | None) -> str:
    return "" if value is None else str(value)


def write_delta(header: DeltaHeader, blobs: dict[str, torch.Tensor]) -> bytes:
    """Serialise a delta: deterministic bytes for the same header and blobs, whatever the dict order."""
    meta = {
        "format": FORMAT_NAME,
        "format_version": str(FORMAT_VERSION),
        "codec": header.codec,
        "version": _opt_int(header.version),
        "base_version": _opt_int(header.base_version),
        "changed": str(header.changed),
        "total": str(header.total),
        "base_hash": header.base_hash,
        "target_hash": header.target_hash,
        "tensors": json.dumps(
            [
                {"name": t.name, "dtype": t.dtype, "shape": list(t.shape), "form": t.form, "changed": t.changed}
                for t in sorted(header.tensors, key=lambda t: t.name)
            ],
            separators=(",", ":"),
        ),  # TensorEntry's fields in order (asdict copies every field deeply)
    }
    return serialize_safetensors(blobs, meta)


def serialize_safetensors(tensors: dict[str, torch.Tensor], metadata: dict[str, str]) -> bytes:
    """A safetensors file with sorted JSON keys and tensors in name order: same input, same bytes.

    (safetensors' own writer orders metadata through a hash map, so its bytes vary between calls.)
    """
    header: dict[str, object] = {"__metadata__": dict(sorted(metadata.items()))}
    chunks, offset = [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        data = bits(t).tobytes()
        header[name] = {
            "dtype": _ST_DTYPES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":"), sort_keys=False).encode()
    text += b" " * (-len(text) % 8)
    return b"".join([struct.pack("<Q", len(text)), text, *chunks])


def read_delta(
    data: bytes | memoryview, path: str | None = None, *, max_header: int = MAX_HEADER_BYTES
) -> tuple[DeltaHeader, dict[str, torch.Tensor]]:
    """Parse a delta file: header checked whole, then the streams' names, dtypes and shapes, then loaded.

    Args:
        max_header: Largest header accepted (`header_limit` of the reader's state, when it has one).

    Raises:
        DeltaFormatError: not safetensors, truncated, another format or an unsupported format version,
            or any field of the header out of the format (the message names it).
    """
    raw_header = read_header_json(data, path, max_header)
    meta = raw_header.get("__metadata__", {})
    names = sorted(k for k in raw_header if k != "__metadata__")
    if meta.get("format") != FORMAT_NAME:
        return _foreign.read(meta, names, data, path)  # files from other software
    header = own_header(meta, path)
    codec = CODECS[header.codec]
    expected = codec.stream_names(header.tensors)
    if set(names) != expected:
        missing, extra = sorted(expected - set(names)), sorted(set(names) - expected)
        raise DeltaFormatError(
            f"streams do not match the header: {'missing ' + shown(missing, 80) if missing else ''}"
            f"{', ' if missing and extra else ''}"
            f"{'not listed by it ' + shown(extra, 80) if extra else ''}",
            path=path,
        )
    blobs = load_tensors(data, path)
    try:
        codec.check_streams(header.tensors, blobs)
    except DeltaFormatError as e:
        raise e.at(path) from None
    return header, blobs

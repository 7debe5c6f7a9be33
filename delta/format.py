"""One delta file: a plain safetensors file whose `__metadata__` says what it is.

Layout (see README, "The delta format"): 8-byte little-endian header length, a JSON header, then
tensor bytes. Our header metadata carries the format name and version, the codec, model and base
versions, element counts, base and target state hashes, and a JSON table of the changed tensors.
Files written by other software (TRL's blog layout and its `sparse_weight_patch` files, see
`_foreign`) are read as codec `raw` without hashes.
"""

from __future__ import annotations

import json
import struct
from dataclasses import asdict, dataclass, field

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load

from .bits import bits

from .errors import DeltaFormatError

FORMAT_NAME = "delta-weights"
FORMAT_VERSION = 2
MAX_HEADER_BYTES = 100 * 1024 * 1024
_ST_DTYPES = {
    torch.bool: "BOOL", torch.uint8: "U8", torch.int8: "I8", torch.int16: "I16", torch.int32: "I32",
    torch.int64: "I64", torch.float16: "F16", torch.bfloat16: "BF16", torch.float32: "F32", torch.float64: "F64",
    torch.float8_e4m3fn: "F8_E4M3", torch.float8_e4m3fnuz: "F8_E4M3FNUZ", torch.float8_e5m2: "F8_E5M2",
    torch.float8_e5m2fnuz: "F8_E5M2FNUZ",
}


@dataclass(frozen=True)
class TensorEntry:
    """One changed tensor as the header lists it.

    Attributes:
        name: Tensor name in the state.
        dtype: Dtype name (`bfloat16`, `float32`, ...).
        shape: Shape of the full tensor.
        form: How the codec stored it (`sparse`, `dense`, `indices`).
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


@dataclass(frozen=True)
class DeltaHeader:
    """Everything the header metadata of a delta file says.

    Attributes:
        codec: Codec name.
        version: Model version this delta produces (None if unknown, e.g. foreign files).
        base_version: Model version it applies to.
        changed: Changed elements in all.
        total: Elements in the whole state.
        base_hash: State hash the delta applies to ('' when unknown).
        target_hash: State hash after applying ('' when unknown).
        tensors: The changed tensors, sorted by name.
        foreign: True for a file written by other software (TRL's layouts): no hashes, no shapes.
    """

    codec: str
    version: int | None
    base_version: int | None
    changed: int
    total: int
    base_hash: str
    target_hash: str
    tensors: tuple[TensorEntry, ...] = field(default_factory=tuple)
    foreign: bool = False

    @property
    def density(self) -> float:
        return self.changed / self.total if self.total else 0.0


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
        "tensors": json.dumps([asdict(t) for t in sorted(header.tensors, key=lambda t: t.name)],
                              separators=(",", ":")),
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
        header[name] = {"dtype": _ST_DTYPES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":"), sort_keys=False).encode()
    text += b" " * (-len(text) % 8)
    return b"".join([struct.pack("<Q", len(text)), text, *chunks])


def read_header_json(data: bytes | memoryview, path: str | None = None) -> dict:
    """The raw JSON header of a safetensors buffer, with truncation reported clearly."""
    if len(data) < 8:
        raise DeltaFormatError(f"file is {len(data)} bytes, too short for a safetensors header", path=path)
    (n,) = struct.unpack("<Q", bytes(data[:8]))
    if n > MAX_HEADER_BYTES or 8 + n > len(data):
        raise DeltaFormatError(f"header length {n} does not fit the {len(data)}-byte file (truncated?)", path=path)
    try:
        header = json.loads(bytes(data[8:8 + n]))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DeltaFormatError(f"header is not valid JSON: {e}", path=path) from e
    if not isinstance(header, dict):
        raise DeltaFormatError("header is not a JSON object", path=path)
    return header


def read_delta(data: bytes | memoryview, path: str | None = None) -> tuple[DeltaHeader, dict[str, torch.Tensor]]:
    """Parse a delta file fully: header checked, tensors loaded (zero-copy where safetensors allows).

    Raises:
        DeltaFormatError: not safetensors, truncated, another format or an unsupported format version.
    """
    raw_header = read_header_json(data, path)
    try:
        blobs = st_load(bytes(data))
    except (SafetensorError, ValueError, RuntimeError, KeyError) as e:
        raise DeltaFormatError(f"not a valid safetensors file: {e}", path=path) from e
    meta = raw_header.get("__metadata__") or {}
    if meta.get("format") != FORMAT_NAME:
        from . import _foreign  # files from other software; imported here, as it builds on this module

        if _foreign.is_blog_layout(meta, blobs):
            return _foreign.blog_layout(blobs, path), blobs
        if meta.get("format") == _foreign.PATCH_FORMAT:
            return _foreign.sparse_weight_patch(meta, blobs, path)
        raise DeltaFormatError(
            f"metadata 'format' is {meta.get('format')!r}, expected {FORMAT_NAME!r}: not a delta file", path=path)
    if meta.get("format_version") != str(FORMAT_VERSION):
        found = meta.get("format_version")
        hint = ("it was written by an older `delta` (before chunked coding): publish an anchor with this version "
                "and follow from there" if found == "1" else "upgrade the `delta` package")
        raise DeltaFormatError(
            f"format version {found!r} is not supported by this reader (supports {FORMAT_VERSION}); {hint}", path=path)
    try:
        tensors = tuple(TensorEntry(name=t["name"], dtype=t["dtype"], shape=tuple(int(d) for d in t["shape"]),
                                    form=t["form"], changed=int(t["changed"])) for t in json.loads(meta["tensors"]))
        header = DeltaHeader(
            codec=meta["codec"],
            version=int(meta["version"]) if meta["version"] else None,
            base_version=int(meta["base_version"]) if meta["base_version"] else None,
            changed=int(meta["changed"]), total=int(meta["total"]),
            base_hash=meta["base_hash"], target_hash=meta["target_hash"], tensors=tensors)
    except (KeyError, TypeError, ValueError) as e:
        raise DeltaFormatError(f"metadata is incomplete or malformed: {e!r}", path=path) from e
    if sum(t.changed for t in tensors) != header.changed:
        raise DeltaFormatError(f"tensor table counts {sum(t.changed for t in tensors)} changed elements, "
                               f"the header says {header.changed}", path=path)
    return header, blobs

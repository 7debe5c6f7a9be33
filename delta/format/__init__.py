"""The delta file format: a plain safetensors file whose header metadata says what it holds.

`header` checks and parses the metadata (limits, canonical numbers, the table of changed tensors);
`file` writes our files and reads ours or, through `_foreign`, the layouts TRL wrote; the streams inside
belong to a codec (`delta.codecs`). docs/delta.md, "The delta format", is the specification.
"""

from ._foreign import prove_checksum
from .file import read_delta, serialize_safetensors, write_delta
from .header import (
    FORMAT_NAME,
    FORMAT_VERSION,
    MAX_HEADER_BYTES,
    DeltaHeader,
    TensorEntry,
    header_limit,
    read_header_json,
)

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "MAX_HEADER_BYTES",
    "DeltaHeader",
    "TensorEntry",
    "header_limit",
    "prove_checksum",
    "read_delta",
    "read_header_json",
    "serialize_safetensors",
    "write_delta",
]

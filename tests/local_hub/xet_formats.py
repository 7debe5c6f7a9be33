"""Xet's binary formats as the CAS receives them: xorbs (compressed chunks) and shards (file → xorb ranges).

The server never trusts the client's own bookkeeping about where a chunk starts: it walks a xorb's chunk headers to
learn each chunk's byte offset, because a reconstruction must hand back byte ranges that start on chunk headers.
The layouts are xet-core's (`xet_core_structures/src/xorb_object/xorb_chunk_format.rs`,
`xorb_object_format.rs`, `metadata_shard/shard_format.rs`, `file_structs.rs`, `xorb_structs.rs`); nothing here is
copied from it, it is read back from what hf_xet sends.

A xorb is a run of chunks followed by a footer (ident `XETBLOB`, chunk hashes, boundaries). Each chunk is an
8-byte header (version u8 = 0, compressed length u24 LE, compression scheme u8, uncompressed length u24 LE) and its
compressed bytes.

A shard is a 48-byte header (32-byte tag, version u64, footer size u64), the file-info section, the xorb-info
section, lookup tables and a 200-byte footer. The file-info section holds, per file, a 48-byte header (file hash,
flags u32, entry count u32, unused u64), that many 48-byte entries (xorb hash, xorb flags u32, unpacked bytes u32,
chunk index start u32, chunk index end u32, end exclusive), then as many verification entries if flag bit 31 is
set and one metadata entry (SHA-256) if bit 30 is set. A header whose hash is all 0xFF bytes ends the section; the
xorb-info section follows, built the same way with 48-byte chunk entries.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

HASH_BYTES = 32
CHUNK_HEADER_BYTES = 8
SHARD_HEADER_BYTES = 48
SHARD_ENTRY_BYTES = 48
SHARD_TAG = b"HFRepoMetaData\x00" + bytes(
    [85, 105, 103, 69, 106, 123, 129, 87, 131, 165, 189, 217, 92, 205, 209, 74, 169]
)
XORB_FOOTER_IDENT = b"XETBLOB"
_BOOKEND = b"\xff" * HASH_BYTES
_FLAG_VERIFICATION = 1 << 31
_FLAG_METADATA_EXT = 1 << 30
#: Compression schemes a chunk header may name (xet-core's `CompressionScheme`).
COMPRESSION_SCHEMES = {0: "none", 1: "lz4", 2: "bg4-lz4"}


class XetFormatError(ValueError):
    """Bytes that are not a well-formed xorb or shard; the CAS answers 400 with this message."""


def hash_hex(raw: bytes) -> str:
    """Xet's hex form of a 32-byte hash: four little-endian u64 words, each printed as 16 hex digits.

    This is not `raw.hex()`: xet-core prints the words (`DataHash::hex`), so the bytes of each 8-byte group come out
    reversed. Every hash the clients send in URLs and JSON is in this form.
    """
    if len(raw) != HASH_BYTES:
        raise XetFormatError(f"a Xet hash has {HASH_BYTES} bytes, got {len(raw)}")
    return "".join(f"{word:016x}" for word in struct.unpack("<4Q", raw))


def is_hash_hex(text: str) -> bool:
    """True for 64 lowercase or uppercase hex digits, the only form a Xet hash takes in a URL."""
    return len(text) == 64 and all(c in "0123456789abcdefABCDEF" for c in text)


@dataclass(frozen=True)
class ChunkHeader:
    """One chunk's 8-byte header."""

    compressed: int
    scheme: int
    uncompressed: int


@dataclass(frozen=True)
class XorbLayout:
    """Where each chunk of a xorb lies.

    Attributes:
        offsets: Byte offset of each chunk's header, and one more: the end of the last chunk (the footer's start).
            Chunks `[a, b)` are the bytes `offsets[a]:offsets[b]`.
        unpacked: Uncompressed size of each chunk.
        schemes: Compression scheme of each chunk (see `COMPRESSION_SCHEMES`).
    """

    offsets: tuple[int, ...]
    unpacked: tuple[int, ...]
    schemes: tuple[int, ...]

    @property
    def num_chunks(self) -> int:
        return len(self.unpacked)


def parse_xorb(data: bytes) -> XorbLayout:
    """Walk a serialized xorb's chunk headers up to its footer (or its end when it has none).

    Raises:
        XetFormatError: A header names an unknown version or scheme, or a chunk runs past the end.
    """
    offsets, unpacked, schemes = [0], [], []
    position = 0
    while position < len(data) and not data.startswith(XORB_FOOTER_IDENT, position):
        header = read_chunk_header(data, position)
        position += CHUNK_HEADER_BYTES + header.compressed
        if position > len(data):
            raise XetFormatError(f"chunk {len(unpacked)} runs past the end of the xorb ({position} > {len(data)})")
        offsets.append(position)
        unpacked.append(header.uncompressed)
        schemes.append(header.scheme)
    if not unpacked:
        raise XetFormatError("a xorb holds at least one chunk")
    return XorbLayout(tuple(offsets), tuple(unpacked), tuple(schemes))


def read_chunk_header(data: bytes, position: int) -> ChunkHeader:
    """The chunk header at `position`.

    Raises:
        XetFormatError: Fewer than 8 bytes left, a version other than 0, or an unknown scheme.
    """
    raw = data[position : position + CHUNK_HEADER_BYTES]
    if len(raw) < CHUNK_HEADER_BYTES:
        raise XetFormatError(f"truncated chunk header at byte {position}")
    version, scheme = raw[0], raw[4]
    if version != 0:
        raise XetFormatError(f"chunk header version {version} at byte {position}; only version 0 is known")
    if scheme not in COMPRESSION_SCHEMES:
        raise XetFormatError(f"unknown compression scheme {scheme} at byte {position}")
    compressed = int.from_bytes(raw[1:4], "little")
    uncompressed = int.from_bytes(raw[5:8], "little")
    return ChunkHeader(compressed, scheme, uncompressed)


@dataclass(frozen=True)
class Segment:
    """A run of chunks `[start, end)` of one xorb, part of a file."""

    xorb: str
    start: int
    end: int
    unpacked: int


@dataclass(frozen=True)
class ShardFile:
    """A file a shard describes: its Xet hash and the xorb ranges that make it up, in order."""

    file_hash: str
    segments: tuple[Segment, ...]

    @property
    def size(self) -> int:
        return sum(s.unpacked for s in self.segments)


@dataclass(frozen=True)
class ShardXorb:
    """A xorb a shard lists in its xorb-info section (the xorbs uploaded in the same session)."""

    xorb: str
    num_chunks: int
    num_bytes: int


@dataclass(frozen=True)
class Shard:
    files: tuple[ShardFile, ...]
    xorbs: tuple[ShardXorb, ...]


def parse_shard(data: bytes) -> Shard:
    """Read the file-info and xorb-info sections of a shard, in order, from right after its header.

    Raises:
        XetFormatError: Wrong tag, truncated sections, or a segment whose chunk range is empty or reversed.
    """
    if len(data) < SHARD_HEADER_BYTES or not data.startswith(SHARD_TAG):
        raise XetFormatError("not a shard: the 32-byte tag does not match")
    position = SHARD_HEADER_BYTES
    files = []
    while True:
        file_hash, flags, count = _entry(data, position, "<IIQ")[:3]
        position += SHARD_ENTRY_BYTES
        if file_hash is None:
            break
        segments = []
        for _ in range(count):
            xorb, _flags, unpacked, start, end = _entry(data, position, "<IIII")
            position += SHARD_ENTRY_BYTES
            if xorb is None or end <= start:
                raise XetFormatError(f"file {file_hash}: bad segment chunks [{start}, {end}) at byte {position}")
            segments.append(Segment(xorb, start, end, unpacked))
        position += SHARD_ENTRY_BYTES * (count if flags & _FLAG_VERIFICATION else 0)
        position += SHARD_ENTRY_BYTES * (1 if flags & _FLAG_METADATA_EXT else 0)
        files.append(ShardFile(file_hash, tuple(segments)))
    xorbs = []
    while True:
        xorb, _flags, count, num_bytes, _on_disk = _entry(data, position, "<IIII")
        position += SHARD_ENTRY_BYTES
        if xorb is None:
            break
        position += SHARD_ENTRY_BYTES * count
        xorbs.append(ShardXorb(xorb, count, num_bytes))
    return Shard(tuple(files), tuple(xorbs))


def _entry(data: bytes, position: int, tail: str) -> tuple:
    """A 48-byte shard entry: its hash in hex (None for a bookend) followed by the 16 bytes after it unpacked."""
    raw = data[position : position + SHARD_ENTRY_BYTES]
    if len(raw) < SHARD_ENTRY_BYTES:
        raise XetFormatError(f"shard truncated at byte {position}")
    head = None if raw[:HASH_BYTES] == _BOOKEND else hash_hex(raw[:HASH_BYTES])
    return (head, *struct.unpack(tail, raw[HASH_BYTES:]))

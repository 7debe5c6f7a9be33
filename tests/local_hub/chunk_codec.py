"""Decompress xorb chunks in pure Python, so the server can serve `GET .../resolve/...` and tests can check what
hf_xet stored without trusting hf_xet to read it back.

The `lz4` package is not among the project's requirements, and only decompression is needed, so the LZ4 frame
format (what xet-core's `lz4_flex::frame` writes) is decoded here. Scheme 2 ("bg4-lz4") is LZ4 over the bytes
regrouped in four streams: byte i of the chunk went to stream i % 4, the streams concatenated, the first
`len % 4` streams one byte longer. Slow (a few MB/s): fine for test-sized files.
"""

from __future__ import annotations

from .xet_formats import CHUNK_HEADER_BYTES, XetFormatError, XorbLayout, read_chunk_header

_LZ4_FRAME_MAGIC = 0x184D2204


def decode_chunks(xorb: bytes, layout: XorbLayout, start: int, end: int) -> bytes:
    """The uncompressed bytes of chunks `[start, end)` of a xorb, concatenated."""
    out = bytearray()
    for index in range(start, end):
        position = layout.offsets[index]
        header = read_chunk_header(xorb, position)
        body = xorb[position + CHUNK_HEADER_BYTES : position + CHUNK_HEADER_BYTES + header.compressed]
        data = decode_chunk(header.scheme, body)
        if len(data) != header.uncompressed:
            raise XetFormatError(f"chunk {index} decodes to {len(data)} bytes, its header says {header.uncompressed}")
        out += data
    return bytes(out)


def decode_chunk(scheme: int, body: bytes) -> bytes:
    """One chunk's bytes under compression `scheme` (0 none, 1 LZ4 frame, 2 byte-grouped LZ4 frame)."""
    if scheme == 0:
        return bytes(body)
    if scheme == 1:
        return lz4_frame_decode(body)
    if scheme == 2:
        return _bg4_regroup(lz4_frame_decode(body))
    raise XetFormatError(f"unknown compression scheme {scheme}")


def _bg4_regroup(grouped: bytes) -> bytes:
    n = len(grouped)
    split, rem = divmod(n, 4)
    out = bytearray(n)
    position = 0
    for lane in range(4):
        length = split + (1 if lane < rem else 0)
        out[lane::4] = grouped[position : position + length]
        position += length
    return bytes(out)


def lz4_frame_decode(frame: bytes) -> bytes:
    """Decode one LZ4 frame (no dictionary). Checksums are skipped, not verified.

    Raises:
        XetFormatError: Not an LZ4 frame, or a block that references bytes before the start.
    """
    if len(frame) < 7 or int.from_bytes(frame[:4], "little") != _LZ4_FRAME_MAGIC:
        raise XetFormatError("not an LZ4 frame")
    flags = frame[4]
    if flags >> 6 != 1:
        raise XetFormatError(f"LZ4 frame version {flags >> 6}; only version 1 is known")
    block_checksum, content_size, content_checksum, dict_id = flags & 0x10, flags & 0x08, flags & 0x04, flags & 0x01
    position = 6 + (8 if content_size else 0) + (4 if dict_id else 0) + 1  # FLG, BD, options, header checksum
    out = bytearray()
    while True:
        size = int.from_bytes(frame[position : position + 4], "little")
        position += 4
        if size == 0:
            break
        raw, size = size & 0x80000000, size & 0x7FFFFFFF
        block = frame[position : position + size]
        position += size + (4 if block_checksum else 0)
        if raw:
            out += block
        else:
            _lz4_block_decode(block, out)
    del content_checksum  # present after the end mark when set; not verified
    return bytes(out)


def _lz4_block_decode(block: bytes, out: bytearray) -> None:
    """Append one LZ4 block's output to `out`; matches may reach into earlier blocks (linked blocks)."""
    i, n = 0, len(block)
    while i < n:
        token = block[i]
        i += 1
        literals = token >> 4
        if literals == 15:
            while True:
                extra = block[i]
                i += 1
                literals += extra
                if extra != 255:
                    break
        out += block[i : i + literals]
        i += literals
        if i >= n:
            return  # the last sequence has literals only
        offset = block[i] | (block[i + 1] << 8)
        i += 2
        length = token & 15
        if length == 15:
            while True:
                extra = block[i]
                i += 1
                length += extra
                if extra != 255:
                    break
        length += 4
        start = len(out) - offset
        if offset == 0 or start < 0:
            raise XetFormatError(f"LZ4 match offset {offset} reaches before the start")
        if offset >= length:
            out += out[start : start + length]
        else:  # overlapping copy: the match repeats the last `offset` bytes
            pattern = out[start:]
            out += (pattern * (length // offset + 1))[:length]

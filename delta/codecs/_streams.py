"""Integer streams as byte planes under zstd: the entropy stage shared by the compact codecs.

Splitting an array of small integers into byte planes (all low bytes, then all next bytes ...) puts
the informative bytes together and turns the mostly-zero high bytes into long runs zstd removes.
"""

from __future__ import annotations

import numpy as np
import zstandard

from ..errors import DeltaFormatError

ZSTD_LEVEL = 9


def pack(values: np.ndarray, level: int = ZSTD_LEVEL, threads: int = -1) -> bytes:
    """Compress a 1-D unsigned integer array as byte planes (little-endian) under zstd, on `threads` of zstd's
    threads (-1: one per core). zstd writes the same bytes for any number of threads from 1 up (not for 0, its
    single-threaded mode, which is never used here)."""
    planes = np.ascontiguousarray(
        values.astype(values.dtype.newbyteorder("<"), copy=False).view(np.uint8).reshape(-1, values.dtype.itemsize).T
    )
    return zstandard.ZstdCompressor(level=level, threads=threads).compress(planes.tobytes())


def unpack(
    blob: bytes | memoryview, dtype: type[np.unsignedinteger], count: int | None, what: str, max_count: int = 0
) -> np.ndarray:
    """Inverse of `pack`.

    Args:
        count: How many values the header promises, checked exactly; None when the stream's own
            length decides, up to `max_count` values.

    Raises:
        DeltaFormatError: the stream is not one zstd frame with nothing after it, is truncated, declares
            no size or a larger one than allowed, or holds another number of values.
    """
    itemsize = np.dtype(dtype).itemsize
    limit = (count if count is not None else max_count) * itemsize
    if not len(blob):
        raw = b""
    else:
        try:
            declared = zstandard.frame_content_size(bytes(blob[:18]))
        except zstandard.ZstdError as e:
            raise DeltaFormatError(f"stream {what!r} is not a zstd frame ({e})") from e
        # Checked before decompressing: nothing the size of a forged claim is ever allocated.
        if declared < 0 or declared > limit:
            raise DeltaFormatError(
                f"stream {what!r} declares {'no size' if declared < 0 else f'{declared} bytes'}, "
                f"the header allows {'exactly ' if count is not None else 'at most '}{limit}"
            )
        try:
            # One frame and nothing after it: a stream is exactly its frame (allow_extra_data needs zstandard 0.22).
            raw = zstandard.ZstdDecompressor().decompress(bytes(blob), max_output_size=declared, allow_extra_data=False)
        except zstandard.ZstdError as e:
            raise DeltaFormatError(f"stream {what!r} is corrupt or has bytes after its zstd frame ({e})") from e
    if (count is not None and len(raw) != limit) or len(raw) > limit or len(raw) % itemsize:
        raise DeltaFormatError(
            f"stream {what!r} holds {len(raw)} bytes, the header allows "
            f"{'exactly ' if count is not None else 'at most '}{limit}"
        )
    count = len(raw) // itemsize
    planes = np.frombuffer(raw, np.uint8).reshape(itemsize, count)
    return np.ascontiguousarray(planes.T).view(np.dtype(dtype).newbyteorder("<")).reshape(-1).astype(dtype, copy=False)

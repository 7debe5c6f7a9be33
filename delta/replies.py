"""An HTTP reply read whole within bounds: every HTTP client of this project (the vLLM client here, the apps' clients
of each other) takes a reply through `read_reply`, so no server, however broken or hostile, makes one grow a
client's memory without bound (an endless reply) or hold it without end (a reply sent a byte at a time, each within
the per-read timeout).
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from .errors import ReplyLimitError

__all__ = ["ReplyLimitError", "read_reply"]


def read_reply(chunks: Iterable[bytes], *, max_bytes: int, deadline: float) -> bytes:
    """The whole body of a reply, from `chunks` as they arrive, refused past `max_bytes` or `deadline`.

    Args:
        chunks: The body's pieces as the connection gives them, each as soon as it is there (urllib's `read1`,
            httpx's `iter_bytes`): a piece that waits to fill up would let a slow sender past the deadline.
        max_bytes: Most bytes taken; the piece that goes past is not kept.
        deadline: `time.monotonic()` by which the reply must have ended. A read in progress at the deadline ends
            within the connection's per-read timeout (checked after each piece).

    Raises:
        ReplyLimitError: more than `max_bytes`, or a piece after `deadline`; the message says which, in one line.
    """
    parts, size = [], 0
    for chunk in chunks:
        size += len(chunk)
        if size > max_bytes:
            raise ReplyLimitError(f"a reply over {max_bytes:,} bytes", limit="size")
        if time.monotonic() > deadline:
            raise ReplyLimitError(f"a reply still coming at its deadline ({size:,} bytes so far)", limit="time")
        parts.append(chunk)
    return b"".join(parts)

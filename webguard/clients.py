"""Who is calling, for per-client limits: the address the Space's proxy reports, or the peer's.

Behind a Hugging Face Space's proxy every request comes from the proxy, which appends the address it
received the request from to ``X-Forwarded-For``. Entries to the left of it were written by the
caller and can be anything, so only the rightmost entry is trusted. Without a proxy in front (a
local run) the header is the caller's own words and is ignored: the peer address is used.
"""

from __future__ import annotations

from collections.abc import Mapping


def client_address(headers: Mapping[str, str], peer: str | None, trust_forwarded: bool) -> str:
    """The caller's address: the last ``X-Forwarded-For`` entry when ``trust_forwarded`` (behind the
    Space's proxy), else the peer address (``"unknown"`` when the server does not know it)."""
    if trust_forwarded:
        last = (headers.get("x-forwarded-for") or "").rsplit(",", 1)[-1].strip()
        if last:
            return last[:64]
    return peer or "unknown"

"""What the Hub's HTTP replies say about the account's rate limit, seen as huggingface_hub receives them.

huggingface_hub sends every Hub request through one shared HTTP client (`huggingface_hub.utils.get_session`); a
response hook on it counts the requests a bucket call makes, by the Hub's classes (`/resolve/` requests are
"resolver", every other Hub route "api"), and keeps the limit each reply's `RateLimit` headers report. It acts only
inside a call of `HfBucketStorage` (`counting`): other users of huggingface_hub in the process are left alone.

A 429 inside such a call is turned into `RateLimitedReply` on the spot. huggingface_hub would otherwise wait and ask
again on its own, up to five times for up to a whole window each (25 minutes in one call), invisible to the pages and
to the other roles of the process; raised here, the storage holds every caller back until the time the Hub named
(`Traffic.throttle`) and the loops above wait for it, shown as rate-limited.

hf_xet's own requests (its Xet storage calls, and a token it refreshes itself) are not seen here: `_hf_xet` counts
its transfers.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

from ._traffic import RateLimit, Traffic

_COUNTING: ContextVar[Traffic | None] = ContextVar("delta_hf_traffic", default=None)
_INSTALL_LOCK = threading.Lock()


class RateLimitedReply(Exception):
    """A 429 answered to a request of a bucket call (raised from the response hook, before huggingface_hub retries).

    Attributes:
        wait_s: Seconds the Hub asked to wait (`RateLimit`'s `t`, else `Retry-After`), or None where it named none.
        text: What the reply said, for the message.
    """

    def __init__(self, wait_s: float | None, text: str) -> None:
        super().__init__(text)
        self.wait_s = wait_s
        self.text = text


@contextlib.contextmanager
def counting(traffic: Traffic) -> Iterator[None]:
    """Count the Hub requests made inside the block into `traffic`, and raise `RateLimitedReply` on a 429."""
    _install()
    reset = _COUNTING.set(traffic)
    try:
        yield
    finally:
        _COUNTING.reset(reset)


def _install() -> None:
    """Put the hook on huggingface_hub's current client (a new client is made after a connection error, hence on
    every call; cheap when it is there)."""
    from huggingface_hub.utils import get_session

    client = get_session()
    hooks = client.event_hooks
    if _on_response in hooks.get("response", []):
        return
    with _INSTALL_LOCK:
        hooks = client.event_hooks
        if _on_response not in hooks.get("response", []):
            client.event_hooks = {**hooks, "response": [*hooks.get("response", []), _on_response]}


def request_class(path: str) -> str:
    """The Hub's class of a request to `path`: "resolver" for `/resolve/` URLs, else "api"."""
    return "resolver" if "/resolve/" in path else "api"


def _on_response(response: Any) -> None:
    traffic = _COUNTING.get()
    if traffic is None:
        return
    traffic.count(request_class(response.request.url.path))
    limit = rate_limit(response.headers)
    if limit is not None:
        traffic.saw_limit(limit)
    if response.status_code == 429:
        wait = retry_after(response.headers, limit)
        told = f"{limit.resource} quota {limit.limit or '?'} per {limit.window_s or '?'} s spent" if limit else "429"
        message = response.headers.get("X-Error-Message")
        raise RateLimitedReply(
            wait, f"the Hub answered HTTP 429 Too Many Requests ({told})" + (f": {message}" if message else "")
        )


def rate_limit(headers: Any) -> RateLimit | None:
    """The limit a reply's `RateLimit` and `RateLimit-Policy` headers report, or None (parsed as huggingface_hub
    parses them)."""
    import time

    from huggingface_hub.utils import parse_ratelimit_headers

    info = parse_ratelimit_headers(headers)
    if info is None:
        return None
    now = time.time()
    return RateLimit(
        info.resource_type, info.remaining, now + info.reset_in_seconds, info.limit, info.window_seconds, now
    )


def retry_after(headers: Any, limit: RateLimit | None) -> float | None:
    """Seconds a 429 asks to wait: the window's reset where the limit is spent, else `Retry-After` (seconds), else
    None."""
    import time

    if limit is not None and limit.remaining == 0:
        return max(0.0, limit.reset_at - time.time())
    value = (headers.get("Retry-After") or "").strip()
    return float(value) if value.isdigit() else None

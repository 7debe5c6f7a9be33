"""The line each app's page shows about its bucket's requests (`wire.traffic.BucketTraffic`)."""

from __future__ import annotations

import time

from wire.traffic import BucketTraffic


def traffic_text(traffic: BucketTraffic) -> str:
    """One line for a page: "bucket requests, last 5 min: api 312 of 1,000 · transfer 40" and, while the server holds
    this app back, "rate-limited until 21:35:10 (what it said)"."""
    parts = [
        f"{kind} {n:,}" + (f" of {traffic.limit[kind]:,}" if kind in traffic.limit else "")
        for kind, n in traffic.last_5min.items()
        if n or kind in traffic.limit
    ]
    line = "bucket requests, last 5 min: " + (" · ".join(parts) if parts else "none")
    if traffic.throttled_until is not None and traffic.throttled_until > time.time():
        until = time.strftime("%H:%M:%S", time.localtime(traffic.throttled_until))
        line += f" · **rate-limited until {until}** ({traffic.throttled_by or 'HTTP 429'})"
    if traffic.rate_limited:
        line += f" · {traffic.rate_limited} answer(s) 429 so far"
    return line

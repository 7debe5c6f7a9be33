"""What an app's bucket calls cost, as its ``/status`` answers it and its page shows it: requests per 5 minutes by
the server's classes beside the account's limit where the server reported one, and whether it asked to slow down.

On the Hub every Space of an account shares one quota per 5-minute window (API calls, `/resolve/` requests); the line
on each page is how a person running a fleet sees which app spends it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

if TYPE_CHECKING:  # pydantic only at run time: the launcher's landing page reads these without loading torch
    from delta.storage import Traffic


class BucketTraffic(BaseModel):
    """Requests this process sent to its bucket's server (everything that shares the app's bucket object)."""

    last_5min: dict[str, int] = Field(
        description="Requests in the last 5 minutes, by class (Hub: api, resolver, "
        "transfer; S3: put, get, delete; a folder: its calls)"
    )
    total: dict[str, int] = Field(description="Requests since the process started, by class")
    limit: dict[str, int] = Field(
        {},
        description="Requests allowed per window, by class, where the server said (the Hub's RateLimit-Policy header)",
    )
    remaining: dict[str, int] = Field(
        {}, description="Requests left in the server's current window, by class, as its last reply said"
    )
    rate_limited: int = Field(0, description="HTTP 429 answers since the process started")
    throttled_until: float | None = Field(
        None, description="Unix time before which nothing is sent: the server asked to slow down (None: it has not)"
    )
    throttled_by: str | None = Field(None, description="What the server said when it asked")


def bucket_traffic(traffic: Traffic) -> BucketTraffic:
    """A bucket's traffic now (`delta.Bucket.traffic`: shared by everything that uses the bucket object)."""
    snap = traffic.snapshot()
    return BucketTraffic(
        last_5min=snap.last_window,
        total=snap.total,
        limit={k: v.limit for k, v in snap.limits.items() if v.limit is not None},
        remaining={k: v.remaining for k, v in snap.limits.items()},
        rate_limited=snap.rate_limited,
        throttled_until=snap.throttled_until,
        throttled_by=snap.throttled_by,
    )

"""Which rollout servers are alive, for the trainer's fleet table and for each server's share of the work.

A server is alive while the `beat` of its heartbeat keeps changing, judged on the reader's own clock: the
servers' clocks may differ from the reader's, so `updated_at` is shown, never trusted. A heartbeat seen
for the first time counts as a change (a reader that just started gives every server `GONE_AFTER_S`).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from .fleet import FleetMessageError, Heartbeat
from .fleet_bucket import FleetBucket

logger = logging.getLogger(__name__)

#: Seconds after which a server whose heartbeat stopped changing counts as gone (heartbeats come every 5 s).
GONE_AFTER_S = 30.0


@dataclass(frozen=True)
class SeenServer:
    """One server's latest heartbeat and how long its beat has not changed (seconds, on the reader's clock)."""

    path: str
    heartbeat: Heartbeat
    silent_s: float

    @property
    def gone(self) -> bool:
        return self.silent_s > GONE_AFTER_S


class HeartbeatWatch:
    """Reads every heartbeat in the bucket and remembers when each one's beat last changed.

    Args:
        bucket: The fleet's bucket.
    """

    def __init__(self, bucket: FleetBucket) -> None:
        self.bucket = bucket
        self._seen: dict[str, tuple[int, float]] = {}  # path -> (beat, when it last changed)

    def read(self) -> list[SeenServer]:
        """Every readable heartbeat, by path; an unreadable one is logged and skipped.

        Raises:
            OSError, delta.errors.StorageError: listing the bucket failed.
        """
        now = time.monotonic()
        seen = []
        for f in self.bucket.list_heartbeats():
            try:
                beat = self.bucket.read_heartbeat(f.path)
            except FileNotFoundError:
                continue
            except FleetMessageError as e:
                logger.warning("unreadable heartbeat %s", e)
                continue
            old = self._seen.get(f.path)
            since = now if old is None or old[0] != beat.beat else old[1]
            self._seen[f.path] = (beat.beat, since)
            seen.append(SeenServer(f.path, beat, now - since))
        return seen

    def forget(self, paths: list[str]) -> None:
        """Stop remembering heartbeats whose files were deleted."""
        for path in paths:
            self._seen.pop(path, None)

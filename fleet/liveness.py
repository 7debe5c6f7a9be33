"""Which rollout servers are alive, for the trainer's fleet table and for each server's share of the work.

A server is alive while the `beat` of its heartbeat keeps counting up, judged on the reader's own clock: the
servers' clocks may differ from the reader's, so `updated_at` is shown, never trusted. A heartbeat seen
for the first time counts as a change (a reader that just started gives every server `GONE_AFTER_S`); an
older beat of the same server process (a heartbeat copied back) does not. A heartbeat that is refused (torn,
unsigned, written under another server's name) is skipped and counted by reason, once per file and reason.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass

from wire.fleet import FleetMessageError, Heartbeat

from .bucket import FleetBucket

logger = logging.getLogger(__name__)

#: Seconds after which a server whose heartbeat stopped changing counts as gone (heartbeats every 5 s; on a Hub
#: bucket every 30 s, gone after the budget's `gone_after_s`).
GONE_AFTER_S = 30.0


@dataclass(frozen=True)
class SeenServer:
    """One server's latest heartbeat and how long its beat has not changed (seconds, on the reader's clock)."""

    path: str
    heartbeat: Heartbeat
    silent_s: float
    gone_after_s: float = GONE_AFTER_S

    @property
    def gone(self) -> bool:
        return self.silent_s > self.gone_after_s


class HeartbeatWatch:
    """Reads every heartbeat in the bucket and remembers when each one's beat last changed.

    Args:
        bucket: The fleet's bucket.
        gone_after_s: Seconds of silence after which a server is gone (a few of its heartbeat periods).
    """

    def __init__(self, bucket: FleetBucket, gone_after_s: float = GONE_AFTER_S) -> None:
        self.bucket = bucket
        self.gone_after_s = gone_after_s
        self._seen: dict[str, tuple[str, int, float]] = {}  # path -> (boot, beat, when it last counted up)
        self._bad: dict[str, str] = {}  # path -> the reason it was last refused for
        self.refused: Counter[str] = Counter()  # refusals by `wire.fleet.Refusal`

    def read(self) -> list[SeenServer]:
        """Every readable heartbeat, by path; an unreadable one is logged, counted and skipped.

        Raises:
            OSError, delta.errors.StorageError: listing the bucket failed.
        """
        now = time.monotonic()
        seen = []
        listed = self.bucket.list_heartbeats()
        for path in self._bad.keys() - {f.path for f in listed}:
            del self._bad[path]
        for f in listed:
            try:
                beat = self.bucket.read_heartbeat(f.path, f)
            except FileNotFoundError:
                continue
            except FleetMessageError as e:
                if self._bad.get(f.path) != e.reason:
                    self._bad[f.path] = e.reason
                    self.refused[str(e.category)] += 1
                    logger.warning("refused heartbeat %s", e)
                continue
            self._bad.pop(f.path, None)
            old = self._seen.get(f.path)
            counted_up = old is None or old[0] != beat.boot or beat.beat > old[1]
            boot, number, since = (beat.boot, beat.beat, now) if counted_up or old is None else old
            self._seen[f.path] = (boot, number, since)
            seen.append(SeenServer(f.path, beat, now - since, self.gone_after_s))
        return seen

    def forget(self, paths: list[str]) -> None:
        """Stop remembering heartbeats whose files were deleted."""
        for path in paths:
            self._seen.pop(path, None)

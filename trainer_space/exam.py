"""The trainer's view of the exams: the records the rollout servers write to the bucket (`wire.exam`), read in a
thread of its own for `/status`, `/history` and the page's exam curves.

The trainer plays no exam itself; it says how exams are played in the run's settings (`wire.fleet.RunSettings.exam`)
and reads what the servers found. A record that fails its checks, or is of a version the bucket has not published,
is refused (`fleet.exams`) and shown as a count by reason on `/status`, `/history` and the page, never trained on
or believed.
"""

from __future__ import annotations

import logging

import delta
from delta import StorageError
from fleet.exams import ExamShelf
from fleet.periodic import Periodic
from wire.exam import ExamRecord
from wire.fleet import fleet_key

logger = logging.getLogger(__name__)

#: Exams `TrainerStatus.exams` carries (the landing page's last exam and trend).
RECENT_EXAMS = 20


class ExamWatch:
    """Reads the bucket's exam records every `interval` seconds in a daemon thread.

    Args:
        bucket: The trainer's bucket (its budget sets how often the exams are read), or a URL.
        secret: The run's rollout token, when it has one: only exams signed with it are read.

    Attributes:
        last_error: The last failure to read the bucket, with its cause (kept until a read succeeds).
    """

    def __init__(self, bucket: delta.Bucket | str, secret: str | None = None) -> None:
        bucket = delta.Bucket.of(bucket)
        self.shelf = ExamShelf(bucket, fleet_key(secret) if secret else None)
        self.last_error: str | None = None
        self._records: list[ExamRecord] = []
        self._refused: dict[str, int] = {}
        self._failure: BaseException | None = None  # what the last read raised, for the thread's wait
        self._reader = Periodic(self._poll, bucket.budget.exams_s, "exam-watch")

    def start(self) -> ExamWatch:
        self._reader.start()
        return self

    def close(self, timeout: float = 10.0) -> None:
        """Stop reading, waiting up to `timeout` seconds for a read in flight (the thread is a daemon)."""
        self._reader.close(timeout)

    def records(self) -> list[ExamRecord]:
        """Every exam read, by version (a consistent snapshot)."""
        return self._records

    def refused(self) -> dict[str, int]:
        """Exam files in the bucket refused at the last read, by why (`ExamShelf.refusals`: signed with another
        token, or the `wire.fleet.Refusal`)."""
        return self._refused

    def refresh(self) -> None:
        """Read the bucket's exams once (the thread calls this every `interval`)."""
        try:
            self._records = self.shelf.records()
            self._refused = self.shelf.refusals()
            self.last_error = self._failure = None
        except (OSError, StorageError) as e:
            self.last_error, self._failure = f"{type(e).__name__}: {e}", e
            logger.warning("reading the exams in the bucket failed: %s", e)

    def _poll(self) -> bool:
        """`refresh`, for the thread: whether a new record came; a failure raised again, so the next read waits
        longer (until the time a bucket that asked to slow down named: `fleet.periodic`)."""
        before = len(self._records)
        self.refresh()
        if self._failure is not None:
            raise self._failure
        return len(self._records) != before

"""The exam records in a bucket (``exams/v<version>.json``): the rollout servers write them, the trainer, the
rollout's match and the pages read them.

Each record is committed whole by one write, in the fleet's envelope (its kind and the hash of its
body, `wire.fleet.encode`), signed like the fleet's files when the run has a rollout token (`key`). Everything read
is a stranger's file: its size (by the listing, then while reading: never read past `MAX_EXAM_BYTES`), the
envelope, every field and its range (`wire.exam.ExamRecord`), the version the file's name claims, and that the
version is not ahead of the bucket's newest published one (weights nobody published were never examined) are
checked, and a file that fails is refused (counted by reason, and skipped: nobody deletes exam records), never an
error for the reader. A record is read once: records are written once per version, and a file that changed size
since is read again. A refusal is counted while its file is there: a file deleted or repaired drops out of the count.
"""

from __future__ import annotations

import threading
from collections import Counter

import delta
from delta.storage import StoredFile
from wire.exam import EXAMS_PREFIX, OTHER_KEY, ExamRecord, path_version
from wire.fleet import FleetMessageError, Refusal, encode

from .bucket import read_message

#: Most exam files read from one bucket: an exam every version for 10,000 versions.
MAX_EXAMS = 10_000
#: Largest exam file read: a record of 64 games is about 10 kB.
MAX_EXAM_BYTES = 256 * 1024


class ExamShelf:
    """Reads and writes the exam records of one bucket. Thread-safe; every method blocks on the bucket.

    Args:
        bucket: The role's `delta.Bucket` (its listing shared, at most its budget's `listing_age_s` old), or a URL.
        key: The run's signing key (`wire.fleet.fleet_key`): records are written signed and read only when signed
            with it. None: unsigned (a run without a rollout token).

    Attributes:
        published: The bucket's newest published version as last read (0 before any): records of later versions
            are refused.
    """

    def __init__(self, bucket: delta.Bucket | str, key: bytes | None = None) -> None:
        self.bucket = delta.Bucket.of(bucket)
        self.key = key
        self.published = 0
        self._refusals: dict[str, FleetMessageError] = {}  # path -> why, for the files in the bucket now
        self._read: dict[str, tuple[StoredFile, ExamRecord | None]] = {}  # path -> (as listed, record or None: refused)
        self._lock = threading.Lock()

    @property
    def refused(self) -> dict[str, str]:
        """Path -> why, for every exam file in the bucket refused at the last `records`."""
        return {path: error.reason for path, error in self._refusals.items()}

    def refusals(self) -> dict[str, int]:
        """How many exam files in the bucket were refused at the last `records`, by why: `OTHER_KEY` (unsigned, or
        signed with another rollout token than the reader's: an earlier start's, or edited), or the
        `wire.fleet.Refusal`."""
        with self._lock:
            return dict(
                Counter(
                    OTHER_KEY if error.category == Refusal.UNSIGNED else str(error.category)
                    for error in self._refusals.values()
                )
            )

    def write(self, record: ExamRecord) -> str:
        """Commit `record` (replacing an exam of the same version); returns its path."""
        self.bucket.write(record.path, encode(record, self.key))
        return record.path

    def records(self) -> list[ExamRecord]:
        """Every valid exam record in the bucket, by version, none ahead of its newest published version.

        Raises:
            OSError, delta.StorageError: the bucket could not be listed or read (as `Storage`).
        """
        with self._lock:
            listed = self.bucket.list(EXAMS_PREFIX, max_age=self.bucket.budget.listing_age_s)[:MAX_EXAMS]
            present = {f.path for f in listed}
            for gone in set(self._read) - present:
                del self._read[gone]
            for gone in set(self._refusals) - present:
                del self._refusals[gone]
            for f in listed:
                if self._read.get(f.path, (None,))[0] != f:  # read again only what changed since (size, etag)
                    self._read[f.path] = (f, self._check(f))
            self.published = self._newest_published()
            kept = []
            for path, (_, record) in self._read.items():
                if record is None:
                    continue
                if record.version > self.published:
                    self._refusals[path] = FleetMessageError(
                        path,
                        f"the exam of version {record.version}, ahead of the newest version published in the "
                        f"bucket ({self.published})",
                        Refusal.AHEAD,
                    )
                    continue
                self._refusals.pop(path, None)
                kept.append(record)
            return sorted(kept, key=lambda r: r.version)

    def _newest_published(self) -> int:
        """The newest version the bucket's manifest lists (0 with none: the untrained weights every server starts
        from)."""
        try:
            manifest = delta.read_manifest(self.bucket, max_age=self.bucket.budget.listing_age_s)
        except delta.DeltaFormatError:  # no manifest parses: no version can be shown to be published
            return 0
        return manifest.latest.version if manifest is not None and manifest.latest is not None else 0

    def _check(self, listed: StoredFile) -> ExamRecord | None:
        path = listed.path
        claimed = path_version(path)
        try:
            if claimed is None:
                raise FleetMessageError(path, "not an exam file name (exams/v<10 digits>.json)")
            record = read_message(self.bucket, path, ExamRecord, self.key, MAX_EXAM_BYTES, listed)
            if record.version != claimed:
                raise FleetMessageError(
                    path,
                    f"holds the exam of version {record.version}: a file renamed or copied by hand",
                    Refusal.RENAMED,
                )
        except FileNotFoundError:
            return None
        except FleetMessageError as e:
            self._refusals[path] = e
            return None
        self._refusals.pop(path, None)
        return record

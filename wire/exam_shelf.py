"""The exam records in a bucket (``exams/v<version>.json``): the rollout servers write them, the trainer, the
rollout's match and the pages read them.

Each record is committed whole by one `Storage.write`, in the fleet's envelope (its kind and the hash of its
body, `wire.fleet.encode`), signed like the fleet's files when the run has a rollout token (`key`). Everything read is a stranger's file: the envelope, every field and its range
(`wire.exam.ExamRecord`) and the version the file's name claims are checked, and a file that fails is
refused (counted, with its reason, and skipped: nobody deletes exam records), never an error for the
reader. A record is read once: records are written once per version, and a file that changed size since
is read again.
"""

from __future__ import annotations

import threading

from delta.storage import Storage, open_storage

from .exam import EXAMS_PREFIX, OTHER_KEY, ExamRecord, path_version
from .fleet import FleetMessageError, Refusal, decode, encode

#: Most exam files read from one bucket: an exam every version for 10,000 versions.
MAX_EXAMS = 10_000
#: Largest exam file read: a record of 64 games is about 10 kB.
MAX_EXAM_BYTES = 256 * 1024


class ExamShelf:
    """Reads and writes the exam records of one bucket. Thread-safe; every method blocks on the bucket.

    Args:
        bucket: A bucket URL (as `delta.open_storage` takes) or an open `Storage`.
        key: The run's signing key (`wire.fleet.fleet_key`): records are written signed and read only when signed
            with it. None: unsigned (a run without a rollout token).

    Attributes:
        refused: Path -> why, for every exam file that failed its checks.
    """

    def __init__(self, bucket: str | Storage, key: bytes | None = None) -> None:
        self.storage = open_storage(bucket) if isinstance(bucket, str) else bucket
        self.key = key
        self.refused: dict[str, str] = {}
        self._categories: dict[str, str] = {}  # path -> what it is counted as (`refusals`)
        self._read: dict[str, tuple[int, ExamRecord | None]] = {}  # path -> (size read, record or None: refused)
        self._lock = threading.Lock()

    def write(self, record: ExamRecord) -> str:
        """Commit `record` (replacing an exam of the same version); returns its path."""
        self.storage.write(record.path, encode(record, self.key))
        return record.path

    def records(self) -> list[ExamRecord]:
        """Every valid exam record in the bucket, by version.

        Raises:
            OSError, delta.StorageError: the bucket could not be listed or read (as `Storage`).
        """
        with self._lock:
            listed = [f for f in self.storage.list(EXAMS_PREFIX)][:MAX_EXAMS]
            present = {f.path for f in listed}
            for gone in set(self._read) - present:
                del self._read[gone]
                self.refused.pop(gone, None)
                self._categories.pop(gone, None)
            for f in listed:
                if self._read.get(f.path, (None,))[0] != f.size:
                    self._read[f.path] = (f.size, self._check(f.path, f.size))
            return sorted((r for _, r in self._read.values() if r is not None), key=lambda r: r.version)

    def _check(self, path: str, size: int) -> ExamRecord | None:
        claimed = path_version(path)
        try:
            if claimed is None:
                raise FleetMessageError(path, "not an exam file name (exams/v<10 digits>.json)")
            if size > MAX_EXAM_BYTES:
                raise FleetMessageError(path, f"{size} bytes, more than the {MAX_EXAM_BYTES} an exam record may hold")
            record = decode(self.storage.read(path), ExamRecord, path, self.key)
            if record.version != claimed:
                raise FleetMessageError(path, f"holds the exam of version {record.version}: a file renamed or "
                                              "copied by hand")
        except FileNotFoundError:
            return None
        except FleetMessageError as e:
            self.refused[path] = e.reason
            self._categories[path] = OTHER_KEY if e.category == Refusal.UNSIGNED else str(e.category)
            return None
        self.refused.pop(path, None)
        self._categories.pop(path, None)
        return record

    def refusals(self) -> dict[str, int]:
        """The exam files refused at the last `records()`, counted by why: `OTHER_KEY` (unsigned, or signed with
        another rollout token than the reader's: an earlier start's, or edited), or the `wire.fleet.Refusal`."""
        with self._lock:
            counts: dict[str, int] = {}
            for path, category in self._categories.items():
                if path in self._read:
                    counts[category] = counts.get(category, 0) + 1
            return counts

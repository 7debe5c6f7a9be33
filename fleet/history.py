"""The trainer's history kept in its bucket (`wire.history`), read back when a trainer starts on it.

`HistoryKeeper.load` reads what an earlier trainer process wrote: the step records (the curves, and the
step count to go on from), the payloads and the anchors (the bytes chart). `start` then writes the whole
history again after each change, from a daemon thread that folds changes arriving within `interval_s`
into one write (a step's record and its payload come seconds apart), so the training thread never waits
on the bucket. A history file that is not one (torn, corrupt, another format, too big) is moved aside,
once, under a name that says so, and a fresh one is started: nothing written by someone is overwritten
unread. A file over `MAX_HISTORY_BYTES` is refused by its listed size, or at that many bytes while reading,
and moved aside without being read or copied (`Bucket.move`): a 2 GB history costs the trainer no memory.
A bucket that cannot be read leaves the keeper off for this process (`problem` says why): a history it could
not read is never replaced by a shorter one.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import delta
from wire.history import HISTORY_PATH, MAX_HISTORY_BYTES, HistoryFileError, decode_history, encode_history
from wire.trainer import TrainerHistory

logger = logging.getLogger(__name__)


class HistoryKeeper:
    """Reads and writes one bucket's trainer history. Threads: `start` starts one writer (daemon).

    Args:
        bucket: The trainer's `delta.Bucket`, or a URL.
        interval_s: Seconds between two writes at most (changes in between are folded); None: the bucket's budget
            (`history_s`).

    Attributes:
        problem: Why the history is not kept (None while it is): the bucket could not be read at `load`.
        writes, failures: Writes done and failed since `start`.
    """

    def __init__(self, bucket: delta.Bucket | str, interval_s: float | None = None) -> None:
        self.bucket = delta.Bucket.of(bucket)
        self.interval_s = interval_s if interval_s is not None else self.bucket.budget.history_s
        self.problem: str | None = "not read yet"
        self.writes = self.failures = 0
        self._snapshot: Callable[[], TrainerHistory] | None = None
        self._changed = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_ok = False

    def load(self) -> TrainerHistory:
        """The history in the bucket; empty when there is none, or when it cannot be read (logged; see the module
        docstring for what is kept and what is set aside). Never raises: a failure no one foresaw (a bucket's
        reply its library could not take) leaves the keeper off, as an unreadable bucket does."""
        try:
            return self._load()
        except Exception as e:  # the promise to the trainer's constructor: whatever the bucket holds, it starts
            logger.exception("reading the bucket's history failed unexpectedly")
            self.problem = (
                f"the bucket's history could not be read, so it is not written either: {type(e).__name__}: {e}"
            )
            return TrainerHistory(steps=[], payloads=[])

    def _load(self) -> TrainerHistory:
        empty = TrainerHistory(steps=[], payloads=[])
        try:
            data = self._read()
        except FileNotFoundError:
            self.problem = None
            return empty
        except delta.storage.FileTooLargeError as e:
            told = f"{e.size} bytes" if e.size is not None else "more bytes"
            self._set_aside(
                HistoryFileError(HISTORY_PATH, f"{told}, more than the {MAX_HISTORY_BYTES} a history may hold")
            )
            return empty
        except (OSError, delta.StorageError) as e:
            self.problem = f"the bucket's history could not be read, so it is not written either: {e}"
            logger.warning("%s", self.problem)
            return empty
        try:
            decoded = decode_history(data)
        except HistoryFileError as e:
            self._set_aside(e)
            return empty
        self.problem = None
        if decoded.skipped:
            logger.warning(
                "history %s: %s record(s) refused (%s); the other %d steps kept",
                HISTORY_PATH,
                sum(decoded.skipped.values()),
                decoded.first_problem,
                len(decoded.history.steps),
            )
        return decoded.history

    def _read(self) -> bytes:
        """The history file, read no further than `MAX_HISTORY_BYTES` (refused by its listed size before that).

        Raises:
            FileNotFoundError, delta.storage.FileTooLargeError, OSError, delta.StorageError: as `Bucket.read`.
        """
        listed = next((f for f in self.bucket.list(HISTORY_PATH) if f.path == HISTORY_PATH), None)
        if listed is None:
            raise FileNotFoundError(HISTORY_PATH)  # listed: nothing more to ask
        return self.bucket.read(HISTORY_PATH, max_bytes=MAX_HISTORY_BYTES, listed=listed)  # refused by its size

    def _set_aside(self, error: HistoryFileError) -> None:
        """Move an unreadable history beside it (unread and uncopied), so the fresh one written next loses nothing;
        if it cannot be moved, nothing is written (`problem` says why)."""
        aside = f"{HISTORY_PATH.removesuffix('.json')}.unreadable-{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}.json"
        try:
            self.bucket.move(HISTORY_PATH, aside)
        except (OSError, delta.StorageError) as e:
            self.problem = f"unreadable history {error.reason}, and it could not be set aside ({e}): not written"
            logger.warning("%s", self.problem)
            return
        self.problem = None
        logger.warning("history %s, set aside as %s; starting a new one", error, aside)

    def start(self, snapshot: Callable[[], TrainerHistory]) -> HistoryKeeper:
        """Write `snapshot()` after each `changed`, from a daemon thread; nothing if `load` found a problem."""
        self._snapshot = snapshot
        if self.problem is None:
            self._thread = threading.Thread(target=self._run, name="history-writer", daemon=True)
            self._thread.start()
        return self

    def changed(self) -> None:
        """Something was added to the history: it is written within `interval_s`. Returns at once."""
        self._changed.set()

    def close(self, timeout: float = 5.0) -> bool:
        """Stop the writer once it has written the history as it is now; True if that write was done in time."""
        self._stop.set()
        self._changed.set()
        if self._thread is None:
            return False
        self._thread.join(timeout)
        return not self._thread.is_alive() and self._last_ok

    def _run(self) -> None:
        while True:
            self._changed.wait()
            self._changed.clear()
            self._last_ok = self._write()
            if self._stop.is_set() and not self._changed.is_set():
                return
            self._stop.wait(self.interval_s)  # changes meanwhile are folded into the next write; a close ends it

    def _write(self) -> bool:
        """Write the snapshot now (in the writer thread); False if it failed (logged: the next change writes it all
        again)."""
        assert self._snapshot is not None, "start() gives the keeper its snapshot"
        try:
            self.bucket.write(HISTORY_PATH, encode_history(self._snapshot()))
        except (OSError, delta.StorageError) as e:
            self.failures += 1
            logger.warning("could not write the history to the bucket (%d failed): %s", self.failures, e)
            return False
        self.writes += 1
        return True

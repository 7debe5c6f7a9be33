"""One listing of a bucket per poll for every reader that shares a `Bucket`: the whole bucket as last listed.

A rollout server polls its bucket for new versions, the run's settings, its peers' heartbeats and the exams; a trainer
for groups, heartbeats and its own versions. Listed one by one, each prefix is a request of its own, and on the Hub
each counts against the account's quota. A poller instead asks `Bucket.list(prefix, max_age=...)`: the answer comes
from this listing of the whole bucket while it is younger than `max_age` seconds, and one listing is made for all of
them when it is older. What goes through the bucket object (writes, moves, deletes) goes into it at once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable

from ..storage import StoredFile


class SharedListing:
    """The latest listing of one bucket, kept up to date with the changes made through its `Bucket`. Thread-safe; one
    listing is made at a time (callers that ask meanwhile wait for it and take it).

    Args:
        clock: Seconds, monotonic (the listing's age; a test's own clock).
    """

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._listing_lock = threading.Lock()
        self._files: dict[str, StoredFile] | None = None
        self._at = float("-inf")
        self._changes: list[tuple[str, StoredFile | None]] | None = None  # made while a listing is in flight

    def files(self, max_age: float, list_all: Callable[[], Iterable[StoredFile]]) -> list[StoredFile]:
        """Every file of the bucket, from a listing younger than `max_age` seconds (made now with `list_all` if the
        kept one is not): a poller that looks every `max_age` seconds lists at each look, and its peers share it."""
        with self._listing_lock:
            with self._lock:
                if self._files is not None and self._clock() - self._at < max_age:
                    return list(self._files.values())
                began, self._changes = self._clock(), []
            try:
                listed = {f.path: f for f in list_all()}
            except BaseException:
                with self._lock:
                    self._changes = None
                raise
            with self._lock:
                for path, entry in self._changes or ():  # made while listing: the listing may not show them yet
                    _apply(listed, path, entry)
                self._files, self._at, self._changes = listed, began, None
                return list(listed.values())

    def entry(self, path: str) -> StoredFile | None:
        """`path`'s entry in the kept listing, or None (not listed, or nothing kept)."""
        with self._lock:
            return self._files.get(path) if self._files is not None else None

    def changed(self, path: str, entry: StoredFile | None) -> None:
        """`path` was written (its new entry) or deleted (None)."""
        with self._lock:
            if self._changes is not None:
                self._changes.append((path, entry))
            if self._files is not None:
                _apply(self._files, path, entry)


def _apply(files: dict[str, StoredFile], path: str, entry: StoredFile | None) -> None:
    if entry is None:
        files.pop(path, None)
    else:
        files[path] = entry

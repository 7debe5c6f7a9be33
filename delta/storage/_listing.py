"""One listing of a bucket per poll for every reader of a process: the whole bucket as this process last listed it.

A rollout server polls its bucket for new versions, the run's settings, its peers' heartbeats, its pending groups and
the exams; a trainer for groups, heartbeats and its own versions. Listed one by one, each prefix is a request of its
own, and on the Hub every one counts against the account's quota. A poller instead asks `Storage.list(prefix,
max_age=...)`: the answer comes from the process's listing of the whole bucket while it is at most `max_age` seconds
old, and one listing (one request a page) is made for all of them when it is older. What this process writes,
moves and deletes goes into the shared listing at once, so a process always sees its own changes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class StoredFile:
    """One file in a bucket, as `Storage.list` returns it.

    Attributes:
        path: Relative to the bucket root, '/'-separated.
        size: In bytes.
        etag: What names this content where the backend says (the Xet hash on the Hub, the ETag on S3; None on a
            local folder): a file listed with the same size and etag holds the same bytes as before.
    """

    path: str
    size: int
    etag: str | None = None


class SharedListing:
    """The latest listing of one bucket in this process, kept up to date with this process's own changes.
    Thread-safe; one listing is made at a time (callers that ask meanwhile wait for it and take it)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._listing_lock = threading.Lock()
        self._files: dict[str, StoredFile] | None = None
        self._at = float("-inf")
        self._changes: list[tuple[str, StoredFile | None]] | None = None  # made while a listing is in flight

    def files(self, max_age: float, list_all: Callable[[], Iterable[StoredFile]]) -> list[StoredFile]:
        """Every file of the bucket, from a listing at most `max_age` seconds old (made now with `list_all` if the
        kept one is older)."""
        with self._listing_lock:
            with self._lock:
                if self._files is not None and time.monotonic() - self._at <= max_age:
                    return list(self._files.values())
                began, self._changes = time.monotonic(), []
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
        """This process wrote `path` (its new entry) or deleted it (None)."""
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


_SHARED: dict[tuple[str, int], SharedListing] = {}
_SHARED_LOCK = threading.Lock()


def shared_listing(key: tuple[str, int]) -> SharedListing:
    """The process's one `SharedListing` of a bucket as one account sees it (`key`: its URL and the account's
    `Traffic`), made on first use."""
    with _SHARED_LOCK:
        listing = _SHARED.get(key)
        if listing is None:
            listing = _SHARED[key] = SharedListing()
        return listing

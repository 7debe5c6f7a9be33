"""The storage interface every bucket backend implements, and what they share: path rules, retries,
and turning a backend's failures into the errors callers see.

A bucket holds flat files addressed by relative paths with '/' separators. Backends implement a few
primitives (`_read`, `_write`, `_move`, `_list`, `_delete`) and one function, `_classify`, that says which of
their exceptions mean "missing", "unreachable, try again" or "failed"; the public methods here check
the paths, retry what is worth retrying and raise the errors documented below.
"""

from __future__ import annotations

import builtins
import importlib
import logging
import os
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import TypeVar

from ..errors import (
    AccessDeniedError,
    BucketNotFoundError,
    BucketUnreachableError,
    FileTooLargeError,
    RateLimitedError,
    StorageError,
)
from ..retry import RetryPolicy
from ._listing import StoredFile, shared_listing
from ._traffic import Traffic

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Characters that no path may hold: backslashes (a Windows separator), control characters, and glob
# magic, which fsspec expands in some calls instead of taking it literally.
_FORBIDDEN = re.compile(r"[\\*?\[\]\x00-\x1f\x7f]")


@dataclass(frozen=True)
class Failure:
    """What a backend's `_classify` makes of an exception.

    Attributes:
        kind: `FileNotFoundError`, `BucketNotFoundError`, `AccessDeniedError`, `StorageError`,
            `BucketUnreachableError` (the only one retried within a call) or `RateLimitedError` (never sent again before
            the time the server named).
        reason: What went wrong, for the message, with a hint on what to do where the backend knows one.
        status: The HTTP status the server answered, where there was one.
        wait_s: A `RateLimitedError`: the seconds the server asked to wait (None: it named no time).
    """

    kind: type[OSError]
    reason: str
    status: int | None = None
    wait_s: float | None = None


def import_backend(module: str, needed_for: str, extra: str) -> ModuleType:
    """Import an optional backend's library, or say how to install it (`extra`: the package's extra that has it)."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(f"{needed_for} need the {module} package: {install_hint(extra)}") from error


def install_hint(extra: str) -> str:
    """How to install an optional backend: the library's extra, or this repository's requirements."""
    return (
        f"pip install 'delta-weight-sync[{extra}]' (in this repository: pip install -r requirements.txt "
        "-c constraints.txt)"
    )


def check_path(path: str, *, prefix: bool = False) -> str:
    """Return `path` if it is a valid file path (or, with `prefix=True`, a listing prefix) in a bucket.

    A path is relative, '/'-separated, without empty, '.' or '..' parts, backslashes, control or glob
    characters. A prefix follows the same rules but may be empty or end with '/'.

    Raises:
        ValueError: The path breaks one of the rules; the message says which.
    """
    if not isinstance(path, str):
        raise TypeError(f"bucket paths are str, got {type(path).__name__}: {path!r}")
    body = path[:-1] if prefix and path.endswith("/") else path
    problem = None
    if not body:
        problem = None if prefix else "it is empty"
    elif body.startswith("/"):
        problem = "it is absolute; paths are relative to the bucket root"
    elif _FORBIDDEN.search(body):
        problem = "it holds a backslash, a control character or one of *?[]"
    elif any(part in ("", ".", "..") for part in body.split("/")):
        problem = "it has an empty, '.' or '..' part"
    if problem:
        raise ValueError(f"invalid bucket path {path!r}: {problem}. Use a relative path like 'versions/00000001.json'")
    return path


class Storage(ABC):
    """A bucket: whole files read, written, listed and deleted by relative path.

    Every method blocks until done. Instances may be shared between threads. A write replaces the
    whole file; whether a concurrent reader can see it half-written depends on the backend (each
    backend's docstring says). Writing several files is never atomic as a group: write the data
    first and a small commit marker last.

    Errors (alike on every backend):
        FileNotFoundError: The file does not exist. `BucketNotFoundError` (one of them): the bucket itself does not
            (a reader takes it as empty; a writer that may not create it stops, told how to create it).
        AccessDeniedError: The credentials were refused (missing, invalid, revoked, or without the access needed):
            never retried.
        BucketUnreachableError: The bucket did not answer, or answered "try later", after `retry.attempts` tries.
            `RateLimitedError` (one of them): the server said to slow down; nothing is sent to it before its
            `retry_at`, by any storage of this process that shares its `traffic`.
        StorageError: Any other failure of the backend (a server error it will not retry, disk).
        ValueError: An invalid path (see `check_path`).

    Attributes:
        url: The bucket's URL, without any credentials.
        retry: How calls are retried when the bucket cannot be reached.
        traffic: The requests sent to the bucket's server by class, and whether it asked to slow down (shared by
            every storage of this process that talks to the same server with the same credentials).
    """

    def __init__(self, url: str, retry: RetryPolicy | None = None, traffic: Traffic | None = None) -> None:
        self.url = url
        self.retry = retry if retry is not None else RetryPolicy()
        self.traffic = traffic if traffic is not None else Traffic(("read", "write", "list", "move", "delete"))
        self._listing = shared_listing((url, id(self.traffic)))  # shared by the storages of one account

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    def read(self, path: str, max_bytes: int | None = None, *, listed: StoredFile | None = None) -> bytes:
        """Return the whole content of the file at `path`.

        Args:
            max_bytes: The most this file may hold (None: no bound, for files of one's own). A file found larger, by
                its size where the backend knows it before reading, else while reading (which stops past the
                limit), raises `FileTooLargeError`: a file in a bucket strangers write to never costs more memory.
            listed: The entry a listing of this storage just gave for `path`: a backend that reads by content (the
                Hub) reads that content without asking for the file's metadata again. The bytes are then those
                listed, even if the file was replaced since. Over `max_bytes` by its listed size: refused unread.

        Raises:
            FileTooLargeError: over `max_bytes` (never retried), besides the interface's errors.
        """
        check_path(path)
        if max_bytes is not None and max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0 or None, got {max_bytes}")
        if listed is not None:
            if listed.path != path:
                raise ValueError(f"listed is the entry of {listed.path!r}, not of {path!r}")
            if max_bytes is not None and listed.size > max_bytes:
                raise self._too_large(path, max_bytes, listed.size)
        return self._call("read", path, lambda: self._read(path, max_bytes, listed))

    def write(self, path: str, data: bytes) -> None:
        """Create or replace the file at `path` with `data`, creating the bucket if it does not exist."""
        check_path(path)
        if not isinstance(data, bytes):
            raise TypeError(f"write() takes bytes, got {type(data).__name__}; pass bytes(data)")
        etag = self._call("write", path, lambda: self._write(path, data))
        self._listing.changed(path, StoredFile(path, len(data), etag))

    def write_many(self, files: Mapping[str, bytes]) -> None:
        """Create or replace several files (as `write` does each), in as few requests as the backend allows: one
        batch call on the Hub, where each file written alone costs one API request. Not atomic as a group: on an
        error, some of the files may be written and others not."""
        items = [(check_path(path), data) for path, data in files.items()]
        for path, data in items:
            if not isinstance(data, bytes):
                raise TypeError(f"write_many() takes bytes, got {type(data).__name__} for {path!r}; pass bytes(data)")
        if not items:
            return
        etags = self._call("write", items[0][0] if len(items) == 1 else None, lambda: self._write_many(items))
        for (path, data), etag in zip(items, etags, strict=True):
            self._listing.changed(path, StoredFile(path, len(data), etag))

    def list(self, prefix: str = "", *, max_age: float = 0.0) -> list[StoredFile]:
        """Return the files whose path starts with `prefix` (a plain string prefix: 'v1' matches
        'v1/a' and 'v10'), sorted by path. A bucket that does not exist yet lists as empty.

        Args:
            max_age: For a caller that polls (its interval): the answer may come from a listing of the whole bucket
                that this process made at most `max_age` seconds ago, shared by every storage of the process on this
                bucket (one request for all its pollers), with this process's own writes, moves and deletes in it.
                0: listed now.
        """
        check_path(prefix, prefix=True)
        if max_age > 0 or not prefix:  # a listing of the whole bucket is kept for the pollers
            files = self._listing.files(max_age, lambda: self._list_or_empty(""))
        else:
            files = self._list_or_empty(prefix[: prefix.rfind("/") + 1])
        return sorted((f for f in files if f.path.startswith(prefix)), key=lambda f: f.path)

    def listed(self, path: str) -> StoredFile | None:
        """`path`'s entry in the listing this process keeps of the bucket (`list(..., max_age=...)`), or None where
        it is not in it or none is kept. Asks nothing of the bucket; the entry may be out of date."""
        return self._listing.entry(path)

    def _list_or_empty(self, folder: str) -> builtins.list[StoredFile]:
        try:
            return self._call("list", folder or None, lambda: list(self._list(folder)))
        except FileNotFoundError:
            return []

    def move(self, source: str, target: str) -> None:
        """Move the file at `source` to `target` (replacing a file there) without reading it: a rename on a local
        folder, a copy made by the server then a delete on S3 and Hugging Face buckets (not atomic there: a crash
        between the two leaves both). How a file too large to read is set aside."""
        check_path(source)
        check_path(target)
        self._call("move", source, lambda: self._move(source, target))
        moved = self._listing.entry(source)
        self._listing.changed(source, None)
        self._listing.changed(target, StoredFile(target, moved.size, moved.etag) if moved is not None else None)

    def delete(self, paths: Iterable[str]) -> None:
        """Delete the files at `paths`; paths that do not exist are skipped. Not atomic: on an error,
        some of the files may be deleted and others not."""
        paths = [check_path(p) for p in paths]
        if not paths:
            return
        try:
            self._call("delete", paths[0] if len(paths) == 1 else None, lambda: self._delete(paths))
        except FileNotFoundError:
            pass
        for path in paths:
            self._listing.changed(path, None)

    def _call(self, operation: str, path: str | None, call: Callable[[], T]) -> T:
        """Run `call`, retrying while the bucket is unreachable, and raise the documented errors. Nothing is sent
        while the server's rate limit holds (a 429 seen by any storage sharing `traffic`)."""
        start = time.monotonic()
        attempt = 1
        while True:
            held = self.traffic.held_until()
            if held is not None:
                raise self._rate_limited(operation, path, held, "not sent: the server asked to slow down earlier")
            try:
                return call()
            except FileTooLargeError:
                raise
            except Exception as error:
                failure = self._classify(error)
                if failure is None:
                    raise
                if failure.kind is RateLimitedError:
                    until = self.traffic.throttle(failure.wait_s, failure.reason)
                    logger.warning(
                        "%s %s: %s; nothing is sent to the bucket before %s",
                        operation,
                        self._where(path),
                        failure.reason,
                        time.strftime("%H:%M:%S", time.localtime(until)),
                    )
                    raise self._rate_limited(operation, path, until, failure.reason) from error
                if failure.kind is BucketUnreachableError and self.retry.retries_after(attempt):
                    wait = self.retry.delay(attempt)
                    logger.warning(
                        "%s %s: %s; attempt %d of %s, retrying in %.1f s",
                        operation,
                        self._where(path),
                        failure.reason,
                        attempt,
                        self.retry.attempts,
                        wait,
                    )
                    time.sleep(wait)
                    attempt += 1
                    continue
                raise self._error(failure, operation, path, attempt, time.monotonic() - start) from error

    def _where(self, path: str | None) -> str:
        return f"{self.url}/{path}" if path else self.url

    def _rate_limited(self, operation: str, path: str | None, until: float, reason: str) -> RateLimitedError:
        when = time.strftime("%H:%M:%S", time.localtime(until))
        return RateLimitedError(
            f"{operation}: rate-limited until {when} ({reason})", url=self.url, path=path, retry_at=until
        )

    def _error(self, failure: Failure, operation: str, path: str | None, attempts: int, elapsed: float) -> OSError:
        """Build the exception a caller sees from a classified failure."""
        if failure.kind is FileNotFoundError:
            return FileNotFoundError(f"{path!r} does not exist in {self.url}")
        if failure.kind is BucketNotFoundError:
            return BucketNotFoundError(f"{operation} failed: {failure.reason}", url=self.url, path=path)
        if failure.kind is AccessDeniedError:
            return AccessDeniedError(
                f"{operation} failed: {failure.reason}", url=self.url, path=path, status=failure.status
            )
        if failure.kind is BucketUnreachableError:
            return BucketUnreachableError(
                f"{operation} failed after {attempts} attempt(s) over {elapsed:.1f} s, the bucket did not answer: "
                f"{failure.reason}. Check that the server is up and the URL or endpoint is right; "
                f"pass retry=RetryPolicy(...) to open_storage to wait longer",
                url=self.url,
                path=path,
                attempts=attempts,
            )
        return StorageError(f"{operation} failed: {failure.reason}", url=self.url, path=path)

    @abstractmethod
    def _classify(self, error: Exception) -> Failure | None:
        """Say what an exception raised by this backend's primitives means, or None to let it through
        unchanged (programming errors). The one place where a backend's transport errors become ours."""

    def _too_large(self, path: str, limit: int, size: int | None = None) -> FileTooLargeError:
        return FileTooLargeError(url=self.url, path=path, limit=limit, size=size)

    def _read_local(self, local: str | os.PathLike[str], path: str, max_bytes: int | None) -> bytes:
        """Read a file on the local disk that holds the bucket's `path`: its size checked before reading, and at most
        `max_bytes` + 1 bytes read (a file that grows meanwhile is caught too)."""
        with open(local, "rb") as f:
            if max_bytes is None:
                return f.read()
            size = os.fstat(f.fileno()).st_size
            if size > max_bytes:
                raise self._too_large(path, max_bytes, size)
            data = f.read(size + 1)  # a buffer of the file's size, not of the bound
            if len(data) > size:  # it grew since: read on, to the bound
                data += f.read(max_bytes + 1 - len(data))
        if len(data) > max_bytes:
            raise self._too_large(path, max_bytes)
        return data

    @abstractmethod
    def _read(self, path: str, max_bytes: int | None, listed: StoredFile | None) -> bytes:
        """Return the content of `path` (already checked); past `max_bytes` (when not None), raise
        `self._too_large(...)` having read at most about `max_bytes` bytes. `listed`: the entry a listing gave for
        `path` (checked against `max_bytes` already), for backends that read by it."""

    @abstractmethod
    def _write(self, path: str, data: bytes) -> str | None:
        """Create or replace `path` (already checked) with `data`; return what names the content where the backend
        knows it (`StoredFile.etag`)."""

    def _write_many(self, files: builtins.list[tuple[str, bytes]]) -> builtins.list[str | None]:
        """Write `files` (paths checked, not empty); return each one's etag as `_write` does. One `_write` each
        unless the backend can do better."""
        return [self._write(path, data) for path, data in files]

    @abstractmethod
    def _move(self, source: str, target: str) -> None:
        """Move `source` to `target` (both checked) without the content passing through this process."""

    @abstractmethod
    def _list(self, folder: str) -> Iterable[StoredFile]:
        """Yield every file under `folder` ('' for the root, else ending with '/'), at any depth.
        May yield more (the caller filters); may raise FileNotFoundError for a missing bucket."""

    @abstractmethod
    def _delete(self, paths: builtins.list[str]) -> None:
        """Delete `paths` (already checked, not empty), skipping missing ones."""

"""The storage interface every backend implements: a few primitives, with path rules, retries and errors shared.

Backends implement `_read`, `_write`, `_move`, `_list`, `_delete` and `_classify` (which of their exceptions mean
"missing", "unreachable, try again" or "failed"); the public methods check the paths, retry and raise the errors
documented on `Storage`. What a process keeps about a bucket belongs to `delta.Bucket`, not here."""

from __future__ import annotations

import builtins
import errno
import importlib
import logging
import os
import re
import stat
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
from ._traffic import Traffic

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Backslashes (a Windows separator), control characters and glob magic (which fsspec expands in some calls).
_FORBIDDEN = re.compile(r"[\\*?\[\]\x00-\x1f\x7f]")


@dataclass(frozen=True)
class StoredFile:
    """One file in a bucket, as `Storage.list` returns it: its '/'-separated path, size, and `etag` where the backend
    names the content (the Xet hash, S3's ETag; None on a folder): the same size and etag hold the same bytes."""

    path: str
    size: int
    etag: str | None = None


@dataclass(frozen=True)
class Failure:
    """What a backend's `_classify` makes of an exception: the error `kind` to raise (only `BucketUnreachableError` is
    retried within a call), the `reason` with a hint, the HTTP `status`, and a 429's `wait_s`."""

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
    """Return `path` if it is a valid file path (or, with `prefix=True`, a listing prefix, which may be empty or end
    with '/'): relative, '/'-separated, no empty, '.' or '..' parts, backslashes, control or glob characters.

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
    """A bucket's files: whole files read, written, listed, moved and deleted by relative path.

    Every method blocks until done; instances may be shared between threads. A write replaces the whole file;
    several writes are never atomic as a group (write the data first and a small commit marker last).

    Errors (alike on every backend):
        FileNotFoundError: The file does not exist (`BucketNotFoundError`: the bucket itself does not); in a folder,
            something else than a regular file (a FIFO) is not a file.
        FileExistsError: A write where something else than a file holds the path (a folder): nothing written.
        AccessDeniedError: The credentials were refused: never retried.
        BucketUnreachableError: No answer after `retry.attempts` tries (`RateLimitedError`: the server said to slow
            down; nothing is sent through `traffic` before its `retry_at`).
        StorageError: Any other failure of the backend.
        ValueError: An invalid path (`check_path`).

    Attributes:
        url: The bucket's URL, without any credentials.
        retry: How calls are retried when the bucket cannot be reached.
        traffic: The requests sent, by class, and the server's rate limit (the caller's: `delta.Bucket` passes its own).
    """

    #: The request classes the backend counts in (`Traffic.classes`).
    CLASSES: tuple[str, ...] = ("read", "write", "list", "move", "delete")

    def __init__(self, url: str, retry: RetryPolicy | None = None, traffic: Traffic | None = None) -> None:
        self.url = url
        self.retry = retry if retry is not None else RetryPolicy()
        self.traffic = traffic if traffic is not None else Traffic(self.CLASSES)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    @property
    def identity(self) -> str:
        """The bucket itself, one name whatever the spelling it was opened by: what a reader keeps its trust in the
        bucket under (a folder opened through a link or a `..` path is the same bucket, and trusted the same)."""
        return self.url

    def read(self, path: str, max_bytes: int | None = None, *, listed: StoredFile | None = None) -> bytes:
        """Return the whole content of the file at `path`. Over `max_bytes` (None: no bound, for one's own files):
        `FileTooLargeError`, having read at most about that much. `listed`: the entry a listing just gave, which a
        backend that reads by content (the Hub) reads without asking for metadata (over `max_bytes`: refused unread)."""
        check_path(path)
        if max_bytes is not None and max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0 or None, got {max_bytes}")
        if listed is not None:
            if listed.path != path:
                raise ValueError(f"listed is the entry of {listed.path!r}, not of {path!r}")
            if max_bytes is not None and listed.size > max_bytes:
                raise self._too_large(path, max_bytes, listed.size)
        return self._call("read", path, lambda: self._read(path, max_bytes, listed))

    def write(self, path: str, data: bytes) -> StoredFile:
        """Create or replace the file at `path` with `data`, creating the bucket if it does not exist; returns its
        entry as a listing would give it."""
        if not isinstance(data, bytes):
            raise TypeError(f"write() takes bytes, got {type(data).__name__}; pass bytes(data)")
        return self.write_many({path: data})[0]

    def write_many(self, files: Mapping[str, bytes]) -> list[StoredFile]:
        """Create or replace several files (as `write` does each), in as few requests as the backend allows (one
        batch call on the Hub). Not atomic as a group: on an error, some may be written and others not."""
        items = [(check_path(path), data) for path, data in files.items()]
        for path, data in items:
            if not isinstance(data, bytes):
                raise TypeError(f"write_many() takes bytes, got {type(data).__name__} for {path!r}; pass bytes(data)")
        if not items:
            return []
        etags = self._call("write", items[0][0] if len(items) == 1 else None, lambda: self._write_many(items))
        return [StoredFile(path, len(data), etag) for (path, data), etag in zip(items, etags, strict=True)]

    def list(self, prefix: str = "") -> builtins.list[StoredFile]:
        """The files whose path starts with `prefix` (a plain string prefix: 'v1' matches 'v1/a' and 'v10'), sorted
        by path. A bucket that does not exist yet lists as empty."""
        check_path(prefix, prefix=True)
        folder = prefix[: prefix.rfind("/") + 1]
        try:
            files = self._call("list", folder or None, lambda: builtins.list(self._list(folder)))
        except FileNotFoundError:
            return []
        return sorted((f for f in files if f.path.startswith(prefix)), key=lambda f: f.path)

    def move(self, source: str, target: str) -> None:
        """Move the file at `source` to `target` (replacing a file there) without reading it: a rename on a local
        folder, a server-side copy then a delete on S3 and the Hub (not atomic there)."""
        check_path(source)
        check_path(target)
        self._call("move", source, lambda: self._move(source, target))

    def delete(self, paths: Iterable[str]) -> None:
        """Delete the files at `paths`, skipping missing ones. Not atomic as a group."""
        paths = [check_path(p) for p in paths]
        if not paths:
            return
        try:
            self._call("delete", paths[0] if len(paths) == 1 else None, lambda: self._delete(paths))
        except FileNotFoundError:
            pass

    def _call(self, operation: str, path: str | None, call: Callable[[], T]) -> T:
        """Run `call`, retrying while the bucket is unreachable, and raise the documented errors. Nothing is sent
        while the server's rate limit holds (a 429 seen through `traffic`)."""
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
                    when = time.strftime("%H:%M:%S", time.localtime(until))
                    logger.warning(
                        "%s %s: %s; nothing sent before %s", operation, self._where(path), failure.reason, when
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
        """The exception a caller sees for a classified failure."""
        if failure.kind is FileNotFoundError:
            return FileNotFoundError(f"{path!r} does not exist in {self.url}")
        if failure.kind is FileExistsError:
            return FileExistsError(f"{operation} {path!r} in {self.url} refused: {failure.reason}")
        said = f"{operation} failed: {failure.reason}"
        if failure.kind is BucketNotFoundError:
            return BucketNotFoundError(said, url=self.url, path=path)
        if failure.kind is AccessDeniedError:
            return AccessDeniedError(said, url=self.url, path=path, status=failure.status)
        if failure.kind is BucketUnreachableError:
            return BucketUnreachableError(
                f"{operation} failed after {attempts} attempt(s) over {elapsed:.1f} s, the bucket did not answer: "
                f"{failure.reason}. Check that the server is up and the URL or endpoint is right; "
                f"pass retry=RetryPolicy(...) to wait longer",
                url=self.url,
                path=path,
                attempts=attempts,
            )
        return StorageError(said, url=self.url, path=path)

    def _too_large(self, path: str, limit: int, size: int | None = None) -> FileTooLargeError:
        return FileTooLargeError(url=self.url, path=path, limit=limit, size=size)

    def _read_local(self, local: str | os.PathLike[str], path: str, max_bytes: int | None) -> bytes:
        """Read a local file that holds the bucket's `path`: its size checked before reading, and at most
        `max_bytes` + 1 bytes read (a file that grows meanwhile is caught too)."""
        fd = os.open(local, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO planted there is never waited on
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise FileNotFoundError(errno.ENOENT, "not a regular file", os.fspath(local))
        with open(fd, "rb") as f:
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
    def _classify(self, error: Exception) -> Failure | None:
        """What an exception of this backend's primitives means, or None to let it through (a bug). The one place
        where a backend's transport errors become ours."""

    @abstractmethod
    def _read(self, path: str, max_bytes: int | None, listed: StoredFile | None) -> bytes:
        """The content of `path` (checked); past `max_bytes` (when not None), `self._too_large(...)` having read at
        most about that much. `listed`: the entry a listing gave for `path`, for backends that read by it."""

    def _write_many(self, files: builtins.list[tuple[str, bytes]]) -> builtins.list[str | None]:
        """Write `files` (checked, not empty); return each one's etag where the backend knows it. One `_write`
        each unless the backend can do better."""
        return [self._write(path, data) for path, data in files]

    @abstractmethod
    def _write(self, path: str, data: bytes) -> str | None:
        """Create or replace `path` with `data`; return what names the content, where the backend knows it."""

    @abstractmethod
    def _move(self, source: str, target: str) -> None:
        """Move `source` to `target` without the content passing through this process."""

    @abstractmethod
    def _list(self, folder: str) -> Iterable[StoredFile]:
        """Every file under `folder` ('' for the root, else ending with '/'), at any depth; may yield more (the
        caller filters); may raise FileNotFoundError for a missing bucket."""

    @abstractmethod
    def _delete(self, paths: builtins.list[str]) -> None:
        """Delete `paths` (checked, not empty), skipping missing ones."""

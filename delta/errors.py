"""Every error the `delta` package raises on purpose: each subclasses a builtin where one fits, and carries the
fields a caller needs to act (tensor, path, version) besides the message."""

from __future__ import annotations

from typing import Any

__all__ = [
    "AccessDeniedError",
    "AdapterRefusedError",
    "BucketNotFoundError",
    "BucketUnreachableError",
    "DeltaError",
    "DeltaFormatError",
    "FileTooLargeError",
    "IntegrityError",
    "KeyFormatError",
    "NoPathError",
    "PrivateFileError",
    "PublishError",
    "RateLimitedError",
    "ReplyLimitError",
    "StateMismatchError",
    "StorageError",
    "UntrustedVersionError",
    "printable",
]


def printable(text: str) -> str:
    """`text` with unprintable characters escaped (`\x1b`, `\n`, `\u202e`): what a file says reaches a terminal as one
    line, never as sequences it runs. Everything the command line prints from a file goes through it."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def shown(value: Any, limit: int = 40) -> str:
    """A short, printable form of `value` for an error message: neither a huge value nor a control character
    reaches a terminal."""
    text = printable(repr(value))
    return text if len(text) <= limit else text[:limit] + "..."


class DeltaError(Exception):
    """Base class of all errors raised by `delta` on purpose."""


class DeltaFormatError(DeltaError, ValueError):
    """A file is not a valid delta or anchor (bad header, unknown format, wrong stream sizes); `path` and `tensor` say
    where, when known."""

    def __init__(self, message: str, *, path: str | None = None, tensor: str | None = None) -> None:
        prefix = ""
        if path:
            prefix += f"{path}: "
        if tensor is not None:
            prefix += f"tensor {tensor!r}: "
        super().__init__(prefix + message)
        self.path = path
        self.tensor = tensor
        self.detail = message

    def at(self, path: str | None) -> DeltaFormatError:
        """This error with the file's path in front, when it has none yet (codecs do not know the path)."""
        if not path or self.path:
            return self
        return DeltaFormatError(self.detail, path=path, tensor=self.tensor)


class StateMismatchError(DeltaError, ValueError):
    """A delta does not fit the state it is applied to: a missing tensor, another shape or dtype (`tensor`), or another
    base (`tensor` None)."""

    def __init__(self, message: str, *, tensor: str | None = None) -> None:
        super().__init__((f"tensor {tensor!r}: " if tensor else "") + message)
        self.tensor = tensor


class IntegrityError(DeltaError):
    """Data failed a hash check (a state after applying, or a file): the `expected` and `actual` hashes, and the `path`
    when about a file."""

    def __init__(self, message: str, *, expected: str, actual: str, path: str | None = None) -> None:
        super().__init__(f"{message} (expected {expected}, got {actual})")
        self.expected = expected
        self.actual = actual
        self.path = path


class StorageError(DeltaError, OSError):
    """A bucket operation failed for another reason than a missing file (which raises `FileNotFoundError`): refused
    credentials, a server error, a local disk error. `url` never holds a secret; `path` is None for several files."""

    def __init__(self, message: str, *, url: str, path: str | None = None) -> None:
        super().__init__(f"{url}{'/' + path if path else ''}: {message}")
        self.url = url
        self.path = path


class BucketUnreachableError(StorageError, ConnectionError):
    """The bucket could not be reached after the bounded retries (connection refused or reset, timeout, HTTP 429 or
    5xx), after `attempts` tries; calling again later may succeed."""

    def __init__(self, message: str, *, url: str, path: str | None = None, attempts: int = 1) -> None:
        super().__init__(message, url=url, path=path)
        self.attempts = attempts


class AccessDeniedError(StorageError, PermissionError):
    """The bucket refused the credentials (HTTP 401 or 403, `status`): never retried, since waiting does not change a
    token. The message says what the server said and what to change."""

    def __init__(self, message: str, *, url: str, path: str | None = None, status: int | None = None) -> None:
        super().__init__(message, url=url, path=path)
        self.status = status


class BucketNotFoundError(StorageError, FileNotFoundError):
    """The bucket itself does not exist (on the Hub: or the token cannot see it). A reader takes it as "nothing there
    yet" (a `FileNotFoundError`); a writer that may not create it stops. The message says how to create it."""


class RateLimitedError(BucketUnreachableError):
    """The server asked this client to slow down (HTTP 429): nothing is sent before `retry_at` (Unix time, from its
    `RateLimit` or `Retry-After` headers); the loops that must not give up wait until then."""

    def __init__(self, message: str, *, url: str, path: str | None = None, attempts: int = 1, retry_at: float) -> None:
        super().__init__(message, url=url, path=path, attempts=attempts)
        self.retry_at = retry_at


class FileTooLargeError(StorageError):
    """A file is larger than its reader takes (`limit`): refused before it was read whole, not retried. `size` is None
    where the bucket did not say it."""

    def __init__(self, *, url: str, path: str, limit: int, size: int | None = None) -> None:
        told = f"{size:,} bytes" if size is not None else "more bytes"
        super().__init__(
            f"{told}, more than the {limit:,} this file may hold: refused, not read past that", url=url, path=path
        )
        self.limit = limit
        self.size = size


class PublishError(DeltaError, RuntimeError):
    """The publisher's background thread stopped on an error it cannot retry (refused credentials, a full disk, ranks
    out of step): nothing after the last committed version was published. A new `Publisher` resumes from the bucket."""


class NoPathError(DeltaError, LookupError):
    """No usable chain of files leads to version `target`: every route crosses a bad or missing file. Wait for the next
    anchor, or publish one (`Publisher.publish(..., anchor=True)`)."""

    def __init__(self, message: str, *, target: int) -> None:
        super().__init__(message)
        self.target = target


class ReplyLimitError(DeltaError, ConnectionError):
    """An HTTP reply past its reader's bounds (`limit`: "size" or "time"): refused, not read further."""

    def __init__(self, message: str, *, limit: str) -> None:
        super().__init__(message)
        self.limit = limit


class AdapterRefusedError(DeltaError, ValueError):
    """An adapter version a sidecar will not load: another base, a rank above the server's max, tensors that are not
    the run's adapter, or no adapter run. `reason` names the kind, as the follower's status counts them."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class PrivateFileError(DeltaError, PermissionError):
    """A file that must be private to this user (a key, the launcher's tokens) is a link, a FIFO, a folder, a device,
    another user's, or too large: refused unread (`delta.private`)."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(printable(f"{path}: {reason}: refused (remove it, or put a regular file of yours there)"))
        self.path = path


class KeyFormatError(DeltaError, ValueError):
    """Text that should hold a key (`delta.signing`) does not. The message never quotes the text: it may be a
    private key pasted into the wrong place."""


class UntrustedVersionError(DeltaError):
    """A version (None: the run's settings) not signed by the trusted key: unsigned, badly signed, another key without
    a handover, another run, or older than one a reader applied (`reason`: "rollback"). Nothing of it was applied;
    the reader waits for the trainer's next one."""

    def __init__(self, message: str, *, version: int | None, reason: str) -> None:
        super().__init__(printable(message))
        self.version = version
        self.reason = reason

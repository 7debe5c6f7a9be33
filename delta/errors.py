"""Every error the `delta` package raises on purpose.

Each class subclasses a builtin where one fits, so callers that only know the builtin still catch it,
and carries the fields a caller needs to act (tensor name, path, version) besides the message.
"""

from __future__ import annotations


def printable(text: str) -> str:
    """`text` with control and other unprintable characters escaped (`\\x1b`, `\\n`, `\\u202e`): what a
    file says reaches a terminal as one line it shows, never as sequences it runs.

    Everything the command line prints from a file (names, hashes, metadata, error messages) goes
    through this one function.
    """
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


class DeltaError(Exception):
    """Base class of all errors raised by `delta` on purpose."""


class DeltaFormatError(DeltaError, ValueError):
    """A file is not a valid delta or anchor: bad header, unknown format version, wrong stream sizes.

    Attributes:
        path: The file, when known.
        tensor: The tensor the problem was found in, when it is about one tensor.
    """

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
    """A delta does not fit the state it is applied to: missing tensor, other shape or dtype, other base.

    Attributes:
        tensor: The tensor that does not fit, or None when the whole state does not (base hash).
    """

    def __init__(self, message: str, *, tensor: str | None = None) -> None:
        super().__init__((f"tensor {tensor!r}: " if tensor else "") + message)
        self.tensor = tensor


class IntegrityError(DeltaError):
    """Data failed a hash check: a state after applying, or a file against its recorded checksum.

    Attributes:
        expected: The hash that was recorded.
        actual: The hash that was computed.
        path: The file, when the check was about a file.
    """

    def __init__(self, message: str, *, expected: str, actual: str, path: str | None = None) -> None:
        super().__init__(f"{message} (expected {expected}, got {actual})")
        self.expected = expected
        self.actual = actual
        self.path = path


class StorageError(DeltaError, OSError):
    """A bucket operation failed for another reason than a missing file: refused credentials, a server
    error, a local disk error. Missing files raise the builtin `FileNotFoundError` instead.

    Attributes:
        url: The bucket, as given to `open_storage` (never holds a token or secret).
        path: The file inside the bucket, or None when the operation was about several files.
    """

    def __init__(self, message: str, *, url: str, path: str | None = None) -> None:
        super().__init__(f"{url}{'/' + path if path else ''}: {message}")
        self.url = url
        self.path = path


class BucketUnreachableError(StorageError, ConnectionError):
    """The bucket could not be reached, even after the bounded retries: connection refused or reset,
    timeout, or the server answered "try later" (HTTP 429 or 5xx). Calling again later may succeed.

    Attributes:
        url: The bucket.
        path: The file inside the bucket, or None when the operation was about several files.
        attempts: How many times the operation was tried.
    """

    def __init__(self, message: str, *, url: str, path: str | None = None, attempts: int = 1) -> None:
        super().__init__(message, url=url, path=path)
        self.attempts = attempts


class FileTooLargeError(StorageError):
    """A file is larger than its reader takes (`Storage.read(path, max_bytes=...)`): refused before it was read
    whole, so no file in a bucket costs a reader more memory than the limit it states. Not retried.

    Attributes:
        url: The bucket.
        path: The file.
        limit: The most bytes the reader takes.
        size: The file's size where the bucket told it, or None where more than `limit` bytes came while reading.
    """

    def __init__(self, *, url: str, path: str, limit: int, size: int | None = None) -> None:
        told = f"{size:,} bytes" if size is not None else "more bytes"
        super().__init__(
            f"{told}, more than the {limit:,} this file may hold: refused, not read past that", url=url, path=path
        )
        self.limit = limit
        self.size = size


class PublishError(DeltaError, RuntimeError):
    """The publisher's background thread stopped on an error it cannot retry (refused credentials,
    a full disk, ranks out of step). Nothing after the last committed version was published; create a
    new `Publisher` (it resumes from the bucket) once the cause is fixed."""


class NoPathError(DeltaError, LookupError):
    """No usable chain of files leads to the target version: every route crosses a bad or missing
    file. Wait for the next anchor to be published, or publish one (`Publisher.publish(..., anchor=True)`).

    Attributes:
        target: The version that could not be reached.
    """

    def __init__(self, message: str, *, target: int) -> None:
        super().__init__(message)
        self.target = target


class ReplyLimitError(DeltaError, ConnectionError):
    """An HTTP reply past its reader's bounds (`read_reply`): more bytes than it takes, or still coming at its
    deadline. Refused, not read further: a broken or hostile server costs its client no more than the bounds.

    Attributes:
        limit: "size" or "time".
    """

    def __init__(self, message: str, *, limit: str) -> None:
        super().__init__(message)
        self.limit = limit


class AdapterRefusedError(DeltaError, ValueError):
    """An adapter version a sidecar will not load into its server: trained on another base, of a rank above the
    server's max, tensors that are not the run's adapter, or a bucket whose run publishes no adapter.

    Attributes:
        reason: A few words naming the kind of refusal, as the follower's status counts them ("another base",
            "rank above max", "bad adapter"; an app's own, such as "not an adapter run").
    """

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class PrivateFileError(DeltaError, PermissionError):
    """A file that must be private to this user (a signing key, a trusted key, the launcher's tokens) is not a
    regular file owned by this user: a symbolic link, a FIFO, a folder, a device, another user's file, or one too
    large. It is refused without being followed or read (`delta.private`).

    Attributes:
        path: The file.
    """

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(printable(f"{path}: {reason}: refused (remove it, or put a regular file of yours there)"))
        self.path = path


class KeyFormatError(DeltaError, ValueError):
    """Text that should hold a key (`delta.signing`) does not. The message never quotes the text: it may be a
    private key pasted into the wrong place."""


class UntrustedVersionError(DeltaError):
    """A version (or the run's settings) not signed by the key this reader trusts: unsigned, signed wrongly, signed by
    another key with no handover from the trusted one, or of another run than the state held. Nothing of it was
    applied; the reader keeps what it held and takes the trainer's next version as usual.

    Attributes:
        version: The version refused (None for other signed files, such as a run's settings).
        reason: A few words naming the kind ("unsigned", "bad signature", "another key", "another run").
    """

    def __init__(self, message: str, *, version: int | None, reason: str) -> None:
        super().__init__(printable(message))
        self.version = version
        self.reason = reason

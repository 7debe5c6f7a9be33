"""A bucket in a local directory: the embedded default, and what tests and single-machine runs use."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from ..atomic import TMP_PREFIX, write_atomic
from ..errors import StorageError
from ..retry import RetryPolicy
from ._base import Failure, Storage, StoredFile
from ._traffic import Traffic

T = TypeVar("T")


class LocalStorage(Storage):
    """A directory on the local disk (or a shared mount) used as a bucket; created if missing.

    Atomicity: a write goes to a temporary file in the same directory, is flushed and fsynced, then
    renamed over the target with `os.replace`, and the directory is fsynced: a reader sees the old
    file or the new one, never a mix, and after a crash the file is whole or absent. A process killed
    mid-write can leave a `.delta-tmp-*` file behind; listings hide it. `delete` removes files one by
    one (not atomic as a group) and leaves empty directories in place.

    Local failures are not retried: a full disk or a permission error does not go away by waiting.

    Planted names: a folder where a file is written is refused (`FileExistsError`), never written into; a FIFO, a
    socket or a device is not listed, and reads as missing (never waited on).

    Links: a file that is a symbolic link out of the directory (or sits below a linked folder that leads out)
    reads as missing, and writes and deletes through such a folder are refused: the bucket's files are
    written by strangers, and a link must not make a reader take, or a writer touch, a file elsewhere.

    Requests: none leave the machine; `traffic` counts each call by its kind (read, write, list, move, delete).

    Args:
        root: The directory; `~` is expanded.
        retry: Accepted for symmetry with the other backends; local errors are never transient.
        traffic: Where calls are counted (None: a `Traffic` of its own).
    """

    def __init__(
        self, root: str | os.PathLike[str], *, retry: RetryPolicy | None = None, traffic: Traffic | None = None
    ) -> None:
        self.root = Path(root).expanduser().absolute()
        super().__init__(self.root.as_uri(), retry=retry, traffic=traffic)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise StorageError(f"cannot create the bucket directory: {error}", url=self.url) from error
        self._real_root = self.root.resolve()

    @property
    def identity(self) -> str:
        """The folder's real path (links and `..` resolved), as a `file://` URL."""
        return self._real_root.as_uri()

    def _call(self, operation: str, path: str | None, call: Callable[[], T]) -> T:
        self.traffic.count(operation)
        return super()._call(operation, path, call)

    def _inside(self, path: Path, what: str) -> Path:
        """`path`, if it resolves (links followed) inside the bucket; else FileNotFoundError for a read,
        PermissionError for a write or delete."""
        if not path.resolve().is_relative_to(self._real_root):
            error = FileNotFoundError if what == "read" else PermissionError
            raise error(f"{what} refused: {path} is or lies under a link that leaves the bucket")
        return path

    def _classify(self, error: Exception) -> Failure | None:
        if isinstance(error, (FileNotFoundError, IsADirectoryError, NotADirectoryError)):
            return Failure(FileNotFoundError, str(error))
        if isinstance(error, FileExistsError):
            return Failure(FileExistsError, error.strerror or str(error))
        if isinstance(error, OSError):
            return Failure(StorageError, str(error))
        return None

    def _read(self, path: str, max_bytes: int | None, listed: StoredFile | None) -> bytes:
        return self._read_local(self._inside(self.root / path, "read"), path, max_bytes)

    def _write(self, path: str, data: bytes) -> str | None:
        target = self.root / path
        if target.name.startswith(TMP_PREFIX):
            raise ValueError(f"invalid bucket path {path!r}: names starting with {TMP_PREFIX!r} are reserved")
        self._inside(target.parent, "write")
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            write_atomic(target, data)
        except IsADirectoryError:  # a folder at the name, planted or mistaken: never written into, said as such
            raise FileExistsError(errno.EEXIST, "a folder holds its name", path) from None
        return None

    def _move(self, source: str, target: str) -> None:
        to = self.root / target
        if to.name.startswith(TMP_PREFIX):
            raise ValueError(f"invalid bucket path {target!r}: names starting with {TMP_PREFIX!r} are reserved")
        origin = self._inside(self.root / source, "read")
        self._inside(to.parent, "write")
        to.parent.mkdir(parents=True, exist_ok=True)
        os.replace(origin, to)

    def _list(self, folder: str) -> Iterator[StoredFile]:
        for directory, _, names in os.walk(self.root / folder):
            relative = Path(directory).relative_to(self.root).as_posix()
            for name in names:
                if name.startswith(TMP_PREFIX):
                    continue
                try:
                    info = os.stat(os.path.join(directory, name))
                except FileNotFoundError:  # deleted since the directory was read
                    continue
                if stat.S_ISREG(info.st_mode):  # a FIFO, a socket or a device planted here is no file of the bucket
                    yield StoredFile(name if relative == "." else f"{relative}/{name}", info.st_size)

    def _delete(self, paths: list[str]) -> None:
        for path in paths:
            target = self.root / path
            (self._inside(target.parent, "delete") / target.name).unlink(missing_ok=True)

"""One way to replace a file so that a reader, or the disk after a crash, sees the old file or the new
one and never a torn mix: write a fresh temporary file beside it, fsync it, rename it over the target,
fsync the directory. Everything in this project that writes a file in place goes through here.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

__all__ = ["atomic_path", "write_atomic"]

#: Temporary files start with this; a process killed mid-write can leave one behind (bucket listings hide them).
TMP_PREFIX = ".delta-tmp-"


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str], mode: int = 0o666, replace: bool = True) -> Iterator[Path]:
    """Yield a new temporary path beside `path` to write; on a clean exit it replaces `path` durably.

    If the block raises, the temporary file is removed and `path` is untouched. The temporary file is
    created empty (exclusively, so no other writer shares it, and never through a link) before the block runs.

    Args:
        mode: The new file's permissions, less the umask (0o600: its owner's alone, from the first byte).
        replace: False: `path` is created only if it does not exist (hard-linked into place, atomically), else
            FileExistsError and `path` is untouched: of two processes making the same file, one wins and the other
            reads it.
    """
    target = Path(path)
    tmp = target.with_name(f"{TMP_PREFIX}{uuid.uuid4().hex}")
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode))
    try:
        yield tmp
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        if replace:
            os.replace(tmp, target)
        else:
            os.link(tmp, target, follow_symlinks=False)
    finally:
        tmp.unlink(missing_ok=True)  # still there after a link, or when something failed before the rename
    _fsync_directory(target.parent)


def write_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    """Replace the file at `path` with `data`, durably and atomically (see `atomic_path`)."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def _fsync_directory(directory: Path) -> None:
    """Make a rename inside `directory` durable across a power loss."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)

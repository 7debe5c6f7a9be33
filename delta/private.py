"""Files private to this user: the trainer's signing key, the keys a reader trusts, the launcher's tokens.

A private file is read only if it is a regular file owned by this user, checked on the open descriptor (what is
checked is what is read): it is opened without following a symbolic link (`O_NOFOLLOW`) and without waiting on a
FIFO (`O_NONBLOCK`), so a link, a FIFO, a folder or another user's file planted in its place is refused in one line
(`PrivateFileError`), never followed, never waited on. One that others may read is made owner-only (0600) through
the same descriptor, and said so. A public key a reader trusts is read the same way (`read_public`): others may
read it, but one that others may change is refused, as ssh refuses an `authorized_keys` others can write. A private
file is written whole, owner-only from its first byte, into a folder of
this user's (made 0700), through `delta.atomic`.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
from pathlib import Path

from .atomic import atomic_path
from .errors import PrivateFileError

logger = logging.getLogger(__name__)

__all__ = ["read_private", "read_public", "write_private"]

#: The largest private file read (keys and tokens take a few hundred bytes).
MAX_PRIVATE_BYTES = 64 << 10


def read_private(path: str | os.PathLike[str], max_bytes: int = MAX_PRIVATE_BYTES) -> bytes | None:
    """The bytes of the private file at `path`, or None when there is none.

    Raises:
        PrivateFileError: a link, a FIFO, a folder, a device, another user's file, or more than `max_bytes`.
        OSError: it cannot be read (a disk error).
    """
    return _read_own(os.fspath(path), max_bytes, public=False)


def read_public(path: str | os.PathLike[str], max_bytes: int = MAX_PRIVATE_BYTES) -> bytes | None:
    """The bytes of the file of this user's at `path` that others may read but not change (a trainer's public key a
    reader trusts), or None when there is none: what it names decides whose weights are applied.

    Raises:
        PrivateFileError: a link, a FIFO, a folder, a device, another user's file, one that other users may write to,
            or more than `max_bytes`.
        OSError: it cannot be read (a disk error).
    """
    return _read_own(os.fspath(path), max_bytes, public=True)


def _read_own(name: str, max_bytes: int, public: bool) -> bytes | None:
    """`read_private` (`public`: False) or `read_public`, checked on the descriptor read through."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise PrivateFileError(name, "is a symbolic link") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise PrivateFileError(name, f"is not a regular file ({_kind(info.st_mode)})")
        if info.st_uid != os.geteuid():
            raise PrivateFileError(name, f"is owned by user {info.st_uid}, not by this user ({os.geteuid()})")
        if info.st_size > max_bytes:
            raise PrivateFileError(name, f"holds {info.st_size:,} bytes, more than the {max_bytes:,} it may")
        if public and info.st_mode & 0o022:
            raise PrivateFileError(
                name, f"can be changed by other users (mode {stat.S_IMODE(info.st_mode):o}; chmod go-w it)"
            )
        if not public and info.st_mode & 0o077:
            logger.warning(
                "%s could be read by other users (mode %o): made owner-only (0600)", name, stat.S_IMODE(info.st_mode)
            )
            os.fchmod(fd, 0o600)
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(max_bytes + 1)[:max_bytes]
    finally:
        os.close(fd)


def write_private(path: str | os.PathLike[str], data: bytes, replace: bool = True) -> bool:
    """Write `data` as the private file at `path` (0600), atomically, in a folder of this user's (made 0700).

    Args:
        replace: False: write only if no file is there yet (of two processes making it, one wins); True: replace it.

    Returns:
        False when `replace` is False and a file was there already (left as it was), else True.

    Raises:
        PrivateFileError: the folder is a link, not a folder, or another user's.
        OSError: it cannot be written.
    """
    target = Path(path)
    target.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    folder = os.lstat(target.parent)
    if not stat.S_ISDIR(folder.st_mode):
        raise PrivateFileError(str(target.parent), f"is not a folder ({_kind(folder.st_mode)})")
    if folder.st_uid != os.geteuid():
        raise PrivateFileError(str(target.parent), f"is owned by user {folder.st_uid}, not by this user")
    try:
        with atomic_path(target, mode=0o600, replace=replace) as tmp:
            tmp.write_bytes(data)
    except FileExistsError:
        if replace:
            raise
        return False
    return True


def _kind(mode: int) -> str:
    for test, kind in (
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a device"),
        (stat.S_ISBLK, "a device"),
    ):
        if test(mode):
            return kind
    return "not a regular file"

"""`delta.private`: a private file is read only when it is a regular file of this user's, checked on the descriptor
it is read through; links, FIFOs, folders and other users' files are refused in one line, never followed or waited
on; writes are owner-only from the first byte."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from delta.errors import PrivateFileError
from delta.private import read_private, write_private


def test_a_private_file_is_written_owner_only_in_an_owner_only_folder_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "keys" / "one.key"
    assert read_private(path) is None
    assert write_private(path, b"secret")
    assert read_private(path) == b"secret"
    assert oct(path.stat().st_mode & 0o777) == "0o600" and oct(path.parent.stat().st_mode & 0o777) == "0o700"
    assert write_private(path, b"other") and read_private(path) == b"other"
    assert not write_private(path, b"third", replace=False) and read_private(path) == b"other"  # one maker wins
    assert [p.name for p in path.parent.iterdir()] == ["one.key"]  # no temporary file left


def test_a_file_others_may_read_is_made_owner_only_through_its_descriptor(tmp_path: Path) -> None:
    path = tmp_path / "t"
    write_private(path, b"x")
    path.chmod(0o644)
    assert read_private(path) == b"x" and oct(path.stat().st_mode & 0o777) == "0o600"


def test_a_link_is_refused_and_its_target_left_alone(tmp_path: Path) -> None:
    planted = tmp_path / "planted"
    planted.write_bytes(b"someone else's token")
    planted.chmod(0o644)
    link = tmp_path / "t"
    link.symlink_to(planted)
    with pytest.raises(PrivateFileError, match=r"/t: is a symbolic link: refused \(remove it"):
        read_private(link)
    assert oct(planted.stat().st_mode & 0o777) == "0o644"  # never followed: the target's mode is not changed
    write_private(link, b"mine")  # a write replaces the link itself, never writes through it
    assert planted.read_bytes() == b"someone else's token" and not link.is_symlink()


def test_a_fifo_is_refused_at_once_never_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "t"
    os.mkfifo(fifo)
    result: list[BaseException] = []
    reader = threading.Thread(target=lambda: _refused(fifo, result), daemon=True)
    reader.start()
    reader.join(5)
    assert not reader.is_alive(), "reading a FIFO hung"
    assert "is not a regular file (a FIFO)" in str(result[0])


def test_a_folder_is_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "t").mkdir()
    with pytest.raises(PrivateFileError) as refused:
        read_private(tmp_path / "t")
    assert str(refused.value).endswith("/t: is not a regular file (a folder): refused (remove it, or put a regular "
                                       "file of yours there)")
    assert "\n" not in str(refused.value)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_another_users_file_or_folder_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "t"
    write_private(path, b"x")
    os.chown(path, 65534, 65534)
    with pytest.raises(PrivateFileError, match="is owned by user 65534, not by this user"):
        read_private(path)
    folder = tmp_path / "theirs"
    folder.mkdir()
    os.chown(folder, 65534, 65534)
    with pytest.raises(PrivateFileError, match="theirs: is owned by user 65534"):
        write_private(folder / "t", b"x")


def test_a_linked_folder_and_an_oversized_file_are_refused(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "linked").symlink_to(tmp_path / "real")
    with pytest.raises(PrivateFileError, match="linked: is not a folder \\(a symbolic link\\)"):
        write_private(tmp_path / "linked" / "t", b"x")
    write_private(tmp_path / "big", b"x" * 100)
    with pytest.raises(PrivateFileError, match="holds 100 bytes, more than the 10 it may"):
        read_private(tmp_path / "big", max_bytes=10)


def _refused(path: Path, result: list[BaseException]) -> None:
    try:
        read_private(path)
    except PrivateFileError as e:
        result.append(e)

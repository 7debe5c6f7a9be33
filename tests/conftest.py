"""Fixtures shared by several test files."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.rclone_server import RcloneS3Server


@pytest.fixture
def rclone_s3(tmp_path: Path) -> Iterator[RcloneS3Server]:
    """A running `rclone serve s3` over `tmp_path / "s3"`, stopped after the test. Stop, pause and
    restart it freely inside the test: see `RcloneS3Server`."""
    with RcloneS3Server(tmp_path / "s3") as server:
        yield server

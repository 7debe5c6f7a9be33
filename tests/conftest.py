"""Fixtures shared by several test files.

Nothing of the web stack (uvicorn, httpx, the apps) is imported here: every test collects this file, and
`delta`'s own tests must collect and run with `delta`'s dependencies and the test tools alone
(`tests/test_collect.py`). A fixture that needs a server imports it when it runs.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

# Keys the tests make (a trainer's, kept per bucket) and trust (on first use, per bucket) go to a cache of this test
# session, never to the user's (`delta.signing.cache_dir`); child processes inherit it. The caches other libraries
# find under XDG_CACHE_HOME stay where they were.
for _variable, _default in (("HF_HOME", "huggingface"), ("VLLM_CACHE_ROOT", "vllm"), ("TORCH_HOME", "torch")):
    os.environ.setdefault(_variable, os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"),
                                                  _default))
os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="delta-tests-cache-")
atexit.register(shutil.rmtree, os.environ["XDG_CACHE_HOME"], ignore_errors=True)

if TYPE_CHECKING:
    from tests.rclone_server import RcloneS3Server


@pytest.fixture
def rclone_s3(tmp_path: Path) -> Iterator[RcloneS3Server]:
    """A running `rclone serve s3` over `tmp_path / "s3"`, stopped after the test. Stop, pause and
    restart it freely inside the test: see `RcloneS3Server`."""
    from tests.rclone_server import RcloneS3Server

    with RcloneS3Server(tmp_path / "s3") as server:
        yield server

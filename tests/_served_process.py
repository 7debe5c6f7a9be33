"""`ServedProcess`: a test server run as a real child process on 127.0.0.1 that tests can stop (gracefully or with
SIGKILL), pause (SIGSTOP: connections are accepted by the kernel but never answered, like a hung server) and start
again on the same port. The S3 server (`tests.rclone_server`) and the local Hub (`tests.local_hub.server`) are two."""

from __future__ import annotations

import ctypes
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Self


class ServedProcess:
    """One server process; a subclass says how to start it (`start`, through `_launch`) and names it (`name`).

    Attributes:
        port: Kept across restarts.
        log_path: Where the server's output goes, appended across restarts.
    """

    name = "the server"

    def __init__(self, port: int, log_path: Path) -> None:
        self.port = port
        self.log_path = log_path
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self, timeout: float = 60.0) -> None:
        raise NotImplementedError

    def _launch(self, command: list[str], ready: Callable[[], bool], timeout: float, cwd: Path | None = None) -> None:
        """Start `command` and return once `ready()` is true.

        Raises:
            RuntimeError: It is already running, or it exited or was not ready within `timeout` seconds; the message
                holds its log.
        """
        if self.running:
            raise RuntimeError(f"{self.name} is already serving {self.endpoint}")
        with open(self.log_path, "ab") as log:
            self._process = subprocess.Popen(
                command, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                preexec_fn=_die_with_parent,
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while not ready():
            if self._process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"{self.name} did not start on port {self.port}; its log:\n{self.log_tail()}")
            time.sleep(0.02)

    def stop(self, *, kill: bool = False, timeout: float = 10.0) -> None:
        """Stop the server (SIGTERM, or SIGKILL with `kill=True`). Safe when it is not running; a paused server is
        resumed first so that it can exit."""
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

    def restart(self, *, kill: bool = False) -> None:
        """Stop, then start again on the same port and data."""
        self.stop(kill=kill)
        self.start()

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): connections are accepted by the kernel but never answered."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        """Undo `pause`."""
        self._signal(signal.SIGCONT)

    def _signal(self, sig: signal.Signals) -> None:
        if self._process is None or self._process.poll() is not None:
            raise RuntimeError(f"{self.name} is not running on {self.endpoint}")
        self._process.send_signal(sig)

    def log_tail(self, lines: int = 40) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.stop()


def _die_with_parent() -> None:
    """Have Linux send SIGTERM to the server when the thread that started it dies, so that no server outlives a
    crashed or killed test run."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG

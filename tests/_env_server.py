"""Real servers for the tests: ``python app.py ROLE`` on a free loopback port, or an app in a thread."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from tests._ports import free_port

REPO = Path(__file__).resolve().parents[1]


def wait_healthy(proc: subprocess.Popen, url: str, output: Path, timeout_s: float = 120.0) -> None:
    """Until ``GET url/health`` answers 200; AssertionError with the process's `output` if it exits or
    `timeout_s` passes first."""
    deadline = time.monotonic() + timeout_s
    while True:
        assert proc.poll() is None and time.monotonic() < deadline, output.read_text(errors="replace")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                return
        time.sleep(0.2)


@dataclass
class App:
    """A running ``python app.py ROLE``: its URL, its process and the file its output goes to."""

    url: str
    proc: subprocess.Popen
    log: Path

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@contextlib.contextmanager
def running_app(*args: str, env: dict[str, str] | None = None, timeout_s: float = 120.0, port: int | None = None,
                log: Path | None = None) -> Iterator[App]:
    """Run ``python app.py *args --port P`` on loopback until ``/health`` answers; yield it as an `App`.

    The process is stopped on exit (SIGTERM, then SIGKILL after 30 s; a test may have killed it already);
    its output is shown if it dies or never gets ready, or exits with an error. ``port``: P (default a free
    one), given to start a server again where its callers expect it. ``log``: where its output goes (default
    a temporary file).
    """
    port = port or free_port()
    with contextlib.ExitStack() as stack:
        if log is None:
            log = Path(stack.enter_context(tempfile.TemporaryDirectory())) / "app.log"
        out = stack.enter_context(open(log, "w+"))
        proc = subprocess.Popen(
            [sys.executable, "app.py", *args, "--host", "127.0.0.1", "--port", str(port)],
            cwd=REPO,
            env={**os.environ, **(env or {})},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        app = App(f"http://127.0.0.1:{port}", proc, log)
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"server on {app.url} did not get ready (exit {proc.returncode}):\n{app.output()}"
                    )
                with contextlib.suppress(httpx.TransportError):
                    if httpx.get(f"{app.url}/health", timeout=1.0).status_code == 200:
                        break
                time.sleep(0.1)
            yield app
        finally:
            if proc.poll() is None:
                proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.returncode not in (0, -15, -9):
                print(f"{' '.join(args[:1])} exited {proc.returncode}:\n{app.output()[-5000:]}", file=sys.stderr)


@contextlib.contextmanager
def running_server(*args: str, env: dict[str, str] | None = None, timeout_s: float = 120.0,
                   port: int | None = None) -> Iterator[str]:
    """`running_app`, yielding only its URL."""
    with running_app(*args, env=env, timeout_s=timeout_s, port=port) as app:
        yield app.url


@contextlib.contextmanager
def serving(app: Any) -> Iterator[str]:
    """Serve ``app`` (ASGI) with uvicorn on a free loopback port in a thread; yield its URL."""
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "the app's server did not start"
        time.sleep(0.05)
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(timeout=10)

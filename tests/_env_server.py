"""Real servers for the tests: ``python app.py ROLE`` on a free loopback port, or an app in a thread."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import uvicorn

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_server(*args: str, env: dict[str, str] | None = None, timeout_s: float = 120.0,
                   port: int | None = None) -> Iterator[str]:
    """Run ``python app.py *args --port P`` on loopback until ``/health`` answers; yield its URL.

    The process is stopped on exit; its output is shown if it dies or never gets ready. ``port``: P
    (default a free one), given to start a server again where its callers expect it.
    """
    port = port or free_port()
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen(
            [sys.executable, "app.py", *args, "--host", "127.0.0.1", "--port", str(port)],
            cwd=REPO,
            env={**os.environ, **(env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    raise RuntimeError(
                        f"server on {url} did not get ready (exit {proc.returncode}):\n{log.read()}"
                    )
                with contextlib.suppress(httpx.TransportError):
                    if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                        break
                time.sleep(0.1)
            yield url
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.returncode not in (0, -15):
                log.seek(0)
                print(f"{' '.join(args[:1])} exited {proc.returncode}:\n{log.read()[-5000:]}", file=sys.stderr)


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

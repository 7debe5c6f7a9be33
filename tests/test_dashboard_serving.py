"""A Space's server with a page open in a browser stops at once on SIGTERM, without cancelling anything: the
page's session heartbeat (a stream that lasts as long as the page) ends at the signal. Plain uvicorn, for
contrast, holds the exit for its whole grace and then cancels the stream with a traceback.

Real servers: a FastAPI app with a Gradio UI mounted, in a child process, on a loopback port.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests._env_server import REPO, free_port, wait_healthy

#: A server of the same shape (a FastAPI app with a Gradio UI mounted) run by plain `uvicorn.run`, for contrast.
PLAIN = textwrap.dedent("""
    import sys
    import gradio as gr
    import uvicorn
    from fastapi import FastAPI
    import settings
    from dashboard.mount import mount_ui

    with gr.Blocks() as demo:
        gr.Markdown("a page")
    api = FastAPI()
    api.get("/health")(lambda: {"status": "ok"})  # before the UI, which takes every path under /
    uvicorn.run(mount_ui(api, demo, ""), host="127.0.0.1", port=int(sys.argv[1]), log_level="warning",
                timeout_graceful_shutdown=settings.SHUTDOWN_GRACE_S)
""")


def stop_with_a_page_open(how: str, tmp_path: Path, sig: signal.Signals = signal.SIGTERM) -> tuple[int, str]:
    """Start the server, open a page's heartbeat stream, send it `sig`: (exit status, its output)."""
    port = free_port()
    out = tmp_path / f"{how}.out"
    command = (["app.py", "env", "--port", str(port)] if how == "python app.py env"
               else ["-c", PLAIN, str(port)])
    with open(out, "wb") as f:
        proc = subprocess.Popen([sys.executable, *command], cwd=REPO, stdout=f, stderr=subprocess.STDOUT)
    try:
        wait_healthy(proc, f"http://127.0.0.1:{port}", out)
        opened = threading.Event()
        stream = threading.Thread(target=hold_heartbeat, args=(f"http://127.0.0.1:{port}", opened), daemon=True)
        stream.start()
        assert opened.wait(30), "the heartbeat stream never answered"
        time.sleep(0.5)  # the first bytes are out: the server holds the stream open now
        proc.send_signal(sig)
        code = proc.wait(60)
        return code, out.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()


def hold_heartbeat(url: str, opened: threading.Event) -> None:
    """What a browser tab on the page keeps open; `opened` is set once the server has answered the stream."""
    try:
        with httpx.stream("GET", f"{url}/gradio_api/heartbeat/tab", timeout=None) as response:
            opened.set()
            for _ in response.iter_bytes():
                pass
    except httpx.HTTPError:
        pass


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_page_open_does_not_hold_the_server_up(tmp_path: Path, sig: signal.Signals) -> None:
    """SIGINT (Ctrl-C) takes SIGTERM's path: the same cleanup, exit status 0, no KeyboardInterrupt traceback."""
    code, output = stop_with_a_page_open("python app.py env", tmp_path, sig)  # served by `dashboard.serving`
    assert code == 0
    assert "graceful shutdown exceeded" not in output and "Traceback" not in output and "CancelledError" not in output
    assert f"{sig.name}: stopping" in output


@pytest.mark.parametrize("how", ["plain uvicorn"])
def test_without_it_the_open_page_holds_the_exit_and_is_cancelled(tmp_path: Path, how: str) -> None:
    code, output = stop_with_a_page_open(how, tmp_path)
    # uvicorn waited its grace out, then cancelled the stream (and, by release, exits 0 or re-raises the signal)
    assert code in (0, -signal.SIGTERM) and "timeout graceful shutdown exceeded" in output

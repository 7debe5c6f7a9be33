"""`python app.py rollout` told to stop in the middle of a long batch: it answers and exits in seconds."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

import httpx

from tests._engines import build_model
from tests._env_server import REPO, free_port


def test_sigterm_during_a_long_generation_answers_503_and_exits_cleanly(tmp_path) -> None:
    model = build_model(str(tmp_path / "model"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "rollout.log", "w+")
    proc = subprocess.Popen(
        [sys.executable, "app.py", "rollout", "--model", model, "--bucket", str(tmp_path / "bucket"),
         "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "4096", "--max-tokens", "4000",
         "--showcase-every", "0"],
        cwd=REPO, env=os.environ.copy(), stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, "the rollout server did not start"
            with contextlib.suppress(httpx.TransportError):
                if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                    break
            time.sleep(0.1)
        answers: list[httpx.Response] = []
        # Greedy: the tiny model never samples its EOS then, so the batch runs all 4000 tokens (~15 s on a quiet
        # machine). Sampled, every row hit EOS within a second about two runs in three.
        body = {"prompts": ["Once"] * 8, "max_tokens": 4000, "temperature": 0}
        caller = threading.Thread(target=lambda: answers.append(httpx.post(f"{url}/generate", json=body, timeout=300)))
        caller.start()
        time.sleep(2.0)
        assert not answers  # still generating
        proc.send_signal(signal.SIGTERM)
        # Well inside the launcher's 30 s before it kills an app (the tiny model's batch would take minutes).
        assert proc.wait(timeout=25) == 0
        caller.join(10)
        assert answers[0].status_code == 503 and "closed while generating" in answers[0].json()["detail"]
        log.seek(0)
        assert "Traceback" not in log.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        log.close()

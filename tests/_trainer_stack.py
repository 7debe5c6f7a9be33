"""What the trainer tests share: polling, the tiny model, and trainer flags for fast GRPO steps (the
servers themselves start with `tests._env_server.running_server`, as `python app.py ROLE`)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path


def wait_until(predicate, timeout_s: float, what: str, interval: float = 0.2):
    """Poll `predicate()` until it returns something truthy (returned); AssertionError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval)


def tiny_model(folder: str) -> str:
    """The tiny random Qwen3 of the tests (seconds, no download)."""
    from models import build_tiny_qwen3

    return build_tiny_qwen3(folder, seed=0)


#: Trainer flags that make a GRPO step take about a second with the tiny model. Two tokens per reply,
#: written by the model from the start (no reply prefix): a random model then sometimes answers one word
#: (an invalid guess, -0.15) and sometimes more (no guess, -0.2), so within most of the 4 groups per step
#: the rewards differ and GRPO's advantages, hence the updates, are not zero. (Opened with "<guess>", a
#: random model's two tokens are nearly always one invalid guess: equal rewards, no update to check.)
FAST_TRAINING = ("--games-per-step", "8", "--num-generations", "2", "--max-tokens", "2", "--max-turns", "2",
                 "--learning-rate", "1e-3", "--reply-prefix", "")

#: Trainer flags for the tiny model at a cadence like the demo's (a step every ~20-40 s on 2 cores, as SmolLM2's on
#: the Spaces): whole games of long replies, so the servers' games, not the trainer, set the pace. What a fleet asks of
#: a Hub account is measured at it (bench/hub_requests.py).
DEMO_PACE = ("--games-per-step", "16", "--num-generations", "4", "--max-tokens", "48", "--max-turns", "6",
             "--learning-rate", "1e-3", "--reply-prefix", "")


@contextlib.contextmanager
def torchrun_trainer(*flags: str, log: Path, env: dict[str, str] | None = None) -> Iterator[tuple[str, subprocess.Popen]]:
    """`python -m torch.distributed.run --nproc_per_node 2 app.py trainer FLAGS` (one thread a rank, `env` added to
    ours) until rank 0's /health answers: (its URL, the torchrun process); SIGTERM at the end."""
    import httpx

    from tests._env_server import REPO, free_port

    port = free_port()
    with open(log, "w+") as out:
        proc = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                                 "--master_addr", "127.0.0.1", "--master_port", str(free_port()), "app.py", "trainer",
                                 *flags, "--host", "127.0.0.1", "--port", str(port)],
                                cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}, stdout=out,
                                stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            def healthy() -> bool:
                assert proc.poll() is None, f"torchrun exited {proc.returncode}:\n{log.read_text()[-4000:]}"
                with contextlib.suppress(httpx.TransportError):
                    return httpx.get(f"{url}/health", timeout=1).status_code == 200
                return False

            wait_until(healthy, 300, "rank 0's API")
            yield url, proc
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()

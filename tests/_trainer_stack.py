"""Real role processes for the trainer tests: env, rollout and trainer servers on loopback ports.

Each role starts through its `<pkg>.launch.add_arguments/run` entry point, exactly what
`python app.py ROLE` calls, in its own Python process.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import httpx

from tests._env_server import REPO, free_port

_RUNNER = ("import argparse, importlib, sys; m = importlib.import_module(sys.argv[1] + '.launch'); "
           "p = argparse.ArgumentParser(); m.add_arguments(p); m.run(p.parse_args(sys.argv[2:]))")


@contextlib.contextmanager
def role(package: str, *args: str, timeout_s: float = 120.0, env: dict[str, str] | None = None) -> Iterator[str]:
    """Run the role in `package` (`env_space`, `rollout_space`, `trainer_space`) until `/health` answers;
    yield its URL; terminate it on exit (its log is printed if it dies early or never gets ready)."""
    port = free_port()
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen([sys.executable, "-c", _RUNNER, package, *args, "--host", "127.0.0.1",
                                 "--port", str(port)], cwd=REPO, env={**os.environ, **(env or {})},
                                stdout=log, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + timeout_s
            while True:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log.seek(0)
                    raise RuntimeError(f"{package} on {url} did not get ready (exit {proc.returncode}):\n{log.read()}")
                with contextlib.suppress(httpx.TransportError):
                    if httpx.get(f"{url}/health", timeout=1.0).status_code == 200:
                        break
                time.sleep(0.2)
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
                print(f"{package} exited {proc.returncode}:\n{log.read()[-5000:]}", file=sys.stderr)


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


#: Trainer flags that make a GRPO step take about a second with the tiny model. Two tokens per reply:
#: a random model then sometimes answers one word (an invalid guess, -0.15) and sometimes more (no
#: guess, -0.2), so within most of the 4 groups per step the rewards differ and GRPO's advantages, hence
#: the updates, are not zero.
FAST_TRAINING = ("--games-per-step", "8", "--num-generations", "2", "--max-tokens", "2", "--max-turns", "2",
                 "--learning-rate", "1e-3")

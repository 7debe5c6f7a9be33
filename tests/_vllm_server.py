"""The package installed as a user's `pip install` would, for a real `vllm serve` (bench/_vllm_serve.py) that
finds the `delta` backend through the package's `vllm.general_plugins` entry point and nothing else; and a stock
`vllm serve --enable-lora` with runtime LoRA updates, no `delta` anywhere in it (`LoraVLLMServer`)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

from bench._vllm_serve import REPO, VLLMServer, free_port
from delta.integrations.vllm_http import VLLMHTTPClient

__all__ = ["LoraVLLMServer", "VLLMServer", "install_package"]


class LoraVLLMServer(VLLMServer):
    """`VLLM_ALLOW_RUNTIME_LORA_UPDATING=1 python -m vllm.entrypoints.openai.api_server --model MODEL --enable-lora
    --max-lora-rank R` on loopback, float32, eager, run from outside this checkout (stock vLLM only)."""

    def __init__(self, model: str, log: Path, max_lora_rank: int = 8, max_model_len: int = 256) -> None:
        self.model = model
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env.update(VLLM_ALLOW_RUNTIME_LORA_UPDATING="1", VLLM_NO_USAGE_STATS="1", HF_HUB_OFFLINE="1",
                   VLLM_WORKER_MULTIPROC_METHOD="spawn")
        args = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model, "--host", "127.0.0.1",
                "--port", str(self.port), "--served-model-name", "tiny", "--dtype", "float32", "--max-model-len",
                str(max_model_len), "--kv-cache-memory-bytes", str(64 << 20), "--enforce-eager", "--enable-lora",
                "--max-lora-rank", str(max_lora_rank)]
        self._log = open(log, "wb")
        self.process = subprocess.Popen(args, cwd=log.parent, env=env, stdout=self._log, stderr=subprocess.STDOUT)
        self.client = VLLMHTTPClient(self.url, timeout=120)

    def models(self) -> list[str]:
        """The model names the server serves (the base's and each adapter loaded)."""
        with urllib.request.urlopen(self.url + "/v1/models", timeout=60) as response:
            return sorted(m["id"] for m in json.loads(response.read())["data"])

    def prompt_logprobs(self, model: str, ids: list[int]) -> list[float]:
        """Log-probability of each token of `ids` after the ones before it, served as `model` (an adapter's name)."""
        body = json.dumps({"model": model, "prompt": ids, "max_tokens": 1, "temperature": 0, "echo": True,
                           "logprobs": 0}).encode()
        request = urllib.request.Request(self.url + "/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=120) as response:
            scores = json.loads(response.read())["choices"][0]["logprobs"]["token_logprobs"]
        return scores[1:len(ids)]


def install_package(target: Path) -> Path:
    """Install this checkout's `delta` package (code + metadata with its entry points) into `target`."""
    src = target.parent / "delta-src"
    for package in ("delta", "delta_vllm_plugin"):
        shutil.copytree(REPO / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", src)
    (src / "docs").mkdir()
    shutil.copy(REPO / "docs" / "delta.md", src / "docs")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                    "--target", str(target), str(src)], check=True, capture_output=True)
    return target

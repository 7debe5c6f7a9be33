"""Weights only from the trainer, for `python -m delta follow` (adapter versions, a stock LoRA server): a stranger with
write access to the bucket publishes a well-formed next version with `delta.Publisher`, and another by copying the
trainer's signature onto it; each is refused in one line and counted, the trainer's last version stays loaded, and
its next version loads bit for bit. A rollout server's refusals, and the key handed over, are
tests/test_product_fleet.py's; the `Subscriber`'s, tests/test_trust.py's.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import torch
from safetensors.torch import load_file

import delta
from tests._env_server import serving
from tests._stranger import copy_signature, publish_as_stranger
from tests._trainer_stack import wait_until
from wire.fleet import RunState
from fleet.bucket import FleetBucket


def _status(url: str) -> dict:
    return httpx.get(f"{url}/status", timeout=10).json()


def _write_run(bucket: str, run_id: str, model: str, signer: delta.SigningKey | None = None) -> None:
    """The run's settings as a trainer writes them (paused: nothing is played), signed with `signer` (None: the
    bucket's trainer key)."""
    from trainer_space import TrainerConfig
    from trainer_space.fleet import FleetRun

    FleetRun(TrainerConfig(bucket, None, model), FleetBucket(bucket, writer=True, signing_key=signer),
             run_id=run_id).send(RunState.PAUSED, 0)


def _edit_run(bucket: str, run_id: str) -> None:
    """The trainer's run.json with another run id in its body, its hash made right, its signature kept."""
    storage = delta.Bucket.open(bucket).storage
    envelope = json.loads(storage.read("fleet/run.json"))
    envelope["body"]["run_id"] = run_id
    raw = json.dumps(envelope["body"], sort_keys=True, separators=(",", ":")).encode()
    envelope["sha256"] = hashlib.sha256(raw).hexdigest()
    storage.write("fleet/run.json", json.dumps(envelope).encode())


class _RecordingLoraServer:
    """A stock LoRA server's routes (no vLLM): each adapter loaded is recorded with its tensors."""

    def __init__(self) -> None:
        from fastapi import FastAPI

        self.loaded: dict[str, dict[str, torch.Tensor]] = {}
        app = self.app = FastAPI()
        app.get("/health")(lambda: {})
        app.get("/v1/models")(lambda: {"data": [{"id": "tiny", "root": "tiny", "parent": None}]})

        @app.post("/v1/load_lora_adapter")
        def load(body: dict) -> str:
            self.loaded[body["lora_name"]] = load_file(str(Path(body["lora_path"]) / "adapter_model.safetensors"))
            return "loaded"

        app.post("/v1/unload_lora_adapter")(lambda body: "unloaded")


def _adapter(value: float) -> dict[str, torch.Tensor]:
    return {f"base_model.model.model.layers.0.self_attn.q_proj.lora_{m}.weight": torch.full(shape, value)
            for m, shape in (("A", (4, 8)), ("B", (8, 4)))}


def test_delta_follow_refuses_a_strangers_versions_and_loads_the_trainers_next(tmp_path: Path) -> None:
    """`python -m delta follow` (adapter versions, a stock LoRA server): trust on first use, the stranger's versions
    refused in one line and counted in the status file, the trainer's next version loaded bit for bit."""
    bucket, status_file, server = str(tmp_path / "bucket"), tmp_path / "status.json", _RecordingLoraServer()
    trainer = delta.Publisher(bucket)
    for value in (1.0, 2.0):
        trainer.publish(_adapter(value))
        assert trainer.flush(60)
    trainers = delta.read_manifest(bucket).latest

    def status() -> dict:
        return json.loads(status_file.read_text()) if status_file.exists() else {}

    with serving(server.app) as url:
        follow = subprocess.Popen(
            [sys.executable, "-m", "delta", "follow", "--bucket", bucket, "--vllm-url", url, "--lora-alpha", "8",
             "--keep", "3", "--status-file", str(status_file), "--poll-interval", "0.1", "--until", "3"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            wait_until(lambda: status().get("version") == 2, 120, "the trainer's version 2")
            assert publish_as_stranger(bucket, tmp_path / "stranger") == 3
            wait_until(lambda: status().get("refused", {}).get("untrusted version") == 1, 60, "the stranger's version")
            copy_signature(bucket, trainers)
            wait_until(lambda: status().get("refused", {}).get("untrusted version") == 2, 60, "the copied signature")
            time.sleep(0.5)  # polled again: still counted once each
            held = status()
            assert (held["version"], held["failures"], held["refused"]) == (2, 0, {"untrusted version": 2})
            assert held["authenticated"] and "trusted on first use" in held["trust"]
            assert held["last_error"].startswith("version 3: the signature does not match")
            trainer.publish(_adapter(3.0))
            assert trainer.flush(60)
            out, _ = follow.communicate(timeout=120)
        finally:
            if follow.poll() is None:
                follow.kill()
    trainer.close()
    assert follow.returncode == 0, out
    refused = [line for line in out.splitlines() if line.startswith("REFUSED version 3")]
    assert len(refused) == 2 and "Traceback" not in out  # one line each (beside the library's log line)
    assert sorted(server.loaded) == ["adapter-v1", "adapter-v2", "adapter-v3"]
    expected = _adapter(3.0)
    assert all(torch.equal(server.loaded["adapter-v3"][n].view(torch.int32), t.view(torch.int32))
               for n, t in expected.items())

"""Weights and run settings only from the trainer, for every reader of the product: a rollout server process and
`python -m delta follow` (the `Subscriber`: tests/test_trust.py).

A stranger with write access to the bucket (another process, its own home) publishes a well-formed next version with
`delta.Publisher`, and another by copying the trainer's signature onto it; then run settings of its own, and the
trainer's settings edited under the trainer's signature. Each reader refuses every one in one line, keeps the
trainer's last version (and settings), counts and shows the refusals (`/status`, the page's text, the status file),
then takes the trainer's next version bit for bit, and its next settings.
"""

from __future__ import annotations

import contextlib
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
from rollout_space.ui import status_markdown
from tests._engines import build_model, step
from tests._env_server import running_app, running_server, serving
from tests._stranger import copy_signature, publish_as_stranger
from tests._trainer_stack import wait_until
from wire.fleet import RunState
from wire.fleet_bucket import FleetBucket
from wire.rollout import RolloutStatus


def _status(url: str) -> dict:
    return httpx.get(f"{url}/status", timeout=10).json()


def _write_run(bucket: str, run_id: str, model: str, signer: delta.SigningKey | None = None) -> None:
    """The run's settings as a trainer writes them (paused: nothing is played), signed with `signer` (None: the
    bucket's trainer key)."""
    from trainer_space import TrainerConfig
    from trainer_space.fleet import FleetRun

    FleetRun(TrainerConfig(bucket, None, model), FleetBucket(bucket, signer=signer),
             run_id=run_id).send(RunState.PAUSED, 0)


def _edit_run(bucket: str, run_id: str) -> None:
    """The trainer's run.json with another run id in its body, its hash made right, its signature kept."""
    storage = delta.open_storage(bucket)
    envelope = json.loads(storage.read("fleet/run.json"))
    envelope["body"]["run_id"] = run_id
    raw = json.dumps(envelope["body"], sort_keys=True, separators=(",", ":")).encode()
    envelope["sha256"] = hashlib.sha256(raw).hexdigest()
    storage.write("fleet/run.json", json.dumps(envelope).encode())


def test_a_rollout_server_refuses_a_strangers_versions_and_settings_and_takes_the_trainers_next(tmp_path: Path) -> None:
    model, bucket = build_model(str(tmp_path / "model"), seed=1), str(tmp_path / "bucket")
    v0 = delta.load_state(model)
    names = sorted(v0)
    states = [v0, step(v0, names[0::2], seed=1), step(v0, names[1::2], seed=2), step(v0, names[0::3], seed=3)]
    trainer = delta.Publisher(bucket)
    for s in states[:2]:
        trainer.publish(s)
        assert trainer.flush(60)
    _write_run(bucket, "trainer-run-1", model)
    with contextlib.ExitStack() as stack:
        env = stack.enter_context(running_server("env"))
        server = stack.enter_context(running_app(
            "rollout", "--bucket", bucket, "--model", model, "--env-url", env, "--engine", "transformers",
            "--poll-interval", "0.1", "--showcase-every", "0", "--server-id", "r1",
            env={"DELTA_TRUSTED_KEY": trainer.public_key.text}, log=tmp_path / "rollout.log"))
        url = server.url
        wait_until(lambda: _status(url)["version"] == 2 and _status(url)["fleet_run"] == "trainer-run-1", 120,
                   "the trainer's version 2 and run")
        trainers = delta.read_manifest(delta.open_storage(bucket)).latest

        assert publish_as_stranger(bucket, tmp_path / "stranger") == 3
        wait_until(lambda: _status(url)["refused"].get("untrusted version") == 1, 60, "the stranger's version refused")
        copy_signature(bucket, trainers)
        wait_until(lambda: _status(url)["refused"].get("untrusted version") == 2, 60, "the copied signature refused")
        _write_run(bucket, "stranger-run", model, signer=delta.SigningKey.generate())
        wait_until(lambda: _status(url)["refused"].get("untrusted run settings") == 1, 60, "the stranger's settings")
        _write_run(bucket, "trainer-run-1", model)
        _edit_run(bucket, "edited-run")
        wait_until(lambda: _status(url)["refused"].get("untrusted run settings") == 2, 60, "the edited settings")

        status = _status(url)
        assert (status["version"], status["fleet_run"], status["failures"]) == (2, "trainer-run-1", 0)
        assert status["state_hash"] == trainers.state_hash and status["authenticated"]
        assert status["trust"] == f"trainer key {trainer.public_key.fingerprint} (given)"
        assert status["last_refusal"].startswith("version 3: the signature does not match")
        page = status_markdown(RolloutStatus.model_validate(status))
        assert "refused: untrusted run settings 2 · untrusted version 2" in page
        assert "**last refused:** version 3: the signature does not match" in page
        assert f"checked with the trainer key {trainer.public_key.fingerprint} (given)" in page
        log = server.output()
        assert log.count("REFUSED version 3") == 2 and log.count("REFUSED the run's settings") == 2
        assert "Traceback" not in log

        trainer.publish(states[2])  # the trainer's next version, from its own manifest
        assert trainer.flush(60)
        _write_run(bucket, "trainer-run-2", model)
        wait_until(lambda: _status(url)["version"] == 3 and _status(url)["fleet_run"] == "trainer-run-2", 60,
                   "the trainer's version 3 and next run")
        assert _status(url)["state_hash"] == delta.state_digest(states[2]).hexdigest == trainer.last.state_hash
        trainer.close()
        seed = delta.trainer_key(delta.open_storage(bucket).url).secret_text().split(":", 1)[1]
        assert seed not in server.output()  # no secret in the logs, nor in the bucket
        assert not [f for f in Path(bucket).rglob("*") if f.is_file() and seed.encode() in f.read_bytes()]


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
    trainers = delta.read_manifest(delta.open_storage(bucket)).latest

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

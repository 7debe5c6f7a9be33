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


def test_a_trainer_restarted_with_a_new_key_hands_over_to_it_and_a_server_of_the_old_key_follows(
        tmp_path: Path) -> None:
    """Real processes on one bucket: a trainer app signs with one key, and a rollout server trusts it on first use (a
    cache of its own). The trainer restarted with a new key and the old one to hand over from (a file of its user's)
    resumes its own versions and trains on: the server reads its new run at once and follows its versions, trusting the
    new key (kept). A trainer restarted with a third key and no handover starts a run of its own, which the server
    refuses (counted, shown on its page) while it keeps serving the last version the trainer signed; that trainer's
    fleet table says the server trusts another key."""
    from tests._trainer_stack import FAST_TRAINING, tiny_model
    from trainer_space.ui import fleet_html
    from wire.trainer import TrainerStatus

    model, bucket = tiny_model(str(tmp_path / "model")), str(tmp_path / "bucket")
    old, new, third = delta.SigningKey.generate(), delta.SigningKey.generate(), delta.SigningKey.generate()
    old_file = tmp_path / "trainer-home" / "old.key"
    old_file.parent.mkdir()
    old_file.write_text(old.secret_text())
    old_file.chmod(0o600)
    shared = ("--bucket", bucket, "--model", model)
    trainer_flags = (*shared, "--max-steps", "2", "--exam-every", "0", *FAST_TRAINING)

    def trained(url: str, steps: int) -> dict:
        return wait_until(lambda: (s := _status(url))["state"] == "stopped" and s["step"] == steps and s, 300,
                          f"the trainer's step {steps}")

    with contextlib.ExitStack() as stack:
        env = stack.enter_context(running_server("env"))
        server = stack.enter_context(running_app(
            "rollout", *shared, "--env-url", env, "--engine", "transformers", "--poll-interval", "0.2",
            "--showcase-every", "0", "--server-id", "r1", env={"XDG_CACHE_HOME": str(tmp_path / "server-cache")},
            log=tmp_path / "rollout.log", timeout_s=300))
        r = server.url
        with running_app("trainer", *shared, "--env-url", env, *trainer_flags[2:], log=tmp_path / "trainer-1.log",
                         env={"DELTA_SIGNING_KEY": old.secret_text()}, timeout_s=300) as first:
            before = trained(first.url, 2)
        wait_until(lambda: _status(r)["version"] == before["version"], 120, "the server at the first trainer's last")
        assert _status(r)["trust"].startswith(f"trainer key {old.public.fingerprint} (trusted on first use")

        with running_app("trainer", *shared, "--env-url", env, *trainer_flags[2:], "--handover-from-file",
                         str(old_file), log=tmp_path / "trainer-2.log", env={"DELTA_SIGNING_KEY": new.secret_text()},
                         timeout_s=300) as second:
            after = trained(second.url, 4)
            [row] = after["fleet"]
            log = second.output()
        assert after["resumed_from"] == before["version"] and after["version"] > before["version"]
        assert "signed again with this trainer's new key" in log and old.secret_text()[16:] not in log
        assert (row["id"], row["authenticated"], row["trusts_trainer"]) == ("r1", True, True)
        wait_until(lambda: _status(r)["version"] == after["version"], 120, "the server at the new key's last version")
        status = _status(r)
        assert status["fleet_run"] == after["run_id"] and status["refused"] == {} and status["failures"] == 0
        assert status["trust"].startswith(f"trainer key {new.public.fingerprint} (handed over from "
                                          f"{old.public.fingerprint}")
        assert status["state_hash"] == after["state_hash"]

        with running_app("trainer", *shared, "--env-url", env, *trainer_flags[2:], log=tmp_path / "trainer-3.log",
                         env={"DELTA_SIGNING_KEY": third.secret_text()}, timeout_s=300) as stranger:
            wait_until(lambda: _status(r)["refused"].get("untrusted run settings") == 1, 120, "its settings refused")
            seen = wait_until(lambda: (s := _status(stranger.url))["fleet"] and s["fleet"][0]["trusts_trainer"] is False
                              and s, 120, "the third trainer's fleet table")
            assert seen["resumed_from"] is None  # none of the versions is its own: a run of its own
            page = fleet_html(TrainerStatus.model_validate(seen).fleet)
            assert f"<b>⚠ another key {new.public.fingerprint[:19]}…</b>" in page
            assert "Trusting another key than this trainer&#x27;s: r1." in page
        status = _status(r)
        assert (status["version"], status["fleet_run"]) == (after["version"], after["run_id"])
        assert "refused: untrusted run settings 1" in status_markdown(RolloutStatus.model_validate(status))
        assert "Traceback" not in server.output()

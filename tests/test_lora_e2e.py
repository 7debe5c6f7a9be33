"""LoRA runs end to end: an env and transformers rollout servers as processes, a trainer session training a LoRA
adapter on the tiny Qwen3 and publishing to a local bucket, in both sync modes (`wire.lora`).

The rollout server is started on the empty bucket before the run and learns the mode from the run's settings
(no restart); it ends at the trainer's last version with the trainer's published state hash (merged weights, or
the adapter's tensors), and its logprobs of a fixed prompt equal those of the trainer's own policy (the PEFT
model it trains, unmerged, in float32) within bf16 tolerance. In adapter mode a second trainer session resumes
the adapter from the bucket and the server follows on. A server started with another base model refuses the run
in one line and serves nothing from the bucket. An adapter run reaches a rollout on the vLLM engine too, as vLLM's
LoRA requests.
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

import delta
from delta import read_manifest
from tests._engines import build_model, needs_vllm
from tests._env_server import running_app, running_server
from tests._trainer_stack import tiny_model, wait_until
from trainer_space import TrainerConfig, TrainingSession, build_session
from fleet.bucket import FleetBucket
from wire.lora import DEFAULT_TARGETS

PROMPT = [5, 17, 99, 250, 3, 42, 7, 300]
ROLLOUT_FLAGS = ("--engine", "transformers", "--poll-interval", "0.2", "--showcase-every", "0")
#: Most difference of a logprob between the rollout and the trainer's float32 policy: merged, the rollout computes
#: in float32 on the merged weights rounded to bf16; adapter, on the same float32 base and adapter, only the order
#: of operations differs. Measured on the tiny model: 4e-4 (merged) and 5e-7 (adapter), the policy moving 0.2-0.3 from
#: the base.
TOLERANCE = {"merged": 0.01, "adapter": 1e-4}


def rollout_status(url: str) -> dict:
    return httpx.get(f"{url}/status", timeout=10).json()


def greedy(url: str) -> tuple[int, list[int], list[float]]:
    body = httpx.post(f"{url}/generate", json={"prompts": [PROMPT], "max_tokens": 6, "temperature": 0},
                      timeout=60).json()
    [c] = body["completions"]
    return body["version"], c["token_ids"], c["logprobs"]


@torch.no_grad()
def policy_logprobs(model: torch.nn.Module, completion: list[int]) -> list[float]:
    """Logprobs of `completion` after PROMPT under `model` (the trainer's policy, as it computes them)."""
    ids = torch.tensor([PROMPT + completion])
    logits = model(input_ids=ids).logits.float()[0, len(PROMPT) - 1:-1]
    return logits.log_softmax(-1).gather(-1, torch.tensor(completion).unsqueeze(-1)).squeeze(-1).tolist()


def train(session: TrainingSession, version: int) -> Any:
    """Start `session` and wait until its run stopped with `version` (at least) committed; its final status."""
    session.start()

    def finished() -> Any:
        s = session.status()
        assert s.error is None, s.error
        return s if s.state == "stopped" and s.version == s.trainer_version and s.version >= version else None

    return wait_until(finished, 300, f"LoRA steps up to version {version}")


@pytest.mark.parametrize("sync", ["merged", "adapter"])
def test_a_lora_run_reaches_the_rollout_in_either_mode(tmp_path: Path, sync: str) -> None:
    model, bucket = tiny_model(str(tmp_path / "model")), str(tmp_path / "bucket")
    with contextlib.ExitStack() as stack:
        env = stack.enter_context(running_server("env"))
        rollout = stack.enter_context(running_app("rollout", "--bucket", bucket, "--model", model, "--env-url", env,
                                                  "--server-id", "a", *ROLLOUT_FLAGS, log=tmp_path / "a.log"))
        base_version, base_tokens, base_logprobs = greedy(rollout.url)
        assert base_version == 0
        stranger = None
        if sync == "adapter":  # a server on another base model, on the same bucket
            from models import build_tiny_qwen3

            other = build_tiny_qwen3(str(tmp_path / "other"), seed=1)
            stranger = stack.enter_context(running_app("rollout", "--bucket", bucket, "--model", other, "--env-url",
                                                       env, "--server-id", "b", *ROLLOUT_FLAGS,
                                                       log=tmp_path / "b.log"))
        config = TrainerConfig(bucket, None, model, games_per_step=8, num_generations=2, max_tokens=2, max_turns=2,
                               learning_rate=3e-2, reply_prefix="", max_steps=3, exam_every=0, lora_r=4,
                               lora_sync=sync)
        session = build_session(config)
        stack.callback(session.close)
        status = train(session, 3)
        # the run's settings name the mode, the adapter and the base
        run = FleetBucket(bucket).read_run()
        assert run.lora is not None and run.lora.sync == sync and run.lora.r == 4 and run.lora.alpha == 8.0
        assert run.lora.targets == DEFAULT_TARGETS
        assert run.lora.base_hash == delta.state_digest(delta.load_state(model)).hexdigest
        # what the bucket holds: the merged weights under the checkpoint's names, or the adapter alone
        manifest = read_manifest(bucket)
        assert manifest.latest.version == status.version and manifest.latest.state_hash == status.state_hash
        stored = delta.Subscriber(bucket)
        try:
            stored.sync()
            state = stored.state
        finally:
            stored.close()
        if sync == "merged":
            assert set(state) == set(delta.load_state(model)) and {t.dtype for t in state.values()} == {torch.bfloat16}
        else:
            assert state and all(".lora_A." in n or ".lora_B." in n for n in state)
            assert {t.dtype for t in state.values()} == {torch.float32}
            assert any(t.abs().max() > 0 for n, t in state.items() if ".lora_B." in n)  # the adapter trained

        # the rollout follows: the trainer's last version, with its hash
        s = wait_until(lambda: (r := rollout_status(rollout.url))["version"] == status.version and r, 60,
                       "the rollout to serve the last version")
        assert s["state_hash"] == status.state_hash and s["last_error"] is None
        assert s["lora"] == run.lora.model_dump(mode="json") and status.lora == run.lora  # what the pages show
        adapter_size = sum(p.numel() for n, p in session.parts.model.named_parameters() if ".lora_" in n)
        assert status.trainable == adapter_size > 0 and status.parameters > adapter_size
        version, tokens, logprobs = greedy(rollout.url)
        assert version == status.version
        policy = session.parts.model
        assert type(policy).__name__.startswith("PeftModel")
        policy.eval()
        error = max(abs(a - b) for a, b in zip(logprobs, policy_logprobs(policy, tokens)))
        assert error < TOLERANCE[sync], error
        # the policy moved away from the base by more than the rollout differs from it: the test tells them apart
        moved = max(abs(a - b) for a, b in zip(policy_logprobs(policy, base_tokens), base_logprobs))
        assert moved > max(4 * error, 1e-3), (moved, error)

        if sync == "adapter":  # a second trainer process resumes the adapter; the server follows on, no restart
            session.close()
            again = build_session(config)
            stack.callback(again.close)
            resumed = train(again, 5)
            assert (resumed.resumed_from, resumed.resumed_hash) == (status.version, status.state_hash)
            s = wait_until(lambda: (r := rollout_status(rollout.url))["version"] == resumed.version and r, 60,
                           "the rollout to serve the resumed run's last version")
            assert s["state_hash"] == resumed.state_hash and s["last_error"] is None
            version, tokens, logprobs = greedy(rollout.url)
            policy = again.parts.model.eval()
            assert version == resumed.version
            assert max(abs(a - b) for a, b in zip(logprobs, policy_logprobs(policy, tokens))) < TOLERANCE[sync]

        if stranger is not None:  # another base: refused in one line, nothing from the bucket served
            refusal = r"this server's model hashes to sum128:[0-9a-f]+: start it with the run's base model"
            wait_until(lambda: re.search(refusal, stranger.output()), 30, "the other base's refusal")
            other_status = rollout_status(stranger.url)
            assert other_status["version"] == 0 and other_status["fleet_state"] == "error"
            assert other_status["groups_written"] == 0 and re.search(refusal, other_status["last_error"])


@needs_vllm
def test_an_adapter_run_reaches_a_vllm_rollout_as_lora_requests(tmp_path: Path) -> None:
    """The same run in adapter mode, followed by a rollout process on the vLLM engine with LoRA on (`--max-lora-rank`):
    the trainer's published hash and its policy's logprobs at the last version, games played for the run."""
    model, bucket = build_model(str(tmp_path / "model")), str(tmp_path / "bucket")  # heads vLLM's CPU kernels run
    flags = ("--engine", "vllm", "--max-lora-rank", "8", "--dtype", "float32", "--max-model-len", "2048",
             "--poll-interval", "0.2", "--showcase-every", "0")
    with contextlib.ExitStack() as stack:
        env = stack.enter_context(running_server("env"))
        rollout = stack.enter_context(running_app("rollout", "--bucket", bucket, "--model", model, "--env-url", env,
                                                  "--server-id", "v", *flags, log=tmp_path / "v.log"))
        config = TrainerConfig(bucket, None, model, games_per_step=8, num_generations=2, max_tokens=2, max_turns=2,
                               learning_rate=3e-2, reply_prefix="", max_steps=3, exam_every=0, lora_r=4,
                               lora_sync="adapter")
        session = build_session(config)
        stack.callback(session.close)
        status = train(session, 3)
        s = wait_until(lambda: (r := rollout_status(rollout.url))["version"] == status.version and r, 120,
                       "the vLLM rollout to serve the last adapter version")
        assert s["engine"] == "vllm" and s["state_hash"] == status.state_hash and s["last_error"] is None
        assert s["groups_written"] > 0 and s["refused"] == {}
        version, tokens, logprobs = greedy(rollout.url)
        policy = session.parts.model.eval()
        assert version == status.version
        assert max(abs(a - b) for a, b in zip(logprobs, policy_logprobs(policy, tokens))) < TOLERANCE["adapter"]

"""End to end: env, rollout and trainer as separate processes on one local bucket.

The trainer runs a few GRPO steps and publishes a version after each; the rollout follows; its
weights are then bit-identical to what the trainer published (greedy logprobs of the rollout
process equal those of an engine loaded here with the bucket's state, and differ from the initial
model's). A second trainer process on the same bucket resumes: its weights hash to the bucket's
latest state and the numbering continues.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import torch

from delta import read_manifest
import delta
from rollout_space.engines import EngineConfig, SamplingParams, open_engine
from tests._env_server import running_server
from tests._trainer_stack import FAST_TRAINING, tiny_model, wait_until
from wire.trainer import Payload, Staleness, StepRecord

PROMPT = [5, 17, 99, 250, 3, 42, 7, 300]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    root = tmp_path_factory.mktemp("stack")
    model, bucket = tiny_model(str(root / "model")), str(root / "bucket")
    with running_server("env") as env, running_server("rollout", "--bucket", bucket, "--model", model, "--env-url", env,
                                             "--engine", "transformers", "--poll-interval", "0.2",
                                             "--showcase-every", "0") as rollout:
        yield {"model": model, "bucket": bucket, "env": env, "rollout": rollout}


def train(stack: dict[str, str], steps: int) -> dict:
    """Run a trainer process for `steps` steps; return its final status (after the last commit) with its
    `/history` under "history"; its UI page must load."""
    with running_server("trainer", "--bucket", stack["bucket"], "--model", stack["model"], "--rollout-url",
              stack["rollout"], "--env-url", stack["env"], "--max-steps", str(steps), *FAST_TRAINING) as url:
        def finished() -> dict | None:
            s = httpx.get(f"{url}/status").json()
            assert s["error"] is None, s["error"]
            return s if s["state"] == "stopped" and s["version"] == s["trainer_version"] else None

        status = wait_until(finished, 240, f"{steps} steps")

        def measured() -> dict | None:  # the payload log measures each commit within its poll interval
            history = httpx.get(f"{url}/history").json()
            done = history["payloads"] and history["payloads"][-1]["version"] == status["version"]
            return history if done else None

        status["history"] = wait_until(measured, 15, "the payload log to measure the last version")
        # a trained session's answers hold exactly their messages' keys (the typed-message tests see them empty)
        assert set(status["staleness"]) == set(Staleness.model_fields)
        assert set(status["history"]["steps"][-1]) == set(StepRecord.model_fields)
        assert set(status["history"]["payloads"][-1]) == set(Payload.model_fields)
        assert httpx.get(f"{url}/").status_code == 200
        return status


def greedy_logprobs(rollout: str) -> tuple[int, list[int], list[float]]:
    body = httpx.post(f"{rollout}/generate", json={"prompts": [PROMPT], "max_tokens": 6, "temperature": 0},
                      timeout=60).json()
    [c] = body["completions"]
    return body["version"], c["token_ids"], c["logprobs"]


def local_logprobs(model: str, state: dict[str, torch.Tensor] | None) -> tuple[list[int], list[float]]:
    """The same greedy completion from an engine in this process, on `state` (None: the model as built)."""
    engine = open_engine("transformers", EngineConfig(model))
    try:
        if state is not None:
            engine.update(state, version=1)
        [c] = engine.generate([PROMPT], SamplingParams(max_tokens=6, temperature=0))
        return c.token_ids, c.logprobs
    finally:
        engine.close()


def bucket_state(bucket: str, version: int) -> dict[str, torch.Tensor]:
    with delta.Subscriber(bucket) as sub:
        assert sub.sync(version) == version
        return {k: v.clone() for k, v in sub.state.items()}


def test_trainer_publishes_rollout_follows_bit_for_bit_and_resume_continues(stack: dict[str, str]) -> None:
    first = train(stack, 3)
    assert (first["version"], first["step"], first["resumed_from"]) == (3, 3, None)
    assert first["device"] == "cpu" and httpx.get(f"{stack['rollout']}/status").json()["device"] == "cpu"
    manifest = read_manifest(delta.open_storage(stack["bucket"]))
    assert [v.version for v in manifest.versions] == [1, 2, 3]
    assert manifest.latest.state_hash == first["state_hash"]
    assert first["staleness"]["games"] == 3 * 8
    assert [s["version"] for s in first["history"]["steps"]] == [1, 2, 3]
    assert all(0 <= s["valid_rate"] <= 1 and 0 <= s["win_rate"] <= 1 for s in first["history"]["steps"])  # TRL logged them
    payloads = first["history"]["payloads"]
    assert [p["version"] for p in payloads] == [2, 3]  # version 1 is an anchor
    assert all(0 < p["delta_bytes"] < p["raw_bytes"] for p in payloads if p["changed"])

    # The rollout serves version 3, and its weights are the bucket's version 3 bit for bit.
    wait_until(lambda: httpx.get(f"{stack['rollout']}/status").json()["version"] == 3, 30, "the rollout at v3")
    state = bucket_state(stack["bucket"], 3)
    assert delta.state_digest(state).hexdigest == first["state_hash"]
    initial = delta.load_state(stack["model"])
    changed = sum(int((state[k].view(torch.int16) != initial[k].view(torch.int16)).sum()) for k in state)
    assert changed > 0, "three GRPO steps changed no weight: the test would prove nothing"
    version, tokens, logprobs = greedy_logprobs(stack["rollout"])
    assert version == 3
    assert (tokens, logprobs) == local_logprobs(stack["model"], state)
    assert logprobs != local_logprobs(stack["model"], None)[1], "the check cannot tell the initial model apart"

    # A new trainer process resumes from the bucket: same weights, numbering continues, for versions and (from the
    # history kept in the bucket) for steps, the first process's records shown before its own.
    second = train(stack, 2)
    assert (second["resumed_from"], second["resumed_hash"]) == (3, first["state_hash"])
    assert (second["version"], second["step"]) == (5, 5)
    assert second["history"]["steps"][:3] == first["history"]["steps"]
    assert [(s["step"], s["version"]) for s in second["history"]["steps"]] == [(1, 1), (2, 2), (3, 3), (4, 4), (5, 5)]
    assert second["history"]["payloads"][:2] == payloads and second["history"]["anchors"][0]["version"] == 1
    manifest = read_manifest(delta.open_storage(stack["bucket"]))
    assert [v.version for v in manifest.versions] == [1, 2, 3, 4, 5]
    assert manifest.get(4).kind == "delta" and manifest.get(4).base_hash == first["state_hash"]
    wait_until(lambda: httpx.get(f"{stack['rollout']}/status").json()["version"] == 5, 30, "the rollout at v5")
    assert greedy_logprobs(stack["rollout"])[2] == local_logprobs(stack["model"], bucket_state(stack["bucket"], 5))[1]

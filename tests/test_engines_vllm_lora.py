"""The vLLM engine serves a LoRA run's adapter versions with vLLM's own LoRA machinery (one `LoRARequest` per
version), following the bucket through the follower: the state it serves hashes as the trainer published it, its
logprobs are PEFT's, a group held across a publish stays on its version, and bad runs and adapters are refused
with the served version unchanged.

One engine (LoRA up to rank 8, float32) serves the whole module: vLLM takes ~15-30 s to start here."""

from __future__ import annotations

import pytest
import torch

import delta
from delta import read_manifest
from rollout_space.engines import EngineConfig, SamplingParams, open_engine
from rollout_space.errors import LoraRefusedError
from rollout_space.follower import Follower
from tests._engines import build_model, needs_vllm, step
from tests._lora import logprobs, peft_model, settings

pytestmark = needs_vllm

#: Largest |logprob difference| allowed between vLLM's LoRA and PEFT's (float32 both; measured 3e-6).
ATOL = 5e-5
IDS = [5, 6, 7, 8, 9, 10, 11, 12, 13, 14]
GREEDY = SamplingParams(max_tokens=8, temperature=0)
FAST = delta.SubscriberConfig(poll_interval=0.05)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    """The tiny model's folder and one vLLM engine on it that serves adapters up to rank 8."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("HF_HUB_OFFLINE", "1")  # inherited by vLLM's processes: nothing may reach the Hub
        model = build_model(str(tmp_path_factory.mktemp("tiny")))
        config = EngineConfig(model, dtype="float32", max_model_len=256)
        with open_engine("vllm", config, kv_cache_bytes=64 << 20, max_lora_rank=8) as engine:
            yield model, engine


def _adapters(model: str, seeds: list[int]) -> tuple[list[dict[str, torch.Tensor]], list[torch.nn.Module]]:
    """Adapter states as a trainer would publish them (PEFT's names, float32), one per seed, and their PEFT models."""
    from trainer_space.lora import adapter_tensors

    models = [peft_model(model, settings(model), seed=s) for s in seeds]
    return [{n: t.clone() for n, t in adapter_tensors(m).items()} for m in models], models


def _publish(publisher: delta.Publisher, state: dict[str, torch.Tensor]) -> None:
    publisher.publish(state)
    publisher.flush()


def test_follows_adapter_versions_as_published_and_keeps_a_group_on_its_version(served, tmp_path) -> None:
    model, engine = served
    bucket = str(tmp_path / "bucket")
    lora = settings(model)
    states, peft = _adapters(model, [0, 1, 2])
    [base] = engine.prompt_logprobs([IDS])
    assert engine.adapter_support == "LoRA adapters up to rank 8"
    follower = Follower(engine, bucket, FAST)
    with delta.Publisher(bucket) as publisher:
        _publish(publisher, states[0])
        follower.adopt(lora, keep=2)  # staleness 1: two versions kept
        assert engine.version == 0 and engine.prompt_logprobs([IDS]) == [base]  # no adapter yet: the base
        manifest = delta.Bucket.open(bucket)
        for version, (state, policy) in enumerate(zip(states[:2], peft[:2]), start=1):
            if version > 1:
                _publish(publisher, state)
            assert follower.sync() == version and engine.version == version
            published = read_manifest(manifest).get(version).state_hash
            assert delta.state_digest(engine.state).hexdigest == published == follower.status()["state_hash"]
            [got] = engine.prompt_logprobs([IDS])
            assert (torch.tensor(got) - logprobs(policy, IDS)).abs().max() < ATOL
            assert (torch.tensor(got) - torch.tensor(base)).abs().max() > 1e-2  # the adapter is what moved them
        # A group begun under version 1 goes on under it after version 2 arrived; new groups get version 2.
        assert engine.held_versions == (1, 2)
        [first] = engine.generate([IDS], GREEDY, at=1)
        [newest] = engine.generate([IDS], GREEDY)
        assert first.version == 1 and newest.version == 2 and first.logprobs != newest.logprobs
        _publish(publisher, states[2])
        assert follower.sync() == 3 and engine.held_versions == (2, 3)  # version 1 unloaded (keep 2)
        [again] = engine.generate([IDS], GREEDY, at=1)
        assert again.version == 3  # no longer held: the current version, and the completion says so
    with pytest.raises(LoraRefusedError, match=r"^the run now publishes full weights, but this server serves "
                                               r"version 3 "):
        follower.adopt(None)  # the bucket holds an adapter's versions: never full weights under a server serving one
    assert engine.version == 3
    follower.close()
    engine.serve_adapter(None)  # full weights again: the base, no adapter
    assert engine.version == 0 and engine.held_versions == (0,) and engine.prompt_logprobs([IDS]) == [base]


def test_a_group_held_across_a_publish_is_generated_under_one_version(served, tmp_path) -> None:
    """Games are played turn by turn (`games.play_games` asks each turn for the first turn's version): a version
    loaded between two turns does not reach the rest of the group."""
    model, engine = served
    bucket = str(tmp_path / "bucket")
    states, _ = _adapters(model, [3, 4])
    follower = Follower(engine, bucket, FAST)
    with delta.Publisher(bucket) as publisher:
        _publish(publisher, states[0])
        follower.adopt(settings(model), keep=2)
        follower.sync()
        turns = [engine.generate([IDS], GREEDY)]
        pinned = turns[0][0].version
        _publish(publisher, states[1])
        follower.sync()  # loaded between two turns of the group
        for _ in range(2):
            turns.append(engine.generate([IDS + turns[-1][0].token_ids], GREEDY, at=pinned))
    assert engine.version == pinned + 1 and {t[0].version for t in turns} == {pinned}
    # What vLLM gave the held turns is version `pinned`'s policy, not the new one's.
    assert turns[1][0].logprobs != engine.generate([IDS + turns[0][0].token_ids], GREEDY)[0].logprobs
    follower.close()
    engine.serve_adapter(None)


def test_refusals_leave_the_served_version_and_are_counted(served, tmp_path) -> None:
    model, engine = served
    bucket = str(tmp_path / "bucket")
    lora = settings(model)
    states, _ = _adapters(model, [5])
    follower = Follower(engine, bucket, FAST)
    with delta.Publisher(bucket) as publisher:
        _publish(publisher, states[0])
        with pytest.raises(LoraRefusedError, match=r"^the run's adapter has rank 16, above this vLLM engine's max "
                                                   r"LoRA rank 8: restart it with --max-lora-rank 16$"):
            follower.adopt(settings(model, r=16))
        follower.adopt(lora, keep=2)
        assert follower.sync() == 1
        [served_logprobs] = engine.prompt_logprobs([IDS])
        with pytest.raises(LoraRefusedError, match=r"^the run trains a LoRA adapter on base sum128:0+ "):
            follower.adopt(settings(model, base_hash="sum128:" + "0" * 32))
        assert engine.version == 1 and follower.lora == lora
        # A forged version: written through the publisher (its hashes consistent), its values not finite.
        forged = {n: t.clone() for n, t in states[0].items()}
        next(t for n, t in forged.items() if ".lora_B." in n)[0, 0] = float("nan")
        _publish(publisher, forged)
        follower.sync()
        follower.adopt(lora, keep=2)  # the run read again: nothing new to refuse
        # The next version leaves the forged tensor as it was: still refused, the last good version served.
        _publish(publisher, {n: t if n in forged and t.isnan().any() else t + 1e-3 for n, t in forged.items()})
        follower.sync()
    status = follower.status()
    assert engine.version == 1 and engine.prompt_logprobs([IDS]) == [served_logprobs]
    assert "holds NaN or infinite values (a forged or broken adapter)" in status["last_error"]
    assert status["state_hash"] is None  # the decoded state is not what is served: no hash claimed
    assert status["refused"] == {"rank above max": 1, "another base": 1, "bad adapter": 2}
    follower.close()
    engine.serve_adapter(None)


def test_full_weights_followed_before_an_adapter_run_are_restored_to_the_base(served) -> None:
    """An engine with LoRA on follows full weights as any engine; switching to an adapter puts the folder's base back
    under it (the adapter was trained on that base), then the adapter serves PEFT's policy."""
    model, engine = served
    states, peft = _adapters(model, [6])
    [base] = engine.prompt_logprobs([IDS])
    names = sorted(engine.state)
    engine.update(step(engine.state, names[::2], seed=7, lr=2e-2), version=4)
    [moved] = engine.prompt_logprobs([IDS])
    assert (torch.tensor(moved) - torch.tensor(base)).abs().max() > 1e-2
    engine.serve_adapter(settings(model))
    assert engine.version == 0 and engine.prompt_logprobs([IDS]) == [base]
    engine.update(states[0], version=1)
    [got] = engine.prompt_logprobs([IDS])
    assert (torch.tensor(got) - logprobs(peft[0], IDS)).abs().max() < ATOL
    engine.serve_adapter(None)
    assert engine.prompt_logprobs([IDS]) == [base]

"""The vLLM engine computes what transformers computes from the same published state, after loading and
after every delta; bad updates are refused and the previous version keeps serving.

Both engines compute in float32: they agree to within 6e-6 in logprobs here, while each delta below
moves them by 2e-3 or more, so a stale or half-loaded tensor cannot hide under the tolerance (without
the fused groups or the tied lm_head repack, they differ by 5 and by 2e-2). In bfloat16 their
different kernels round activations apart by up to 8e-2, as much as a delta moves them."""

from __future__ import annotations

import pytest
import torch

import delta
from rollout_space.engines import EngineConfig, SamplingParams, UpdateRefusedError, open_engine
from tests._engines import build_model, follow, needs_vllm, step
from wire.trajectory import VersionSpan

pytestmark = needs_vllm

#: Largest |logprob difference| allowed between vLLM and transformers (float32 both).
ATOL = 5e-5

PROMPTS = ["The quick brown fox jumps over the lazy dog", "Once upon a time there was", [5, 6, 7, 8, 9, 10, 11]]
GREEDY = SamplingParams(max_tokens=16, temperature=0)


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory):
    """One vLLM engine and one transformers engine on the same folder for the whole module (vLLM takes
    ~30 s to start here)."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("HF_HUB_OFFLINE", "1")  # inherited by vLLM's processes: nothing may reach the Hub
        config = EngineConfig(build_model(str(tmp_path_factory.mktemp("tiny"))), dtype="float32", max_model_len=256)
        with open_engine("vllm", config, kv_cache_bytes=64 << 20) as vllm, open_engine("transformers", config) as hf:
            yield vllm, hf


def reports_versions() -> bool:
    """Whether the installed vLLM labels each completion's tokens with weight versions (0.32 does, 0.31 does not)."""
    import vllm.outputs

    return hasattr(vllm.outputs, "WeightVersionSpan")


def assert_same(vllm, hf) -> list[list[float]]:
    """Prompt logprobs within ATOL and identical greedy completions, each token of the version served (as vLLM
    reports it where it does); returns vLLM's logprobs."""
    assert vllm.version == hf.version
    ours, theirs = vllm.prompt_logprobs(PROMPTS), hf.prompt_logprobs(PROMPTS)
    for a, b in zip(ours, theirs):
        assert a == pytest.approx(b, abs=ATOL, rel=0)
    ours_greedy, theirs_greedy = vllm.generate(PROMPTS, GREEDY), hf.generate(PROMPTS, GREEDY)
    assert [c.token_ids for c in ours_greedy] == [c.token_ids for c in theirs_greedy]
    for a, b in zip(ours_greedy, theirs_greedy):
        assert a.version == b.version == vllm.version
        assert a.logprobs == pytest.approx(b.logprobs, abs=ATOL, rel=0)
        assert a.spans == b.spans == [VersionSpan(version=vllm.version, start=0, end=len(a.token_ids))]
        assert (a.versions_reported, b.versions_reported) == (reports_versions(), False)
    return ours


def largest_change(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb))


def test_same_outputs_after_loading_and_after_each_delta(engines) -> None:
    vllm, hf = engines
    names = sorted(vllm.state)
    # Each delta touches what vLLM loads differently: one member of a fused group (q of qkv, up of
    # gate_up), the embedding its tied lm_head repacks, the norms, then everything at once.
    deltas = [
        ([n for n in names if ".0.self_attn.q_proj." in n], 1e-3),
        ([n for n in names if ".1.mlp.up_proj." in n], 1e-3),
        (["model.embed_tokens.weight"], 1e-3),
        ([n for n in names if "norm" in n], 1e-2),  # norms sit at 1.0, where a 1e-3 step is under half a ULP
        (names, 1e-3),
    ]
    served = assert_same(vllm, hf)
    published = {n: t.clone() for n, t in vllm.state.items()}
    for version, (chosen, lr) in enumerate(deltas, start=vllm.version + 1):
        new = step(published, chosen, seed=version, lr=lr)
        data = delta.diff(published, new, version=version, base_version=version - 1)
        changed = follow(vllm, data)
        assert follow(hf, data) == changed and set(changed) <= set(chosen) and changed
        published = new
        assert all(torch.equal(vllm.state[n].view(torch.int16), published[n].view(torch.int16)) for n in names)
        before, served = served, assert_same(vllm, hf)
        assert vllm.version == version and largest_change(before, served) > 40 * ATOL


def test_sampled_logprobs_are_the_raw_distribution(engines) -> None:
    vllm, hf = engines
    completions = vllm.generate(PROMPTS, SamplingParams(max_tokens=8, temperature=0.7, seed=5))
    assert completions == vllm.generate(PROMPTS, SamplingParams(max_tokens=8, temperature=0.7, seed=5))
    scored = hf.prompt_logprobs([c.prompt_ids + c.token_ids for c in completions])
    for c, row in zip(completions, scored):
        assert row[len(c.prompt_ids) - 1:] == pytest.approx(c.logprobs, abs=ATOL, rel=0)


def test_stop_token_ends_both_engines_alike(engines) -> None:
    vllm, hf = engines
    [free] = hf.generate(PROMPTS[:1], GREEDY)
    k = next(i for i, t in enumerate(free.token_ids) if i > 0 and t not in free.token_ids[:i])
    params = SamplingParams(max_tokens=16, temperature=0, stop_token_ids=(free.token_ids[k],))
    [ours], [theirs] = vllm.generate(PROMPTS[:1], params), hf.generate(PROMPTS[:1], params)
    assert ours.token_ids == theirs.token_ids == free.token_ids[:k + 1]
    assert ours.finish_reason == theirs.finish_reason == "stop"


def test_stop_string_ends_both_engines_alike(engines) -> None:
    vllm, hf = engines
    [free] = hf.generate(PROMPTS[:1], GREEDY)
    k = next(i for i in range(1, len(free.token_ids)) if hf.tokenizer.decode(free.token_ids[i:i + 1]).strip()
             and "\ufffd" not in hf.tokenizer.decode(free.token_ids[i:i + 1])
             and hf.tokenizer.decode(free.token_ids[i:i + 1]) not in hf.tokenizer.decode(free.token_ids[:i]))
    params = SamplingParams(max_tokens=16, temperature=0, stop=(hf.tokenizer.decode(free.token_ids[k:k + 1]),))
    [ours], [theirs] = vllm.generate(PROMPTS[:1], params), hf.generate(PROMPTS[:1], params)
    assert ours.token_ids == theirs.token_ids == free.token_ids[:k + 1]
    assert ours.finish_reason == theirs.finish_reason == "stop"


@pytest.mark.parametrize("bad", [
    {"lm_head.bias": torch.zeros(3, dtype=torch.bfloat16)},
    {"model.layers.0.self_attn.k_proj.weight": torch.zeros(32, 64, dtype=torch.bfloat16)},
])
def test_refused_update_keeps_serving_the_previous_version(engines, bad: dict) -> None:
    vllm, _ = engines
    version, before = vllm.version, vllm.prompt_logprobs(PROMPTS)
    embed = torch.zeros_like(vllm.state["model.embed_tokens.weight"])
    with pytest.raises(UpdateRefusedError, match=f"update to version {version + 1} refused, still serving version "
                                                 f"{version}: "):
        vllm.update({"model.embed_tokens.weight": embed, **bad}, version + 1)
    assert vllm.version == version and vllm.prompt_logprobs(PROMPTS) == before
    assert vllm.generate(PROMPTS[:1], GREEDY)[0].version == version


def test_both_engines_follow_a_bucket_through_the_rollout_follower(engines, tmp_path) -> None:
    from delta import SubscriberConfig
    from rollout_space.follower import Follower

    vllm, hf = engines
    bucket = str(tmp_path / "bucket")
    published = {n: t.clone() for n, t in vllm.state.items()}
    names = sorted(published)
    with delta.Publisher(bucket) as publisher:
        publisher.publish(published)  # version 1: what both engines hold, recognised by its hash
        publisher.flush()
        followers = [Follower(e, bucket, SubscriberConfig(poll_interval=0.05)) for e in engines]
        assert vllm.version == hf.version == 1
        for version in (2, 3):
            published = step(published, names[version::3], seed=100 + version)
            publisher.publish(published)
            publisher.flush()
            before = assert_same(vllm, hf)
            assert [f.sync() for f in followers] == [version, version]
            assert largest_change(before, assert_same(vllm, hf)) > 40 * ATOL
    assert all(r.pause_s > 0 for f in followers for r in f.records())
    for f in followers:
        f.close()


def test_an_engine_without_lora_support_refuses_an_adapter_run_in_one_line(engines, tmp_path) -> None:
    from delta import SubscriberConfig
    from rollout_space.errors import LoraRefusedError
    from rollout_space.follower import Follower
    from tests._lora import settings

    vllm, _ = engines
    follower = Follower(vllm, str(tmp_path / "bucket"), SubscriberConfig(poll_interval=0.05))
    version, state = vllm.version, dict(vllm.state)
    with pytest.raises(LoraRefusedError, match=r"^the run publishes a LoRA adapter and this vLLM engine was started "
                                               r"without LoRA support: restart it with --max-lora-rank 8, or run the "
                                               r"trainer with --lora-sync merged$"):
        # The base is what the engine holds now (earlier tests moved it from the folder's)
        follower.adopt(settings(vllm.config.model, base_hash=delta.state_digest(vllm.state).hexdigest))
    assert vllm.version == version and vllm.state.keys() == state.keys() and follower.lora is None
    assert follower.status()["refused"] == {"no LoRA support": 1}
    assert vllm.adapter_support.startswith("no LoRA adapters (started without --max-lora-rank")
    follower.close()

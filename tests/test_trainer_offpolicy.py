"""Truncated importance sampling against the sampler's logprobs: the weights themselves, and TRL's
GRPOTrainer running with them on a tiny model (one real optimizer step each), fed games whose sampler
logprobs are known offsets from the policy's own."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from tests._trainer_stack import tiny_model
from trainer_space.offpolicy import OffPolicyGRPOTrainer, ratio_stats, stale_tokens, truncated_ratio
from trainer_space.rollouts import trajectory_columns
from trainer_space.task import seed_dataset
from wire.trainer import IMPORTANCE_METRIC
from wire.trajectory import Trajectory, VersionSpan


def test_weights_are_exp_of_the_logprob_gap_capped_and_one_off_the_mask() -> None:
    current = torch.tensor([[-1.0, -2.0, -3.0, -0.1], [-1.0, -1.0, -1.0, -1.0]])
    sampling = torch.tensor([[-1.5, -2.0, -0.5, float("nan")], [-4.0, -1.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 0, 1], [1, 1, 1, 0]])
    ratio = truncated_ratio(current, sampling, mask, cap=3.0)
    expected = torch.tensor([[math.exp(0.5), 1.0, 1.0, 1.0], [3.0, 1.0, math.exp(-1.0), 1.0]])
    torch.testing.assert_close(ratio, expected)
    mean, low, high = ratio_stats(ratio, mask)
    assert (low, high) == pytest.approx((math.exp(-1.0), 3.0))
    assert mean == pytest.approx((math.exp(0.5) + 1 + 1 + 3 + 1 + math.exp(-1.0)) / 6)
    assert ratio_stats(ratio, torch.zeros_like(mask)) is None


def _policy_logprobs(model, prompt: list[int], completion: list[int]) -> list[float]:
    """The model's own untempered logprobs of `completion` after `prompt`, computed plainly."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1:-1].float()
    return logits.log_softmax(-1).gather(-1, torch.tensor(completion).unsqueeze(-1)).squeeze(-1).tolist()


def one_step(folder: str, out: Path, offset: float, optim: str = "adamw_torch", spans: list | None = None,
             bound: tuple[int, int] | None = None) -> tuple[OffPolicyGRPOTrainer, float]:
    """One GRPO step on games whose sampler logprobs are the policy's own minus `offset` on the model's tokens;
    returns the trainer and how far the step moved the weights (L1). `spans`: the games' version spans (else each
    token is version 0's); `bound`: the trainer's (current version, max staleness)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    before = [p.detach().clone() for p in model.parameters()]
    prompt, mask = [5, 17, 99, 250], [1, 1, 1, 0, 0, 1, 1, 1]
    replies = ([3, 42, 7, 300, 301, 7, 42, 3], [8, 9, 10, 300, 301, 11, 12, 13])  # the won game differs

    def rollout_func(prompts: list, trainer=None) -> dict:
        games = []
        for i in range(len(prompts)):
            completion = replies[i % 2]
            own = _policy_logprobs(model, prompt, completion)
            logprobs = [lp - offset if m else 0.0 for lp, m in zip(own, mask)]
            games.append(Trajectory(prompt_ids=prompt, episode_id=str(i), completion_ids=completion, logprobs=logprobs,
                                    env_mask=mask, reward=float(i % 2), versions=[0], spans=spans or []))
        return trajectory_columns(games, [False] * len(games))

    args = GRPOConfig(output_dir=str(out), max_steps=1, learning_rate=1e-2, optim=optim, max_grad_norm=0.0,
                      per_device_train_batch_size=4,
                      num_generations=2, max_completion_length=16, beta=0.0, use_cpu=True, logging_steps=1,
                      save_strategy="no", report_to="none", disable_tqdm=True, dataloader_num_workers=0, seed=0)
    trainer = OffPolicyGRPOTrainer(model=model, reward_funcs=[lambda completions, env_reward, **_: env_reward],
                                   args=args, train_dataset=seed_dataset(4), processing_class=tokenizer,
                                   rollout_func=rollout_func, importance_cap=3.0,
                                   current_version=(lambda: bound[0]) if bound else None,
                                   max_staleness=bound[1] if bound else None)
    trainer.train()
    moved = sum((p.detach() - b).abs().sum().item() for p, b in zip(model.parameters(), before))
    return trainer, moved


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> str:
    return tiny_model(str(tmp_path_factory.mktemp("tiny") / "model"))


@pytest.mark.parametrize("offset, expected", [(0.0, 1.0), (-0.25, math.exp(-0.25)), (3.0, 3.0)])
def test_a_grpo_step_logs_each_model_token_s_truncated_ratio(folder: str, tmp_path: Path, offset: float,
                                                             expected: float) -> None:
    trainer, _ = one_step(folder, tmp_path, offset)
    mean, low, high = trainer.last_ratio
    assert (mean, low, high) == pytest.approx((expected, expected, expected), rel=1e-3)
    logged = next(entry for entry in trainer.state.log_history if f"{IMPORTANCE_METRIC}/mean" in entry)
    assert logged[f"{IMPORTANCE_METRIC}/max"] == pytest.approx(expected, rel=1e-3)


def test_the_ratio_scales_the_update_as_it_scales_each_token_s_loss(folder: str, tmp_path: Path) -> None:
    """With plain SGD (no clipping) a step's update is linear in the loss: tokens weighted by e^0.25 move the weights
    e^0.25 times as far as the same games sampled on-policy."""
    _, on_policy = one_step(folder, tmp_path / "a", 0.0, optim="sgd")
    _, weighted = one_step(folder, tmp_path / "b", 0.25, optim="sgd")
    assert on_policy > 0
    assert weighted / on_policy == pytest.approx(math.exp(0.25), rel=5e-3)  # float32 rounding of the steps


def test_the_cap_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="importance_cap must be >= 1"):
        OffPolicyGRPOTrainer(model=None, importance_cap=0.5)
    with pytest.raises(ValueError, match="give current_version and max_staleness"):
        OffPolicyGRPOTrainer(model=None, current_version=lambda: 3)


@dataclass
class WeightVersionSpan:
    """vLLM 0.34's span, as `vllm/outputs.py` defines it (read from its wheel)."""

    version: str
    start: int
    end: int


#: The second reply of the games below as a vLLM 0.34 server answers `/v1/completions` with `return_weight_versions`
#: (`CompletionResponseChoice` of `vllm/entrypoints/openai/completion/protocol.py`): a follower applied version 6 (its
#: label, `/finish_weight_update`'s `weight_version`) after the reply's first token.
RECORDED_CHOICE = json.loads('{"index": 0, "text": "...", "finish_reason": "length", "token_ids": [7, 42, 3], '
                             '"weight_versions": [{"version": "5", "start": 0, "end": 1}, '
                             '{"version": "6", "start": 1, "end": 3}]}')


def straddling_spans() -> list:
    """The games' spans: reply 1 (completion tokens 0-2) all of version 5, reply 2 (tokens 5-7) as recorded."""
    from rollout_space.engines.vllm_engine import reported_spans

    second = reported_spans([WeightVersionSpan(**s) for s in RECORDED_CHOICE["weight_versions"]], 3)
    assert [(s.version, s.start, s.end) for s in second] == [(5, 0, 1), (6, 1, 3)]
    return [VersionSpan(version=5, start=0, end=3), *(s.model_copy(update={"start": s.start + 5, "end": s.end + 5})
                                                      for s in second)]


def test_a_straddling_completion_is_corrected_token_by_token() -> None:
    """Token versions 5 5 5 (env) (env) 5 6 6, trainer at 7, bound 1: the version-5 tokens are past the bound and get
    weight 0, each version-6 token its own truncated ratio; the env's tokens are not weighted."""
    game = Trajectory(prompt_ids=[1], episode_id="g", completion_ids=[3, 42, 7, 300, 301, 7, 42, 3],
                      logprobs=[-1.0] * 8, env_mask=[1, 1, 1, 0, 0, 1, 1, 1], versions=[5, 5], spans=straddling_spans())
    versions = game.token_versions()
    assert versions == [5, 5, 5, -1, -1, 5, 6, 6] and game.version == 5
    stale = stale_tokens([versions], 8, current_version=7, max_staleness=1)
    assert stale.tolist() == [[1, 1, 1, 0, 0, 1, 0, 0]]
    current = torch.tensor([[-1.0, -1.0, -1.0, -3.0, -3.0, -1.0, -0.8, -2.0]])
    sampling = torch.tensor([game.logprobs])
    mask = torch.tensor([game.env_mask])
    ratio = truncated_ratio(current, sampling, mask, cap=1.1, stale=stale)
    torch.testing.assert_close(ratio, torch.tensor([[0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.1, math.exp(-1.0)]]))
    assert stale_tokens([[5, 6]], 4, 7, 1).tolist() == [[1, 0, 0, 0]]  # rows padded with "no version"


def test_a_grpo_step_trains_a_straddling_reply_on_its_fresh_tokens_alone(folder: str, tmp_path: Path) -> None:
    """The same games through TRL's GRPOTrainer (the rollout function's token_versions column): per game the four
    version-5 model tokens are past the bound (weight 0), the two version-6 ones carry e^0.25."""
    trainer, moved = one_step(folder, tmp_path, -0.25, spans=straddling_spans(), bound=(7, 1))
    assert trainer.last_stale == 4 * 4  # four games
    assert trainer.last_ratio == pytest.approx((math.exp(-0.25),) * 3, rel=1e-3)
    assert moved > 0
    _, nothing_fresh = one_step(folder, tmp_path / "b", -0.25, spans=straddling_spans(), bound=(8, 1))
    assert nothing_fresh == 0  # every model token past the bound: no gradient

"""Games played by older weights, corrected: truncated importance sampling against the sampler's logprobs.

A rollout server plays with the weights it holds, which may be a few versions behind the trainer's
(never more than the staleness bound: older games are dropped). TRL's `GRPOTrainer` corrects for the
gap between the sampler and the trained policy only when it runs vLLM itself (`use_vllm=True`); with a
`rollout_func` its ratio is fixed at 1. `OffPolicyGRPOTrainer` adds TRL's own token-level truncated
correction ("token_truncate"): per model token,

    w = min(exp(log pi_current(token) - log pi_sampler(token)), cap)

computed once per step before the update, and multiplies each token's advantage by it. For every loss
TRL offers that is exactly TRL's ``per_token_loss * importance_sampling_ratio`` (w > 0 passes through
the clipped surrogate's min unchanged), so GRPO itself, its clipping and its normalisation stay TRL's.

The sampler's logprobs are those of the model's raw distribution (`Completion.logprobs`: softmax of
the logits, before temperature), so the current policy's are computed the same way. At temperature
1.0 (the default) that is the sampling distribution itself; at another temperature the ratio compares
the untempered distributions, an approximation.

The step's ratios are logged as TRL logs its own (``sampling/importance_sampling_ratio/{mean,min,max}``).
"""

from __future__ import annotations

from typing import Any

import torch
from trl import GRPOTrainer

from wire.trainer import IMPORTANCE_METRIC


def truncated_ratio(current: torch.Tensor, sampling: torch.Tensor, mask: torch.Tensor, cap: float) -> torch.Tensor:
    """Per-token importance weights ``min(exp(current - sampling), cap)``, 1 where `mask` is 0.

    Args:
        current: Log-probabilities of the sampled tokens under the policy being trained, (B, T).
        sampling: The same under the weights that sampled them, (B, T). NaN (unknown) counts as no correction.
        mask: 1 on the tokens the model produced, 0 on padding and env tokens, (B, T).
        cap: Upper bound of a weight (TRL's `vllm_importance_sampling_clip_max`, 3.0 by default).
    """
    diff = torch.nan_to_num((current - sampling) * mask, nan=0.0)
    return torch.exp(diff).clamp(max=cap)


def ratio_stats(ratio: torch.Tensor, mask: torch.Tensor) -> tuple[float, float, float] | None:
    """Mean, min and max of `ratio` over the masked tokens (None when there are none)."""
    kept = ratio[mask.bool()]
    if kept.numel() == 0:
        return None
    return kept.mean().item(), kept.min().item(), kept.max().item()


def raw_logprobs(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, keep: int, batch_size: int
) -> torch.Tensor:
    """Log-probabilities of the last `keep` tokens of each row under `model`'s untempered distribution."""
    rows = []
    with torch.no_grad():
        for i in range(0, input_ids.size(0), batch_size):
            ids, att = input_ids[i : i + batch_size], attention_mask[i : i + batch_size]
            logits = model(input_ids=ids, attention_mask=att, use_cache=False).logits[:, -keep - 1 : -1].float()
            rows.append(logits.log_softmax(-1).gather(-1, ids[:, -keep:].unsqueeze(-1)).squeeze(-1))
    return torch.cat(rows)


class OffPolicyGRPOTrainer(GRPOTrainer):
    """TRL's `GRPOTrainer` with the correction above for games from a `rollout_func` (see the module docstring).

    Args:
        importance_cap: The cap on a token's weight.
        *args, **kwargs: As `GRPOTrainer`.

    Attributes:
        last_ratio: Mean, min and max weight of the last step's model tokens (None before any).
    """

    def __init__(self, *args: Any, importance_cap: float = 3.0, **kwargs: Any) -> None:
        if not importance_cap >= 1.0:
            raise ValueError(
                f"importance_cap must be >= 1 (1 turns the correction into a clip at 1), got {importance_cap}"
            )
        super().__init__(*args, **kwargs)
        self.importance_cap = importance_cap
        self.last_ratio: tuple[float, float, float] | None = None

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        output = super()._generate_and_score_completions(inputs)
        sampling = output.get("sampling_per_token_logps")
        if sampling is None:  # no sampler logprobs: nothing to correct against
            return output
        mask = output["completion_mask"]
        if "tool_mask" in output:
            mask = mask * output["tool_mask"]
        ids = torch.cat([output["prompt_ids"], output["completion_ids"]], dim=1)
        attention = torch.cat([output["prompt_mask"], output["completion_mask"]], dim=1)
        current = raw_logprobs(
            self.model, ids, attention, output["completion_ids"].size(1), self.args.per_device_train_batch_size
        )
        ratio = truncated_ratio(current, sampling, mask, self.importance_cap)
        advantages = output["advantages"]
        output["advantages"] = (advantages.unsqueeze(1) if advantages.dim() == 1 else advantages) * ratio
        self.last_ratio = ratio_stats(ratio, mask)
        if self.last_ratio is not None:
            mode = "train" if self.model is not None and self.model.training else "eval"
            for name, value in zip(("mean", "min", "max"), self.last_ratio, strict=True):
                self._metrics[mode][f"{IMPORTANCE_METRIC}/{name}"].append(value)
        return output

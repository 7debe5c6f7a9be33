"""Games played by older weights, corrected: truncated importance sampling against the sampler's logprobs.

TRL's `GRPOTrainer` corrects for the gap between sampler and trained policy only when it runs vLLM itself; with a
`rollout_func` its ratio is 1. `OffPolicyGRPOTrainer` adds TRL's own token-level truncated correction
("token_truncate"): per model token, computed once per step before the update,

    w = min(exp(log pi_current(token) - log pi_sampler(token)), cap)

multiplying the token's advantage: TRL's ``per_token_loss * importance_sampling_ratio``, so GRPO's loss, clipping and
normalisation stay TRL's. Logprobs on both sides are of the raw distribution (before temperature: exact at 1.0).

Each token is corrected with the weights that sampled it (`Trajectory.token_versions`: vLLM reports its weight-version
spans; elsewhere a reply carries the version served when it was asked for); a token more than the staleness bound
behind gets weight 0. The ratios are logged as TRL logs its own (``sampling/importance_sampling_ratio/...``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from wire.trainer import IMPORTANCE_METRIC

from ._trl import GRPOTrainer
from .staleness import VERSIONS_COLUMN


def truncated_ratio(
    current: torch.Tensor,
    sampling: torch.Tensor,
    mask: torch.Tensor,
    cap: float,
    stale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-token importance weights ``min(exp(current - sampling), cap)``, 1 where `mask` is 0, 0 where `stale`.

    Args:
        current: Log-probabilities of the sampled tokens under the policy being trained, (B, T).
        sampling: The same under the weights that sampled them, (B, T). NaN (unknown) counts as no correction.
        mask: 1 on the tokens the model produced, 0 on padding and env tokens, (B, T).
        cap: Upper bound of a weight (TRL's `vllm_importance_sampling_clip_max`, 3.0 by default).
        stale: 1 on the tokens sampled by weights past the staleness bound (`stale_tokens`), (B, T); None: none.
    """
    diff = torch.nan_to_num((current - sampling) * mask, nan=0.0)
    ratio = torch.exp(diff).clamp(max=cap)
    return ratio if stale is None else ratio * (1 - stale * mask)


def stale_tokens(
    token_versions: Sequence[Sequence[int]], width: int, current_version: int, max_staleness: int
) -> torch.Tensor:
    """(B, width): 1 where a token's weight version is more than `max_staleness` behind `current_version`, 0
    elsewhere (a version of -1, the env's tokens and padding included). Rows are cut or padded to `width`."""
    rows = [list(row[:width]) + [-1] * max(0, width - len(row)) for row in token_versions]
    versions = torch.tensor(rows, dtype=torch.int64).reshape(len(rows), width)
    return ((versions >= 0) & (current_version - versions > max_staleness)).float()


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
        current_version: The trainer's weight version now; with `max_staleness`, a token sampled by weights more than
            that many versions behind it (by the rollout function's `VERSIONS_COLUMN`) gets weight 0. None: no bound.
        max_staleness: The staleness bound, in versions.
        *args, **kwargs: As `GRPOTrainer`.

    Attributes:
        last_ratio: Mean, min and max weight of the last step's model tokens trained on (None before any).
        last_stale: Model tokens of the last step past the staleness bound (weight 0).
    """

    def __init__(
        self,
        *args: Any,
        importance_cap: float = 3.0,
        current_version: Callable[[], int] | None = None,
        max_staleness: int | None = None,
        **kwargs: Any,
    ) -> None:
        if not importance_cap >= 1.0:
            raise ValueError(
                f"importance_cap must be >= 1 (1 turns the correction into a clip at 1), got {importance_cap}"
            )
        if (current_version is None) != (max_staleness is None) or (max_staleness or 0) < 0:
            raise ValueError(
                f"give current_version and max_staleness (>= 0) together, or neither; got max_staleness {max_staleness}"
            )
        super().__init__(*args, **kwargs)
        self.importance_cap = importance_cap
        self.current_version = current_version
        self.max_staleness = max_staleness
        self.last_ratio: tuple[float, float, float] | None = None
        self.last_stale = 0

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
        width = output["completion_ids"].size(1)
        current = raw_logprobs(self.model, ids, attention, width, self.args.per_device_train_batch_size)
        stale = self._stale(inputs, width)
        ratio = truncated_ratio(current, sampling, mask, self.importance_cap, stale)
        advantages = output["advantages"]
        output["advantages"] = (advantages.unsqueeze(1) if advantages.dim() == 1 else advantages) * ratio
        trained = mask if stale is None else mask * (1 - stale)
        self.last_stale = int((mask * stale).sum().item()) if stale is not None else 0
        self.last_ratio = ratio_stats(ratio, trained)
        if self.last_ratio is not None:
            mode = "train" if self.model is not None and self.model.training else "eval"
            for name, value in zip(("mean", "min", "max"), self.last_ratio, strict=True):
                self._metrics[mode][f"{IMPORTANCE_METRIC}/{name}"].append(value)
        return output

    def _stale(self, inputs: list[dict[str, Any]], width: int) -> torch.Tensor | None:
        """`stale_tokens` of the rows' `VERSIONS_COLUMN` (TRL puts the rollout function's extra columns into
        `inputs`), on the device of the step; None without a bound or without the column."""
        if self.current_version is None or self.max_staleness is None:
            return None
        versions = [row.get(VERSIONS_COLUMN) for row in inputs]
        if any(v is None for v in versions):
            return None
        stale = stale_tokens(versions, width, self.current_version(), self.max_staleness)  # type: ignore[arg-type]  # checked above: none is None
        return stale.to(self.accelerator.device)

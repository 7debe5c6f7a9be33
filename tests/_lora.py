"""What the LoRA tests share: a PEFT model on a tiny model folder with a trained-looking adapter, and its settings."""

from __future__ import annotations

import torch

import delta
from wire.lora import DEFAULT_TARGETS, LoraSettings


def settings(model: str, sync: str = "adapter", r: int = 4, **changes: object) -> LoraSettings:
    """The run's settings of a LoRA run on `model` (its true base hash unless `changes` say otherwise)."""
    fields = dict(sync=sync, r=r, alpha=2.0 * r, targets=DEFAULT_TARGETS, base_model=model,
                  base_hash=delta.state_digest(delta.load_state(model)).hexdigest)
    return LoraSettings(**{**fields, **changes})


def peft_model(model: str, lora: LoraSettings, seed: int = 0) -> torch.nn.Module:
    """`model` loaded in float32 and wrapped with PEFT as a trainer would, its lora_B set to random values (PEFT
    starts them at zero, which would leave the base's outputs unchanged)."""
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32, local_files_only=True)
    wrapped = get_peft_model(base, lora.peft_config()).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in wrapped.named_parameters():
            if ".lora_B." in name:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.05)
    return wrapped


@torch.no_grad()
def logprobs(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """Log-probability of each token of `ids` after the ones before it, under `model`."""
    logits = model(input_ids=torch.tensor([ids])).logits.float()[0, :-1]
    return logits.log_softmax(-1).gather(-1, torch.tensor(ids[1:]).unsqueeze(-1)).squeeze(-1)

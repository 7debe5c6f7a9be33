"""A LoRA run's settings, as the trainer writes them into the run's settings (``fleet/run.json``, `RunSettings.lora`).

Two ways an adapter reaches the rollout servers through the bucket, chosen by the trainer (`--lora-sync`):

- ``adapter``: the published state is the adapter's tensors alone, under PEFT's names (those of
  `peft.get_peft_model_state_dict`, e.g. ``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``),
  in float32; a server wraps its base model with PEFT (`peft_config`) and updates the adapter in place.
- ``merged``: the published state is the base with the adapter merged in, in the checkpoint's dtype: a server
  follows it as any full state.

Either way `base_hash` is the state hash (`delta.state_digest`) of the base model's published tensors as the
trainer loaded them: a server whose model folder hashes otherwise refuses the run. Pydantic only: light to import
(`peft_config` imports peft when called).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

#: How the adapter reaches the servers (see the module docstring).
LORA_SYNCS = ("adapter", "merged")
LoraSync = Literal["adapter", "merged"]
#: The projections of every attention and MLP block of Qwen3, SmolLM2 and other Llama-shaped models.
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
#: Highest rank a run may name (a bound on what a server is asked to allocate).
MAX_RANK = 1024


def check_target_names(targets: tuple[str, ...]) -> tuple[str, ...]:
    """`targets` if each is a module name PEFT can match and none repeats (the trainer checks its flags with this
    before loading anything; a run's settings read from the bucket are checked with it too).

    Raises:
        ValueError: a name that is empty, too long or holds other characters than letters, digits, '_' or '.', or a
            name given twice.
    """
    for t in targets:
        if not t or len(t) > 128 or not all(c.isalnum() or c in "_." for c in t):
            raise ValueError(f"target module name {t!r} must be 1 to 128 letters, digits, '_' or '.'")
    if len(set(targets)) != len(targets):
        raise ValueError(f"target modules repeat a name: {targets}")
    return targets


class LoraSettings(BaseModel):
    """The LoRA adapter a run trains, and how the servers receive it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    sync: LoraSync = Field(description="adapter: the adapter's tensors are the published state; merged: the base "
                                       "with the adapter merged in is")
    r: int = Field(ge=1, le=MAX_RANK, description="The adapter's rank")
    alpha: float = Field(gt=0, le=1e6, allow_inf_nan=False, description="LoRA's alpha: updates are scaled by alpha / r")
    targets: tuple[str, ...] = Field(min_length=1, max_length=64,
                                     description="Names of the modules adapted (PEFT's target_modules)")
    base_model: str = Field(max_length=512, description="The trainer's model (a folder or Hub id; informational)")
    base_hash: str = Field(pattern=r"^[a-z0-9]{1,16}:[0-9a-f]{16,128}$",
                           description="State hash of the base model's published tensors (`delta.state_digest`)")

    @field_validator("targets")
    @classmethod
    def _names(cls, targets: tuple[str, ...]) -> tuple[str, ...]:
        return check_target_names(targets)

    def peft_config(self) -> Any:
        """The `peft.LoraConfig` both sides build the adapter with (no dropout, no bias: the adapter's tensors are
        `lora_A` and `lora_B` of each target, whatever trains them)."""
        from delta.integrations.peft_adapter import lora_config

        return lora_config(self.r, self.alpha, list(self.targets))

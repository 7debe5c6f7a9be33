"""A LoRA run's settings, as the trainer writes them into the run's settings (``fleet/run.json``, `RunSettings.lora`).

Two ways an adapter reaches the rollout servers through the bucket, chosen by the trainer (`--lora-sync`):

- ``adapter``: the published state is the adapter's tensors alone, under PEFT's names (those of
  `peft.get_peft_model_state_dict`, e.g. ``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``),
  in float32; a server wraps its base model with PEFT (`peft_config`) and updates the adapter in place.
- ``merged``: the published state is the base with the adapter merged in, in the checkpoint's dtype: a server
  follows it as any full state.

Either way `base_hash` is the state hash (`delta.state_digest`) of the base model's published tensors as the
trainer loaded them: a server whose model folder hashes otherwise refuses the run. Pydantic only: light to import
(`peft_config` imports peft, `check_targets` torch, when called).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

#: How the adapter reaches the servers (see the module docstring).
LORA_SYNCS = ("adapter", "merged")
LoraSync = Literal["adapter", "merged"]
#: The projections of every attention and MLP block of Qwen3, SmolLM2 and other Llama-shaped models.
DEFAULT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
#: Highest rank a run may name (a bound on what a server is asked to allocate).
MAX_RANK = 1024
#: Highest rank of an adapter-mode run, whose servers load the adapter itself: the largest max LoRA rank vLLM 0.32
#: serves (`settings.VLLM_LORA_RANKS`), and the transformers engine's cap (PEFT in the server's process: an adapter of
#: rank r costs r x (in + out) parameters per adapted layer, half a Qwen3-0.6B's weights at this rank).
MAX_ADAPTER_RANK = 512
#: Most adapter versions a server keeps loaded for an adapter-mode run (its `max_staleness` + 1, so that a group of
#: games finishes under the version it began with): each is a PEFT folder on the server's disk and one of vLLM's
#: adapters (170 MB for Qwen3-8B at rank 16 on every projection, float32). A staleness above 15 is refused.
MAX_KEPT_VERSIONS = 16


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


def kept_versions_refusal(keep: int) -> str | None:
    """Why a server does not keep `keep` versions of a run's adapter loaded (the run's `max_staleness` + 1), in one
    line saying what to change; None within `MAX_KEPT_VERSIONS`."""
    if keep <= MAX_KEPT_VERSIONS:
        return None
    return (
        f"the run asks every server to keep {keep} adapter versions loaded (its max_staleness + 1), above the cap "
        f"of {MAX_KEPT_VERSIONS}: run the trainer with --max-staleness {MAX_KEPT_VERSIONS - 1} or less, or "
        "--lora-sync merged"
    )


def check_targets(modules: Mapping[str, Any], targets: tuple[str, ...], flag: str = "--lora-targets") -> None:
    """Refuse targets PEFT would adapt otherwise than asked, before any model is wrapped: each must name linear layers
    of the model whose modules are `modules` (name -> module, `named_modules()` of the model PEFT has not wrapped), by
    PEFT's match (a module whose name is the target or ends in "." and the target). PEFT itself refuses only when no
    target matches, with a printout of the whole module, and would adapt an embedding under other tensor names
    (``lora_embedding_A``) than an adapter's published ones. The trainer checks its flags with this; a server the run's
    settings, before it drops anything it serves.

    Raises:
        ValueError: one line (`flag` and the target first) naming the model's linear layers: a target that matches no
            module, or a module that is not a linear layer.
    """
    from torch.nn import Linear

    layers = ", ".join(sorted({name.rpartition(".")[2] for name, m in modules.items() if isinstance(m, Linear)}))
    for target in targets:
        matched = [name for name in modules if name == target or name.endswith(f".{target}")]
        if not matched:
            raise ValueError(f"{flag} {target} matches no module of the model; its linear layers are: {layers}")
        other = next((name for name in matched if not isinstance(modules[name], Linear)), None)
        if other is not None:
            raise ValueError(
                f"{flag} {target} names {other}, a {type(modules[other]).__name__}: an adapter is built "
                f"on linear layers only ({layers})"
            )


class LoraSettings(BaseModel):
    """The LoRA adapter a run trains, and how the servers receive it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    sync: LoraSync = Field(
        description="adapter: the adapter's tensors are the published state; merged: the base "
        "with the adapter merged in is"
    )
    r: int = Field(ge=1, le=MAX_RANK, description="The adapter's rank")
    alpha: float = Field(gt=0, le=1e6, allow_inf_nan=False, description="LoRA's alpha: updates are scaled by alpha / r")
    targets: tuple[str, ...] = Field(
        min_length=1, max_length=64, description="Names of the modules adapted (PEFT's target_modules)"
    )
    base_model: str = Field(max_length=512, description="The trainer's model (a folder or Hub id; informational)")
    base_hash: str = Field(
        pattern=r"^[a-z0-9]{1,16}:[0-9a-f]{16,128}$",
        description="State hash of the base model's published tensors (`delta.state_digest`)",
    )

    @field_validator("targets")
    @classmethod
    def _names(cls, targets: tuple[str, ...]) -> tuple[str, ...]:
        return check_target_names(targets)

    def peft_config(self) -> Any:
        """The `peft.LoraConfig` both sides build the adapter with (no dropout, no bias: the adapter's tensors are
        `lora_A` and `lora_B` of each target, whatever trains them)."""
        from delta.integrations.peft_adapter import lora_config

        return lora_config(self.r, self.alpha, list(self.targets))

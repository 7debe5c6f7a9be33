"""A published LoRA adapter state as the folder PEFT and vLLM load (``adapter_config.json`` +
``adapter_model.safetensors``): how an adapter version reaches vLLM's LoRA machinery, in-process
(`LoRARequest`) or on a stock server (``/v1/load_lora_adapter``), which both read adapters from folders.

peft is imported only when a config is built (`pip install peft`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any

import torch
from safetensors.torch import save_file

__all__ = ["adapter_config", "lora_config", "write_adapter"]

#: PEFT's saved name of one adapted module's matrix: ``base_model.model.<module path>.lora_A.weight``.
_LORA_NAME = re.compile(r"^base_model\.model\.(?:.+\.)?(?P<module>[A-Za-z0-9_]+)\.lora_(?P<ab>[AB])\.weight$")


def adapter_config(state: Mapping[str, torch.Tensor], alpha: float) -> Any:
    """The `peft.LoraConfig` of an adapter state saved by PEFT: rank and target modules read from its tensors
    (`lora_A` is rank x in), `alpha` given (the tensors do not hold it).

    Raises:
        ValueError: a tensor is not a PEFT LoRA matrix, or the `lora_A` ranks differ (one rank per adapter).
    """
    targets, ranks = set(), set()
    for name, tensor in state.items():
        match = _LORA_NAME.match(name)
        if match is None or tensor.dim() != 2:
            raise ValueError(f"{name!r} is not a PEFT LoRA matrix (base_model.model.<module>.lora_A|B.weight, 2-d); "
                             "follow an adapter-mode run's bucket, or leave the adapter options out for full weights")
        targets.add(match["module"])
        if match["ab"] == "A":
            ranks.add(tensor.shape[0])
    if len(ranks) != 1:
        raise ValueError(f"the adapter's lora_A matrices have ranks {sorted(ranks)}; one rank per adapter is served")
    return lora_config(ranks.pop(), alpha, sorted(targets))


def lora_config(r: int, alpha: float, targets: list[str]) -> Any:
    """The `peft.LoraConfig` of an adapter whose tensors are `lora_A` and `lora_B` of each target (no dropout, no
    bias), the one trainer and servers build alike."""
    from peft import LoraConfig

    return LoraConfig(r=r, lora_alpha=alpha, target_modules=targets, lora_dropout=0.0, bias="none",
                      task_type="CAUSAL_LM")


def write_adapter(folder: str, state: Mapping[str, torch.Tensor], config: Any) -> str:
    """Write `state` (PEFT's saved names) with its `peft.LoraConfig` as a PEFT adapter folder; returns `folder`.

    The folder is created if needed and its two files replaced; `state` is not modified.
    """
    os.makedirs(folder, exist_ok=True)
    config.save_pretrained(folder)
    save_file({name: t.detach().contiguous() for name, t in sorted(state.items())},
              os.path.join(folder, "adapter_model.safetensors"))
    return folder

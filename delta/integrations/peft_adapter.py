"""A published LoRA adapter state as the folder PEFT and vLLM load (``adapter_config.json`` +
``adapter_model.safetensors``): how an adapter version reaches vLLM's LoRA machinery, in-process
(`LoRARequest`) or on a stock server (``/v1/load_lora_adapter``), which both read adapters from folders.

peft is imported only when a config is built (`pip install peft`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection, Mapping
from typing import Any

import torch
from safetensors.torch import save_file

__all__ = ["ADAPTER_DTYPES", "adapter_config", "check_adapter", "lora_config", "write_adapter"]

#: PEFT's saved name of one adapted module's matrix: ``base_model.model.<module path>.lora_A.weight``.
_LORA_NAME = re.compile(r"^base_model\.model\.(?P<path>(?:.+\.)?[A-Za-z0-9_]+)\.lora_(?P<ab>[AB])\.weight$")
#: The dtypes an adapter's matrices may hold: those PEFT trains them in (a trainer publishes float32).
ADAPTER_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
#: Offending tensors an error names before it counts the rest (it stays one line).
_SHOWN = 3


def check_adapter(
    state: Mapping[str, torch.Tensor], r: int | None = None, targets: Collection[str] | None = None
) -> tuple[int, list[str]]:
    """The rank and adapted module names of an adapter state saved by PEFT, once the whole state is checked: what every
    reader of adapter versions runs before it serves one (the engines, the sidecars), since a bucket's versions may be
    a stranger's, their hashes consistent.

    Each tensor must be a 2-d LoRA matrix (``lora_A`` r x in, ``lora_B`` out x r) in one of `ADAPTER_DTYPES`, holding
    finite values only; each module must have both; one rank throughout, `r` when given; and with `targets` (PEFT's
    ``target_modules``: a module is adapted when its path is a target or ends in "." and one) every module must match
    a target and every target a module.

    Returns:
        The rank, and the sorted last names of the adapted modules (PEFT's ``target_modules`` for the state).

    Raises:
        ValueError: one line naming the first offending tensors (and how many more), or the adapter's rank and modules
            beside the ones asked for.
    """
    problems: list[str] = []
    shapes: dict[str, dict[str, tuple[int, ...]]] = {}
    for name, tensor in sorted(state.items()):
        match = _LORA_NAME.match(name)
        if match is None or tensor.dim() != 2:
            problems.append(f"{name!r} is not a PEFT LoRA matrix (base_model.model.<module>.lora_A|B.weight, 2-d)")
            continue
        shapes.setdefault(match["path"], {})[match["ab"]] = tuple(tensor.shape)
        if tensor.dtype not in ADAPTER_DTYPES:
            problems.append(f"{name!r} is {tensor.dtype}, not a LoRA matrix's float32, bfloat16 or float16")
        elif not bool(torch.isfinite(tensor).all()):
            problems.append(f"adapter tensor {name!r} holds NaN or infinite values (a forged or broken adapter)")
    ranks = set()
    for path, pair in sorted(shapes.items()):
        if len(pair) < 2:
            has = next(iter(pair))
            problems.append(f"module {path!r} has lora_{has} without lora_{'B' if has == 'A' else 'A'}")
        elif pair["A"][0] != pair["B"][1]:
            problems.append(f"module {path!r} has lora_A of rank {pair['A'][0]} and lora_B of rank {pair['B'][1]}")
        else:
            ranks.add(pair["A"][0])
    if problems:
        more = f"; and {len(problems) - _SHOWN} more" if len(problems) > _SHOWN else ""
        hint = (
            "; follow an adapter-mode run's bucket, or leave the adapter options out for full weights"
            if any(_LORA_NAME.match(name) is None for name in state)
            else ""
        )
        raise ValueError("; ".join(problems[:_SHOWN]) + more + hint)
    if len(ranks) != 1:
        raise ValueError(
            "the adapter holds no LoRA matrix"
            if not ranks
            else f"the adapter's modules have ranks {sorted(ranks)}; one rank per adapter is served"
        )
    rank, modules = ranks.pop(), sorted({path.rpartition(".")[2] for path in shapes})
    matched = targets is None or (
        all(any(_adapts(path, t) for t in targets) for path in shapes)
        and all(any(_adapts(path, t) for path in shapes) for t in targets)
    )
    if not matched or (r is not None and r != rank):
        raise ValueError(
            f"the tensors are an adapter of rank {rank} on {', '.join(modules)}; the run's is of rank "
            f"{rank if r is None else r} on {', '.join(sorted(targets or modules))}"
        )
    return rank, modules


def _adapts(path: str, target: str) -> bool:
    """Whether PEFT adapts the module at `path` for the target name `target` (a list of targets: no regex)."""
    return path == target or path.endswith(f".{target}")


def adapter_config(
    state: Mapping[str, torch.Tensor], alpha: float, r: int | None = None, targets: Collection[str] | None = None
) -> Any:
    """The `peft.LoraConfig` of an adapter state saved by PEFT: rank and target modules read from its tensors, checked
    whole first (`check_adapter`, against `r` and `targets` when given), `alpha` given (the tensors do not hold it).

    Raises:
        ValueError: as `check_adapter`.
    """
    rank, modules = check_adapter(state, r, targets)
    return lora_config(rank, alpha, modules)


def lora_config(r: int, alpha: float, targets: list[str]) -> Any:
    """The `peft.LoraConfig` of an adapter whose tensors are `lora_A` and `lora_B` of each target (no dropout, no
    bias), the one trainer and servers build alike."""
    from peft import LoraConfig

    return LoraConfig(
        r=r,
        lora_alpha=alpha,  # type: ignore[arg-type]  # PEFT's field says int; a float scales alike
        target_modules=targets,
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
    )


def write_adapter(folder: str, state: Mapping[str, torch.Tensor], config: Any) -> str:
    """Write `state` (PEFT's saved names) with its `peft.LoraConfig` as a PEFT adapter folder; returns `folder`.

    The folder is created if needed and its two files replaced; `state` is not modified.
    """
    os.makedirs(folder, exist_ok=True)
    config.save_pretrained(folder)
    save_file(
        {name: t.detach().contiguous() for name, t in sorted(state.items())},
        os.path.join(folder, "adapter_model.safetensors"),
    )
    return folder

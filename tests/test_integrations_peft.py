"""`delta.integrations.peft_adapter.check_adapter`: what every reader of adapter versions checks before it serves one
(the in-process engines, `delta follow --lora-alpha`, the sidecar), as a table of states and the one line each gets."""

from __future__ import annotations

import pytest
import torch

from delta.integrations.peft_adapter import adapter_config, check_adapter

Q = "base_model.model.model.layers.0.self_attn.q_proj.lora_{}.weight"
V = "base_model.model.model.layers.0.self_attn.v_proj.lora_{}.weight"


def _pair(name: str, r: int = 4, dtype: torch.dtype = torch.float32) -> dict[str, torch.Tensor]:
    return {name.format("A"): torch.ones(r, 8, dtype=dtype), name.format("B"): torch.ones(8, r, dtype=dtype)}


def _with(state: dict[str, torch.Tensor], name: str, value: float) -> dict[str, torch.Tensor]:
    changed = {n: t.clone() for n, t in state.items()}
    changed[name][1, 2] = value
    return changed


def test_a_good_adapter_gives_its_rank_and_modules() -> None:
    state = {**_pair(Q), **_pair(V)}
    assert check_adapter(state) == (4, ["q_proj", "v_proj"])
    assert check_adapter(state, 4, ("q_proj", "self_attn.v_proj")) == (4, ["q_proj", "v_proj"])  # PEFT's matching
    assert check_adapter(_pair(Q, dtype=torch.bfloat16), 4, ("q_proj",)) == (4, ["q_proj"])
    config = adapter_config(state, 8.0, 4, ("q_proj", "v_proj"))
    assert (config.r, config.lora_alpha, sorted(config.target_modules)) == (4, 8.0, ["q_proj", "v_proj"])


@pytest.mark.parametrize("state, r, targets, line", [
    (_with(_pair(Q), Q.format("B"), float("nan")), None, None,
     f"adapter tensor '{Q.format('B')}' holds NaN or infinite values (a forged or broken adapter)"),
    (_with(_pair(Q), Q.format("A"), float("-inf")), 4, ("q_proj",),
     f"adapter tensor '{Q.format('A')}' holds NaN or infinite values (a forged or broken adapter)"),
    (_pair(Q, dtype=torch.float64), None, None,
     f"'{Q.format('A')}' is torch.float64, not a LoRA matrix's float32, bfloat16 or float16; '{Q.format('B')}' is "
     "torch.float64, not a LoRA matrix's float32, bfloat16 or float16"),
    ({Q.format("A"): torch.ones(4, 8)}, None, None,
     "module 'model.layers.0.self_attn.q_proj' has lora_A without lora_B"),
    ({Q.format("A"): torch.ones(4, 8), Q.format("B"): torch.ones(8, 2)}, None, None,
     "module 'model.layers.0.self_attn.q_proj' has lora_A of rank 4 and lora_B of rank 2"),
    ({**_pair(Q), **_pair(V, r=2)}, None, None,
     "the adapter's modules have ranks [2, 4]; one rank per adapter is served"),
    (_pair(Q), 8, None, "the tensors are an adapter of rank 4 on q_proj; the run's is of rank 8 on q_proj"),
    (_pair(Q), 4, ("q_proj", "v_proj"),
     "the tensors are an adapter of rank 4 on q_proj; the run's is of rank 4 on q_proj, v_proj"),
    ({**_pair(Q), **_pair(V)}, 4, ("q_proj",),
     "the tensors are an adapter of rank 4 on q_proj, v_proj; the run's is of rank 4 on q_proj"),
    ({"model.norm.weight": torch.ones(8)}, None, None,
     "'model.norm.weight' is not a PEFT LoRA matrix (base_model.model.<module>.lora_A|B.weight, 2-d); follow an "
     "adapter-mode run's bucket, or leave the adapter options out for full weights"),
    ({}, None, None, "the adapter holds no LoRA matrix"),
], ids=["nan", "inf", "float64", "half a pair", "ranks of a pair", "two ranks", "another rank", "a target missing",
        "a module not a target", "full weights", "empty"])
def test_an_adapter_that_is_not_the_run_s_is_refused_in_one_line(state: dict, r: int | None, targets: tuple | None,
                                                                  line: str) -> None:
    with pytest.raises(ValueError) as refused:
        check_adapter(state, r, targets)
    assert str(refused.value) == line


def test_a_refusal_names_three_tensors_and_counts_the_rest() -> None:
    state = {n: torch.full_like(t, float("nan")) for n, t in {**_pair(Q), **_pair(V)}.items()}
    with pytest.raises(ValueError, match=r"^adapter tensor .*; adapter tensor .*; adapter tensor [^;]*; and 1 more$"):
        check_adapter(state)

"""dashboard.sparsity: density per (layer, kind) from the headers of real delta files."""

from __future__ import annotations

import pytest

from dashboard import NON_LAYER_ROW, kind_of, sparsity

from ._dashboard_states import LAYERS, changed_copy, header_of, qwen3_state


@pytest.mark.parametrize(("name", "expected"), [
    ("model.layers.3.self_attn.q_proj.weight", ("layer 3", "q_proj")),
    ("model.layers.12.mlp.down_proj.weight", ("layer 12", "down_proj")),
    ("model.layers.0.input_layernorm.weight", ("layer 0", "input_layernorm")),
    ("model.layers.1.self_attn.k_norm.weight", ("layer 1", "k_norm")),
    ("model.layers.1.self_attn.q_proj.bias", ("layer 1", "q_proj.bias")),
    ("model.layers.2.mlp.experts.7.up_proj.weight", ("layer 2", "up_proj")),
    ("model.embed_tokens.weight", (NON_LAYER_ROW, "embed_tokens")),
    ("model.norm.weight", (NON_LAYER_ROW, "norm")),
    ("lm_head.weight", (NON_LAYER_ROW, "lm_head")),
    ("scale", (NON_LAYER_ROW, "scale")),
    ("base_model.model.model.layers.4.self_attn.q_proj.lora_A.weight", ("layer 4", "q_proj.lora_A")),
    ("base_model.model.model.layers.4.mlp.down_proj.lora_B.weight", ("layer 4", "down_proj.lora_B")),
])
def test_kind_of(name: str, expected: tuple[str, str]) -> None:
    assert kind_of(name) == expected


@pytest.mark.parametrize("codec", ["ctx", "raw"])
def test_grid_from_a_real_delta(codec: str) -> None:
    old = qwen3_state()
    new = changed_copy(old, {"model.layers.0.self_attn.q_proj.weight": 16, "model.layers.1.mlp.up_proj.weight": 128,
                             "lm_head.weight": 1})
    header = header_of(old, new, codec)
    grid = sparsity(header)

    assert grid.version == 2 and grid.base_version == 1
    assert grid.changed == 16 + 128 + 1 and grid.total == sum(t.numel() for t in old.values())
    assert grid.rows == ("layer 0", "layer 1", NON_LAYER_ROW)
    assert grid.kinds == ("q_proj", "up_proj", "lm_head")
    q = grid.cell("layer 0", "q_proj")
    assert (q.changed, q.numel, q.tensors, q.density) == (16, 64, 1, 0.25)
    assert grid.cell("layer 1", "up_proj").density == 1.0
    assert grid.cell(NON_LAYER_ROW, "lm_head").density == 1 / (32 * 8)
    assert grid.cell("layer 1", "q_proj") is None  # unchanged tensors are not in the header


def test_all_names_give_zero_cells_and_full_totals() -> None:
    old = qwen3_state()
    new = changed_copy(old, {"model.layers.1.self_attn.k_proj.weight": 8})
    header = header_of(old, new)
    shapes = {n: tuple(t.shape) for n, t in old.items()}

    grid = sparsity(header, shapes)
    assert grid.rows == tuple(f"layer {i}" for i in range(LAYERS)) + (NON_LAYER_ROW,)
    assert grid.kinds == ("q_proj", "k_proj", "v_proj", "o_proj", "q_norm", "k_norm", "input_layernorm",
                          "post_attention_layernorm", "gate_proj", "up_proj", "down_proj",
                          "embed_tokens", "norm", "lm_head")
    assert len(grid.cells) == 11 * LAYERS + 3
    assert sum(c.numel for c in grid.cells.values()) == grid.total
    k = grid.cell("layer 1", "k_proj")
    assert (k.changed, k.numel, k.density) == (8, 32, 0.25)
    zero = grid.cell("layer 0", "k_proj")
    assert (zero.changed, zero.numel, zero.density) == (0, 32, 0.0)

    by_name = sparsity(header, list(old))
    assert set(by_name.cells) == set(grid.cells)
    assert by_name.cell("layer 0", "gate_proj").numel == 0 and by_name.cell("layer 0", "gate_proj").density == 0.0


def test_header_and_names_are_not_modified() -> None:
    old = qwen3_state()
    header = header_of(old, changed_copy(old, {"model.norm.weight": 2}))
    names = list(old)
    before = (header, list(names))
    sparsity(header, names)
    assert (header, names) == before


def test_an_adapter_s_delta_has_a_column_per_projection_and_matrix_in_the_layer_s_order() -> None:
    import torch

    prefix = "base_model.model.model.layers.0"
    names = [f"{prefix}.{m}.{p}.lora_{ab}.weight" for m, p in (("mlp", "down_proj"), ("self_attn", "q_proj"))
             for ab in "BA"]
    old = {n: torch.zeros(4, 4, dtype=torch.float32) for n in names}
    new = {n: t + 1 for n, t in old.items()}
    grid = sparsity(header_of(old, new, "raw"))
    assert grid.rows == ("layer 0",)
    assert grid.kinds == ("q_proj.lora_A", "q_proj.lora_B", "down_proj.lora_A", "down_proj.lora_B")

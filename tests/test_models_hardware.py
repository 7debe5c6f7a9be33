"""What the trainer and the rollout run with on each kind of machine, decided from a written description
of it (T4, L4, A100, H100, a CPU, two GPUs), so every GPU case is checked on a CPU."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from models.hardware import (CPU_KV_CACHE_BYTES, DEFAULT_GPU_MEMORY_UTILIZATION, Gpu, Machine, holds, plan_rollout,
                             plan_trainer, published_dtypes)

GiB = 1 << 30
T4 = Gpu("Tesla T4", (7, 5), False, 15 * GiB, 15 * GiB)
L4 = Gpu("NVIDIA L4", (8, 9), True, 22 * GiB, 22 * GiB)
A100 = Gpu("NVIDIA A100-SXM4-80GB", (8, 0), True, 80 * GiB, 79 * GiB)
H100 = Gpu("NVIDIA H100 80GB HBM3", (9, 0), True, 80 * GiB, 79 * GiB)
CPU = Machine()


def one(gpu: Gpu) -> Machine:
    return Machine((gpu,))


@pytest.mark.parametrize("gpu", [L4, A100, H100], ids=lambda g: g.name)
def test_trainer_on_a_gpu_with_native_bf16_trains_in_bf16(gpu: Gpu) -> None:
    plan = plan_trainer(one(gpu), "auto")
    assert (plan.device, plan.bf16, plan.notes) == ("cuda", True, ())
    assert plan_trainer(one(gpu), "cuda:0").device == "cuda"


def test_trainer_on_a_t4_trains_in_fp32_and_says_why() -> None:
    plan = plan_trainer(one(T4), "auto")
    assert (plan.device, plan.bf16) == ("cuda", False)
    assert plan.notes == ("Tesla T4 (compute 7.5) has no native bf16: training in fp32 (torch would emulate bf16, "
                          "slowly); an L4-class GPU (compute 8.0+) trains in bf16",)


def test_trainer_on_a_cpu_never_uses_bf16() -> None:
    assert plan_trainer(CPU, "auto") == plan_trainer(one(L4), "cpu")
    assert plan_trainer(CPU, None).bf16 is False and plan_trainer(CPU, None).device == "cpu"


def test_trainer_refuses_a_second_gpu_with_what_to_set() -> None:
    with pytest.raises(ValueError) as e:
        plan_trainer(Machine((L4, L4)), "cuda:1")
    assert str(e.value) == ("--device cuda:1: transformers' Trainer puts the model on cuda:0 whatever the device, and "
                            "the published weights would stop following it; make that GPU the only one the trainer "
                            "sees instead: CUDA_VISIBLE_DEVICES=1 with --device cuda")


@pytest.mark.parametrize("device", ["auto", "cuda", "cuda:0"])
def test_trainer_refuses_two_visible_gpus_outside_accelerate(device: str) -> None:
    with pytest.raises(ValueError, match=r"^torch sees 2 GPUs and the trainer uses one: set CUDA_VISIBLE_DEVICES"):
        plan_trainer(Machine((L4, L4)), device)
    assert plan_trainer(Machine((L4, L4), distributed=True), device).device == "cuda"  # one process per GPU


def test_a_gpu_that_is_not_there_is_refused() -> None:
    with pytest.raises(ValueError, match="torch sees no GPU; use --device cpu"):
        plan_trainer(CPU, "cuda")
    with pytest.raises(ValueError, match="'cuda:2' does not exist: torch sees 1 GPU"):
        plan_rollout(one(L4), engine="transformers", device="cuda:2")


def test_vllm_on_a_cpu_gets_a_small_kv_cache_eager_mode_and_float32() -> None:
    plan = plan_rollout(CPU, engine="vllm")
    assert plan.vllm_kwargs() == {"dtype": "float32", "enforce_eager": True,
                                  "kv_cache_memory_bytes": CPU_KV_CACHE_BYTES}
    assert plan.exact and plan.device == "cpu"


@pytest.mark.parametrize("gpu", [L4, A100, H100], ids=lambda g: g.name)
def test_vllm_on_a_bf16_gpu_serves_bf16_with_a_memory_share_and_cuda_graphs(gpu: Gpu) -> None:
    plan = plan_rollout(one(gpu), engine="vllm")
    assert plan.vllm_kwargs() == {"dtype": "bfloat16", "enforce_eager": False,
                                  "gpu_memory_utilization": DEFAULT_GPU_MEMORY_UTILIZATION}
    assert plan.exact and plan.notes == ()
    flags = plan_rollout(one(gpu), engine="vllm", memory_fraction=0.4, cuda_graphs=False)
    assert (flags.gpu_memory_utilization, flags.enforce_eager, flags.kv_cache_bytes) == (0.4, True, None)


def test_vllm_on_a_t4_refuses_to_serve_fp16_for_bf16_weights_unless_told() -> None:
    with pytest.raises(ValueError) as e:
        plan_rollout(one(T4), engine="vllm")
    assert str(e.value) == (
        "Tesla T4 (compute 7.5) has no native bf16 and the checkpoint is bf16: vLLM would serve fp16, and the weights "
        "served would differ from the published ones. Use an L4-class GPU (compute 8.0+), or set DTYPE (--dtype) to "
        "float32 (exact, twice the memory) or float16 (inexact: the rollout then reports no state hash)")
    with pytest.raises(ValueError, match="^--dtype bfloat16: Tesla T4 .* has no native bf16 and vLLM refuses it"):
        plan_rollout(one(T4), engine="vllm", dtype="bfloat16")
    fp16 = plan_rollout(one(T4), engine="vllm", dtype="float16")
    assert fp16.dtype == "float16" and not fp16.exact
    assert fp16.notes == ("serving in float16 weights published in bfloat16: the served weights are rounded, not the "
                          "published ones; the rollout reports no state hash",)
    fp32 = plan_rollout(one(T4), engine="vllm", dtype="float32")
    assert fp32.dtype == "float32" and fp32.exact


def test_transformers_on_a_t4_serves_bf16_weights_in_float32_exactly() -> None:
    plan = plan_rollout(one(T4), engine="transformers")
    assert (plan.device, plan.dtype, plan.exact) == ("cuda", "float32", True)
    assert plan.notes == ("Tesla T4 (compute 7.5) has no native bf16: serving in float32 (exact, twice the memory)",)
    assert plan.kv_cache_bytes is None and plan.gpu_memory_utilization is None


def test_vllm_refuses_a_memory_share_the_gpu_does_not_have_free() -> None:
    shared = Gpu("NVIDIA L4", (8, 9), True, 22 * GiB, 9 * GiB)  # a trainer holds 13 GiB
    with pytest.raises(ValueError) as e:
        plan_rollout(one(shared), engine="vllm")
    assert str(e.value) == ("vLLM would take 0.85 of the NVIDIA L4 (compute 8.9)'s 22.0 GiB, but only 9.0 GiB (0.41) "
                            "are free (another process, such as a trainer on the same GPU, holds the rest): set "
                            "GPU_MEMORY_UTILIZATION (--gpu-memory-utilization) to 0.35 or less")
    assert plan_rollout(one(shared), engine="vllm", memory_fraction=0.35).gpu_memory_utilization == 0.35
    with pytest.raises(ValueError, match=r"must be in \(0, 1\], got 1.5"):
        plan_rollout(one(L4), engine="vllm", memory_fraction=1.5)


def test_vllm_refuses_a_device_it_would_not_use() -> None:
    with pytest.raises(ValueError, match="^--device cuda:1: vLLM runs on the first visible GPU .* "
                                         "CUDA_VISIBLE_DEVICES=1 with --device cuda$"):
        plan_rollout(Machine((L4, L4)), engine="vllm", device="cuda:1")
    with pytest.raises(ValueError, match="use --engine transformers"):
        plan_rollout(one(L4), engine="vllm", device="cpu")
    assert plan_rollout(Machine((L4, L4)), engine="vllm").device == "cuda"
    assert plan_rollout(Machine((T4, L4)), engine="transformers", device="cuda:1").dtype == "bfloat16"


def test_an_explicit_dtype_is_kept_and_its_exactness_told() -> None:
    assert plan_rollout(CPU, engine="transformers", dtype="bfloat16").exact
    assert not plan_rollout(CPU, engine="transformers", dtype="bfloat16", published=("float32",)).exact
    assert plan_rollout(one(L4), engine="vllm", published=("bfloat16", "float32")).dtype == "float32"
    with pytest.raises(ValueError, match="dtype 'fp8' is not one of auto, bfloat16, float16, float32"):
        plan_rollout(CPU, engine="vllm", dtype="fp8")


def test_which_dtypes_hold_which() -> None:
    assert holds("float32", "bfloat16") and holds("float32", "float16") and holds("bfloat16", "bfloat16")
    assert not holds("float16", "bfloat16") and not holds("bfloat16", "float16")
    assert not holds("bfloat16", "float32")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_probing_a_cpu_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert Machine.probe() == Machine()
    monkeypatch.setenv("WORLD_SIZE", "2")  # started by accelerate launch / torchrun
    assert Machine.probe().distributed


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_probing_a_gpu_machine_asks_torch_about_native_bf16() -> None:
    machine = Machine.probe()
    assert len(machine.gpus) == torch.cuda.device_count()
    assert machine.gpus[0].bf16_native == torch.cuda.is_bf16_supported(including_emulation=False)
    assert 0 < machine.gpus[0].free_bytes <= machine.gpus[0].total_bytes


def test_the_published_dtypes_are_read_from_the_checkpoint(tmp_path) -> None:
    from tests._engines import build_model

    folder = build_model(str(tmp_path / "model"))
    assert published_dtypes(folder) == ("bfloat16",)
    save_file({"a": torch.zeros(2), "b": torch.zeros(2, dtype=torch.float16), "i": torch.zeros(2, dtype=torch.int64)},
              str(tmp_path / "model" / "extra.safetensors"))
    assert published_dtypes(folder) == ("bfloat16", "float16", "float32")

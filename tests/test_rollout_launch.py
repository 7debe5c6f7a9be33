"""`python app.py rollout`'s engine settings fit the machine (written descriptions: the GPU cases run on a
CPU), and a rollout whose compute dtype rounds the published weights claims no state hash."""

from __future__ import annotations

import argparse

import pytest

import delta
from models.hardware import CPU_KV_CACHE_BYTES, Gpu, Machine
from rollout_space.engines import EngineConfig, open_engine
from rollout_space.follower import Follower
from rollout_space.launch import add_arguments, engine_plan
from rollout_space.service import RolloutService
from tests._engines import build_model

GiB = 1 << 30
T4 = Gpu("Tesla T4", (7, 5), False, 15 * GiB, 15 * GiB)
L4 = Gpu("NVIDIA L4", (8, 9), True, 22 * GiB, 22 * GiB)


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return build_model(str(tmp_path_factory.mktemp("model") / "m"), seed=3)  # bf16 weights


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_vllm_gets_gpu_settings_on_a_gpu_and_cpu_settings_on_a_cpu(model: str) -> None:
    gpu = engine_plan(_args(), "vllm", model, Machine((L4,)))
    assert gpu.vllm_kwargs() == {"dtype": "bfloat16", "enforce_eager": False, "gpu_memory_utilization": 0.85}
    flags = engine_plan(_args("--gpu-memory-utilization", "0.4", "--cuda-graphs", "off"), "vllm", model, Machine((L4,)))
    assert flags.vllm_kwargs() == {"dtype": "bfloat16", "enforce_eager": True, "gpu_memory_utilization": 0.4}
    cpu = engine_plan(_args(), "vllm", model, Machine())
    assert cpu.vllm_kwargs() == {"dtype": "float32", "enforce_eager": True, "kv_cache_memory_bytes": CPU_KV_CACHE_BYTES}


def test_the_flags_default_to_the_variables_a_space_sets(model: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DTYPE", "float32")
    monkeypatch.setenv("GPU_MEMORY_UTILIZATION", "0.5")
    monkeypatch.setenv("CUDA_GRAPHS", "off")
    plan = engine_plan(_args(), "vllm", model, Machine((T4,)))  # float32: exact on a T4
    assert (plan.dtype, plan.exact, plan.gpu_memory_utilization, plan.enforce_eager) == ("float32", True, 0.5, True)


def test_a_t4_is_refused_for_bf16_weights_under_vllm_with_what_to_set(model: str) -> None:
    with pytest.raises(ValueError, match=r"^Tesla T4 \(compute 7.5\) has no native bf16 .* set DTYPE \(--dtype\) to "
                                         r"float32 \(exact, twice the memory\) or float16"):
        engine_plan(_args(), "vllm", model, Machine((T4,)))
    assert not engine_plan(_args("--dtype", "float16"), "vllm", model, Machine((T4,))).exact


@pytest.mark.parametrize("dtype, claims", [("float16", False), ("float32", True)])
def test_a_rollout_serving_rounded_weights_reports_no_state_hash(model: str, tmp_path, dtype: str,
                                                                claims: bool) -> None:
    bucket = str(tmp_path / "bucket")
    state = delta.load_state(model)
    with delta.Publisher(bucket) as publisher:
        publisher.publish(state)
    with open_engine("transformers", EngineConfig(model, dtype=dtype)) as engine:
        follower = Follower(engine, bucket)
        try:
            assert engine.version == 1 and engine.exact is claims
            status = RolloutService(engine, follower, None).status()
            assert status.version == 1
            assert status.state_hash == (delta.state_digest(state).hexdigest if claims else None)
        finally:
            follower.close()


def test_the_role_stops_before_starting_vllm_with_one_line_saying_what_to_set(model: str, monkeypatch) -> None:
    from rollout_space.main import run

    monkeypatch.setattr(Machine, "probe", classmethod(lambda cls: Machine((T4,))))
    with pytest.raises(SystemExit, match=r"^python app.py rollout: Tesla T4 \(compute 7.5\) has no native bf16"):
        run(_args("--model", model, "--engine", "vllm"))

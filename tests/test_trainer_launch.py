"""`python app.py trainer`'s flags become a config whose device and precision fit the machine, or a refusal
that says what to set; machines are written descriptions, so the GPU cases run on a CPU."""

from __future__ import annotations

import argparse

import pytest

from models.hardware import Gpu, Machine
from trainer_space.config import TrainerConfig
from trainer_space.launch import add_arguments, config_from_args

GiB = 1 << 30
T4 = Gpu("Tesla T4", (7, 5), False, 15 * GiB, 15 * GiB)
L4 = Gpu("NVIDIA L4", (8, 9), True, 22 * GiB, 22 * GiB)


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(["--bucket", "b", "--rollout-url", "http://r", *argv])


def test_bf16_only_where_the_gpu_has_it_natively() -> None:
    assert (c := config_from_args(_args("--device", "auto"), "m", Machine((L4,)))).device == "cuda" and c.bf16
    t4 = config_from_args(_args("--device", "auto"), "m", Machine((T4,)))
    assert (t4.device, t4.bf16) == ("cuda", False)  # torch would emulate bf16 on a T4: fp32 instead
    cpu = config_from_args(_args("--device", "auto"), "m", Machine())
    assert (cpu.device, cpu.bf16) == ("cpu", False)


def test_two_visible_gpus_or_a_second_gpu_are_refused_before_loading_with_what_to_set() -> None:
    with pytest.raises(ValueError, match="torch sees 2 GPUs and the trainer uses one: set CUDA_VISIBLE_DEVICES"):
        config_from_args(_args("--device", "cuda"), "m", Machine((L4, L4)))
    with pytest.raises(ValueError, match="CUDA_VISIBLE_DEVICES=1 with --device cuda$"):
        config_from_args(_args("--device", "cuda:1"), "m", Machine((L4, L4)))


def test_the_config_refuses_a_gpu_index_and_bf16_on_a_cpu() -> None:
    with pytest.raises(ValueError, match="set CUDA_VISIBLE_DEVICES to it and use cuda\\), got 'cuda:1'"):
        TrainerConfig("b", "r", "m", device="cuda:1")
    with pytest.raises(ValueError, match="bf16 autocast is for a GPU with native bf16"):
        TrainerConfig("b", "r", "m", device="cpu", bf16=True)
    assert TrainerConfig("b", "r", "m", device="cuda", bf16=True).bf16


def test_the_role_stops_before_loading_with_one_line_saying_what_to_set(monkeypatch, tmp_path) -> None:
    from tests._engines import build_model
    from trainer_space.main import run

    monkeypatch.setattr(Machine, "probe", classmethod(lambda cls: Machine((L4, L4))))
    model = build_model(str(tmp_path / "model"))
    with pytest.raises(SystemExit, match=r"^python app.py trainer: torch sees 2 GPUs and the trainer uses one: set "
                                         r"CUDA_VISIBLE_DEVICES"):
        run(_args("--model", model, "--device", "auto"))

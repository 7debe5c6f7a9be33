"""Which torch device a role runs its model on: one rule for the trainer and the rollout's engine.

`auto` takes the GPU when there is one and the CPU otherwise, so the same command works on a laptop, a
CPU Space and a GPU Space; naming a device that is not there is an error that says what to do, not a
slow surprise on the CPU.
"""

from __future__ import annotations

from settings import DEVICE_CHOICES  # the values `--device` / `DEVICE` accept besides `cuda:N`


def resolve_device(name: str | None = None) -> str:
    """The torch device for `name`: `auto` (or None) gives `cuda` when a GPU is visible, else `cpu`.

    Raises:
        ValueError: an unknown name, or `cuda` where torch sees no GPU (the message says how to fall back).
    """
    import torch

    name = (name or "auto").strip().lower()
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cpu":
        return name
    if name == "cuda" or (name.startswith("cuda:") and name[5:].isdigit()):
        if not torch.cuda.is_available():
            raise ValueError(f"device {name!r} asked for, but torch {torch.__version__} sees no GPU; use "
                             "--device cpu (or auto), or install a CUDA build of torch on a machine with one")
        index = int(name[5:]) if ":" in name else 0
        if index >= torch.cuda.device_count():
            raise ValueError(f"device {name!r} does not exist: torch sees {torch.cuda.device_count()} GPU(s)")
        return name
    raise ValueError(f"unknown device {name!r}; choose auto, cpu, cuda or cuda:N")

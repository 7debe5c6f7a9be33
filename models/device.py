"""Which torch device a role runs its model on: one rule for the trainer and the rollout's engine.

`auto` takes the GPU when there is one and the CPU otherwise, so the same command works on a laptop, a
CPU Space and a GPU Space; naming a device that is not there is an error that says what to do, not a
slow surprise on the CPU. The rule itself, and what each role runs with on that device, is
`models.hardware`'s.
"""

from __future__ import annotations

from settings import DEVICE_CHOICES  # the values `--device` / `DEVICE` accept besides `cuda:N`

from .hardware import device_name


def resolve_device(name: str | None = None) -> str:
    """The torch device for `name` on this machine: `auto` (or None) gives `cuda` when a GPU is visible,
    else `cpu`.

    Raises:
        ValueError: an unknown name, or `cuda` where torch sees no GPU (the message says how to fall back).
    """
    import torch

    return device_name(name, torch.cuda.device_count() if torch.cuda.is_available() else 0)


__all__ = ["DEVICE_CHOICES", "resolve_device"]
